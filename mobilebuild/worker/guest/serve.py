"""The emulated process's request loop: `python -m mobilebuild.worker.guest.serve REPLY_FD`, under qemu-aarch64.

One process serves every artifact of its CPU model in a build (worker/emulated.py keeps it): the runtimes' imports
cost tens of seconds under emulation, the runs seconds. A request (a JSON line on stdin) names a runner module (a
route family's `worker/guest.py`), an artifact, its inputs (.npy files, one list per run) and what the host read of the
artifact that the runner needs (`options`: worker/runtimes' arm64_options); the reply (a JSON line on REPLY_FD, away
from what native code prints) names the outputs it saved and, where the instruction-count plugin is loaded, the
instructions each run took. Each run is marked before and after (close() of a negative descriptor, which the plugin
watches), after one unmarked run of the first inputs: the first run of a model packs weights and plans memory, which an
app pays once. """

import gc
import importlib.util
import json
import os
import sys
import time
import traceback

import numpy

MARK = -19778  # the descriptor the plugin watches (mobilebuild/arm64/instructions.c)
SMALL, REPEATS = 20_000_000, 5
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def load_runner(name):
    """The runner module `name` (mobilebuild.routes.<family>.worker.guest), loaded from its file: importing it by
    name would run the packages above it, which register the route families with the host's dependencies, which
    this Python lacks."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(PACKAGE_PARENT, *name.split(".")) + ".py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def mark():
    try:
        os.close(MARK)
    except OSError:
        pass


def marks(path, start):
    """The totals the plugin wrote from line `start` on, and how many lines there are now."""
    if not path:
        return [], start
    with open(path) as handle:
        lines = handle.read().split()
    return [int(value) for value in lines[start:]], len(lines)


def _counted(model, arrays, counts, seen):
    """(the run's outputs, how many times it ran): marked, once; a small model's run again, REPEATS times in all,
    where its count is below SMALL: Python's own work around a run (its allocator, its collector) moves such a count
    by a percent or two, and the least of a few runs moves by less."""
    mark()
    produced = model(arrays)
    mark()
    if not counts:
        return produced, 1
    totals, _ = marks(counts, seen)
    if totals[-1] - totals[-2] >= SMALL:
        return produced, 1
    for _ in range(REPEATS - 1):
        mark()
        model(arrays)
        mark()
    return produced, REPEATS


def serve(request, counts, seen):
    cpu = time.process_time()
    runner = load_runner(request["runner"])
    started = time.perf_counter()
    mark()
    model = runner.load(request["artifact"], request.get("threads", 1), **request.get("options", {}))
    mark()
    loaded = time.perf_counter()
    runs = [[numpy.load(path) for path in paths] for paths in request["inputs"]]
    model(runs[0])  # the first run, unmarked: weight packing and memory plans
    first = time.perf_counter()
    saved, repeats = [], []
    gc.collect()  # Python's collector, run inside a marked run, added 10 M instructions to a 15 M one (a .ptl)
    gc.disable()
    try:
        measured = [_counted(model, arrays, counts, seen) for arrays in runs]
    finally:
        gc.enable()
    for index, (produced, again) in enumerate(measured):
        repeats.append(again)
        names = []
        for position, array in enumerate(produced):
            names.append(os.path.join(request["out"], f"output-{index}-{position}.npy"))
            numpy.save(names[-1], numpy.asarray(array))
        saved.append(names)
    done = time.perf_counter()
    totals, seen = marks(counts, seen)
    spans = [after - before for before, after in zip(totals[::2], totals[1::2])]
    per_run, at = [], 1
    for again in repeats:  # a run's count: the least of its repeats (what Python adds around a run only adds)
        per_run.append(min(spans[at:at + again]) if spans else None)
        at += again
    return {"outputs": saved, "load_instructions": spans[0] if spans else None,
            "instructions": per_run if spans else None,
            "seconds": {"load": loaded - started, "first_run": first - loaded, "per_run": (done - first) / len(runs),
                        "total": done - started, "cpu": time.process_time() - cpu}}, seen


def main():
    """Serve requests until stdin closes. The first answered request's seconds also say the CPU seconds the process
    took to start (the interpreter and numpy); a runtime's import is in the seconds of the first request using it."""
    reply = os.fdopen(int(sys.argv[1]), "w")
    started_in = time.process_time()
    counts = os.environ.get("MOBILEBUILD_INSTRUCTIONS_FILE")
    _, seen = marks(counts, 0)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer, seen = serve(request, counts, seen)
        except Exception as exc:  # the reply carries it: the build names it in one line, its log holds the rest
            _, seen = marks(counts, seen)
            answer = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                      "traceback": traceback.format_exc()}
        if started_in is not None and "seconds" in answer:
            answer["seconds"]["startup_cpu"], started_in = started_in, None
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


if __name__ == "__main__":
    main()
