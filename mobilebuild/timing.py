"""Timing one model in a process of its own: `python -m mobilebuild.timing` reads a JSON spec on stdin and prints
the measurement as one JSON line on stdout; progress goes to stderr.

A fresh process per measurement keeps earlier work (other models, allocator state, thread pools) out of the
numbers and gives a true peak RSS, like speed_benchmark_torch on a device.
"""

import json
import resource
import statistics
import sys
import time

import torch

from mobilebuild import host_lock, runtimes
from mobilebuild.stages import modeling


def measure(spec):
    timing = spec["timing"]
    torch.set_num_threads(timing["threads"])
    example = modeling.example_input(spec["input"])  # one input, reused: the recipe's Android advice
    samples = []
    # a live counter on a terminal; four lines in a log
    step = max(1, timing["iters"] // (20 if sys.stderr.isatty() else 4))
    end = "\r" if sys.stderr.isatty() else "\n"
    with host_lock.measuring_alone(spec["label"]), torch.no_grad():
        started = time.perf_counter()
        model = runtimes.load(spec["runtime"], spec["path"], spec)
        load_ms = (time.perf_counter() - started) * 1e3
        for _ in range(timing["warmup"]):
            model(example)
        for index in range(timing["iters"]):
            started = time.perf_counter_ns()
            model(example)
            samples.append((time.perf_counter_ns() - started) / 1e6)
            if (index + 1) % step == 0:
                print(f"   {spec['label']}: {index + 1}/{timing['iters']} iterations", end=end, file=sys.stderr,
                      flush=True)
    deciles = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
    return {
        "median_ms": statistics.median(samples),
        "p10_ms": deciles[0],
        "p90_ms": deciles[-1],
        "mean_ms": statistics.fmean(samples),
        "stdev_ms": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "load_ms": load_ms,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    print(json.dumps(measure(json.load(sys.stdin))))
