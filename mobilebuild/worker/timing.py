"""Timing one model in a process of its own (bench.time_in_subprocess forks one per measurement from a server
that has imported this module, and torch, once); progress goes to stderr.

A fresh process per measurement keeps earlier work (other models, allocator state, thread pools) out of the
numbers, like speed_benchmark_torch on a device. Its peak RSS is the kernel's high-water mark, reset when the
measurement starts: what the runtime, the model and its runs held resident, without what the process it came
from once held.
"""

import statistics
import sys
import time

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import measure_alone, peak_rss, progress, quiet, runtimes, serve
from mobilebuild.worker.stages import modeling


def measure_into(spec, connection, measure_with=None):
    """The forked process's work: measure in the build's repository (the eager reference is built by the recipe's
    factory, which imports from there), send the result. `measure_with`: another measurement (a language model's)."""
    serve.enter_root(spec["root"])
    try:
        with quiet.native_stderr(once=True, python_too=False):  # C++ warnings come at every call: once each
            result = (measure_with or measure)(spec)
    except MobileBuildError as exc:
        result = {"error": exc.message}
    except (RuntimeError, ValueError) as exc:  # the runtime refuses to run it: one line, not a traceback
        result = {"error": modeling.first_line(exc)}
    connection.send(result)
    connection.close()


def measure(spec):
    config = spec["config"]
    timing = config.timing
    peak_rss.reset()
    torch.set_num_threads(timing["threads"])
    example = modeling.example_inputs(config.inputs)  # one example, reused: the recipe's Android advice
    samples = []
    # a live counter on a terminal; four lines in a log
    step = max(1, timing["iters"] // (20 if sys.stderr.isatty() else 4))
    end = "\r" if sys.stderr.isatty() else "\n"
    with measure_alone.measuring_alone(spec["label"], timing["threads"]) as waited, torch.no_grad():
        started = alone_since = time.perf_counter()
        model = runtimes.load(spec["path"], config)
        load_ms = (time.perf_counter() - started) * 1e3
        for _ in range(timing["warmup"]):
            model(*example)
        for index in range(timing["iters"]):
            started = time.perf_counter_ns()
            model(*example)
            samples.append((time.perf_counter_ns() - started) / 1e6)
            if (index + 1) % step == 0 and progress.shown():
                print(f"   {spec['label']}: {index + 1}/{timing['iters']} iterations", end=end, file=sys.stderr,
                      flush=True)
    alone = time.perf_counter() - alone_since
    deciles = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
    return {
        "median_ms": statistics.median(samples),
        "p10_ms": deciles[0],
        "p90_ms": deciles[-1],
        "mean_ms": statistics.fmean(samples),
        "stdev_ms": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "load_ms": load_ms,
        "peak_rss_mb": peak_rss.mb(),
        "threads": torch.get_num_threads(),
        "waited_for_stages_s": waited,  # how the number was taken: alone, after waiting this long for that
        "alone_s": alone,  # how long it held the host alone: what a build's replay charges a measurement
        "isolation": measure_alone.isolation(),
    }
