"""Measurements in processes of their own (timing.py, through the bench stage): peak memory is the model's, and
the recipe's thread count holds even where the build computes with one thread."""

import json

import pytest
import torch
from torch import nn

from mobilebuild.engine import worker_pool
from mobilebuild.plan import stages
from mobilebuild.plan.stages import BenchConfig
from mobilebuild.worker.stages import bench


def lite_model(path, features):
    model = torch.jit.script(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, features)).eval())
    model._save_for_lite_interpreter(str(path))
    return str(path)


def config(threads=1):
    return BenchConfig(runtime="pytorch-mobile", runtime_module="mobilebuild.routes.torchscript.worker.runtime",
                       runs_on_host=True, timing={"threads": threads, "warmup": 1, "iters": 5},
                       inputs=[{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32",
                                "memory_format": "contiguous"}])


def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


@pytest.mark.slow  # interpreters of their own: the timing processes' server starts and imports torch
def test_peak_memory_is_the_models_not_the_builds(tmp_path):
    """The timing process used to report the high-water mark of the process that started it (a stage worker that
    had built MobileNetV2: 1.3 GB for every model)."""
    ballast = torch.ones(200 * 2**20)  # 800 MB resident here, in the process that asks for the measurement
    small = bench.time_in_subprocess({"config": config(), "path": lite_model(tmp_path / "small.ptl", 4),
                                      "label": "small"})
    large = bench.time_in_subprocess({"config": config(), "path": lite_model(tmp_path / "large.ptl", 150_000),
                                      "label": "large"})  # 115 MB of weights
    assert small["peak_rss_mb"] < rss_mb() - 600
    assert large["peak_rss_mb"] - small["peak_rss_mb"] > 70
    del ballast


@pytest.mark.slow  # a stage worker starts, and its timing processes' server: each imports torch
def test_the_recipes_threads_hold_in_a_build_that_computes_with_one(tmp_path):
    """Stage workers run with OMP_NUM_THREADS=1 (build/worker_pool.py); the measurement uses the recipe's count."""
    path = lite_model(tmp_path / "model.ptl", 4)
    for threads in (2, 1):
        output = tmp_path / f"bench-{threads}.json"
        reply = worker_pool.call({"stage": "bench", "inputs": {"artifact": path},
                                  "config": stages.as_json(config(threads)), "output": str(output),
                                  "root": str(tmp_path), "task": "bench:model"})
        assert set(reply) - {"waited"} == {"printed", "peak_rss_mb"} and reply["peak_rss_mb"] > 50, reply
        result = json.loads(output.read_text())
        assert result["status"] == "ran" and result["threads"] == threads
    worker_pool.close_all()
