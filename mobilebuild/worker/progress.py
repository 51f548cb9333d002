"""What a long stage is doing, on stderr, under the name of the task it runs for: a 30-second lowering says where it
is, and under `doit -n 2` each line says whose it is. Outside a build (a test, `mobilebuild check`) nothing is
printed."""

import contextlib
import os
import sys
import threading
import time

# The line a stage worker writes on its replies as a stage starts (engine/worker_pool.py starts the stage's clock)
STARTED = '{"started": true}'
# Set by a command whose own lines say how far it is (`mobilebuild tune`'s table, a row per candidate)
SILENT = "MOBILEBUILD_NO_PROGRESS"

_task = None


@contextlib.contextmanager
def working_on(task):
    global _task
    _task = task
    try:
        yield
    finally:
        _task = None


def current_task():
    return _task


def shown():
    return not os.environ.get(SILENT)


def note(text):
    # the real stderr: stages silence what libraries print on sys.stderr (worker/quiet.py)
    if _task and shown():
        print(f"   {_task}: {text}", file=sys.__stderr__, flush=True)


@contextlib.contextmanager
def while_running(text, seconds=30):
    """`text` and the seconds so far, noted every `seconds` while the block runs: a library call that says nothing
    for minutes (ExecuTorch lowering SmolLM2-135M's 30 layers in 8da4w: 20 min) still shows that it works."""
    done, started = threading.Event(), time.perf_counter()

    def tick():
        while not done.wait(seconds):
            note(f"{text} ({time.perf_counter() - started:.0f} s)")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
