"""A time limit per stage (the recipe's `limits`): a stage past it is stopped, its node fails in one line, the
worker pool starts a new worker, and the rest of the build goes on. The limit keys nothing."""

import textwrap
import time

import pytest
import yaml
from conftest import tiny_recipe

from mobilebuild.engine import worker_pool
from mobilebuild.plan import graph, recipe, stages

SLOW = textwrap.dedent('''
    import time

    from torch import nn


    def make(seconds=120):
        time.sleep(seconds)  # a constructor that takes for ever: the checkpoint stage builds the model
        return nn.Linear(8, 3)
''')


def _plan(tmp_path, **overrides):
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "tinynet.py").touch()
    path = tmp_path / "recipes" / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe(**overrides), sort_keys=False))
    loaded = recipe.load(path, tmp_path)
    return loaded, {node.task_name: node for node in graph.recipe_nodes(loaded, str(tmp_path))}


def test_every_node_gets_its_stages_limit_from_the_recipe_and_the_defaults(tmp_path):
    loaded, nodes = _plan(tmp_path)
    assert loaded.limits == {"stage_seconds": 1800, "layers_seconds": 600}
    assert nodes["layers:tiny-qnnpack"].time_limit == 600
    assert {node.time_limit for name, node in nodes.items() if not name.startswith("layers:")} == {1800}
    _, nodes = _plan(tmp_path, limits={"stage_seconds": 30, "layers_seconds": None})
    assert nodes["quantize:tiny-qnnpack"].time_limit == 30
    assert nodes["layers:tiny-qnnpack"].time_limit is None


def test_a_time_limit_keys_no_node(tmp_path):
    """A limit changes no artifact: changing it leaves every node up to date (and its cache entry found), but the
    manifest, which records the recipe file's sha256 (any edit of the file changes it)."""
    _, before = _plan(tmp_path)
    _, after = _plan(tmp_path, limits={"stage_seconds": 5, "layers_seconds": 7})
    assert before.keys() == after.keys()
    changed = [name for name in before if before[name].key() != after[name].key()]
    assert changed == ["manifest:tiny"]
    assert [name for name in before if before[name].config != after[name].config] == ["manifest:tiny"]


@pytest.mark.parametrize("limits, expected", [
    ({"stage_seconds": 0}, "limits.stage_seconds: 0 is less than or equal to the minimum of 0"),
    ({"stage_seconds": "1h"}, "limits.stage_seconds: expected ['number', 'null'], got str \"1h\""),
    ({"minutes": 3}, "limits: unknown key 'minutes' (allowed: layers_seconds, stage_seconds)"),
])
def test_a_limit_that_is_not_a_positive_number_or_null_is_refused_in_one_line(tmp_path, limits, expected):
    with pytest.raises(recipe.RecipeErrors) as caught:
        _plan(tmp_path, limits=limits)
    assert str(caught.value) == f"recipes/tiny.yaml: {expected}"


def test_the_layers_stage_has_a_limit_of_its_own():
    comparisons = ("layers", "lm_layers")  # the per-layer comparisons, of int8 models and of language models
    assert {stages.get(name).limit for name in comparisons} == {"layers_seconds"}
    assert {stage.limit for stage in stages.all_stages() if stage.name not in comparisons} == {"stage_seconds"}


# --- the worker pool -------------------------------------------------------------------------------------------------

STAGE = textwrap.dedent('''
    import subprocess
    import time


    def run(inputs, config, output):
        if config.recipe == "slow":
            child = subprocess.Popen(["sleep", "300"])  # what the stage started must not outlive it
            with open("child.pid", "w") as handle:
                handle.write(str(child.pid))
            time.sleep(300)
        output.write_text("made")
''')


def _request(tmp_path, name):
    return {"stage": "plot", "module": "sleepy", "config_type": stages.type_path(stages.PlotConfig),
            "measures": False, "inputs": {}, "config": {"recipe": name}, "output": str(tmp_path / f"{name}.txt"),
            "root": str(tmp_path), "task": f"plot:{name}"}


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, waiting for its parent
    except OSError:
        return False


# Slow: it waits out a real 3 s limit between two worker starts that import torch (a shorter limit stopped the
# stage before it had started its child on a loaded machine).
@pytest.mark.slow
def test_a_stage_past_its_limit_is_stopped_with_what_it_started_and_the_pool_starts_a_new_worker(tmp_path):
    (tmp_path / "sleepy.py").write_text(STAGE)
    try:
        # torch imported
        reply = worker_pool.call(_request(tmp_path, "quick"), timeout=120)
        assert set(reply) - {"waited", "peak_rss_mb"} == {"printed"}, reply
        started = time.perf_counter()
        with pytest.raises(worker_pool.StageStopped) as stopped:
            worker_pool.call(_request(tmp_path, "slow"), timeout=3)
        assert 3 <= time.perf_counter() - started < 30
        assert str(stopped.value) == "stopped after 3 s"
        child = int((tmp_path / "child.pid").read_text())
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child)
        assert not (tmp_path / "slow.txt").exists()
        (tmp_path / "quick.txt").unlink()
        reply = worker_pool.call(_request(tmp_path, "quick"), timeout=120)
        assert set(reply) - {"waited", "peak_rss_mb"} == {"printed"}, reply
        assert (tmp_path / "quick.txt").read_text() == "made"
    finally:
        worker_pool.close_all()


def test_a_stage_within_its_limit_keeps_its_worker(tmp_path):
    (tmp_path / "sleepy.py").write_text(STAGE)
    try:
        worker_pool.call(_request(tmp_path, "quick"), timeout=120)
        (worker,) = [w for w in worker_pool._workers.values()]
        worker_pool.call(_request(tmp_path, "quick"), timeout=120)
        assert list(worker_pool._workers.values()) == [worker] and worker.process.poll() is None
    finally:
        worker_pool.close_all()


# --- a real build --------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_stage_past_its_limit_ends_in_one_line_and_the_other_recipes_build(project):
    (project.root / "slow.py").write_text(SLOW)
    project.write_recipe({"name": "slow", "model": {"factory": "slow:make"}, "input": {"shape": [1, 8]},
                          "limits": {"stage_seconds": 5}, "targets": [{"backend": "xnnpack"}]})
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}]))
    result = project.run("checkpoint:slow", "optimize:tiny-xnnpack")
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    assert errors == ["ERROR: checkpoint:slow: recipes/slow.yaml: stopped after 5 s: the stage's time limit "
                      "(limits.stage_seconds); nothing was written"], result.stderr
    assert not project.artifact("slow/checkpoint.pt").exists()
    assert not [path for path in project.root.joinpath("artifacts").rglob("*") if ".partial" in path.name]
    assert project.artifact("tiny/tiny-xnnpack.ptl").stat().st_size > 0
