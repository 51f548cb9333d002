"""Stages run in a worker process, one per interpreter, kept for the whole doit run.

Why a process of its own: it starts with PYTHONHASHSEED=0, so what TorchScript orders by string hashing comes out
the same in every build (reproducible.py); a crash in native code (a segfault, a std::terminate) fails one task
instead of the whole build; and a target may name another interpreter (`toolchain:`, e.g. a torch built with
Vulkan), which then runs its stages.

The protocol is one JSON line per request and per reply, on the worker's stdin and on a pipe of its own. What a
stage prints comes back in the reply, and the build prints it as the task's output. This module is imported by the
task layer and must not import torch: the worker's side is mobilebuild.worker.serve.
"""

import atexit
import json
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
# Stages compute with one thread on every host. Reductions split across threads round differently, so with torch's
# default (a thread per core) batch-norm statistics, and every artifact after them, changed with the machine's core
# count: a release built in CI on 4 cores differed from the same build on an 8-core laptop. One thread is also the
# faster choice here, since `doit -n N` runs N stages side by side (benchmarks set their own thread count).
STAGE_THREADS = "1"


class WorkerDied(Exception):
    """The worker process ended while running a stage (killed, or a crash in native code)."""


class Worker:
    def __init__(self, python):
        self.python = python
        reply_read, reply_write = os.pipe()
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": STAGE_THREADS, "MKL_NUM_THREADS": STAGE_THREADS,
               # another interpreter (a toolchain) finds this mobilebuild and the repository's factories
               "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, os.getcwd(), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([python, "-m", "mobilebuild.worker", str(reply_write)], stdin=subprocess.PIPE,
                                        # what native code prints, out of the way of doit's reporters on stdout
                                        stdout=sys.__stderr__.fileno(), env=env, pass_fds=(reply_write,), text=True)
        os.close(reply_write)
        self.replies = os.fdopen(reply_read, "r")

    def call(self, request):
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.replies.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            code = self.process.wait()
            reason = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            raise WorkerDied(f"the stage's process ended ({reason})")
        return json.loads(line)

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.replies.close()


_workers = {}
_owner = None


def call(request, python=None):
    """Run `request` in the worker for `python` (this interpreter by default), starting it on first use, and
    again after it died. Each thread has workers of its own (`doit -P thread`, Dask worker threads)."""
    global _owner
    if _owner != os.getpid():  # a forked doit process (`doit -n N`) gets workers of its own
        _workers.clear()
        _owner = os.getpid()
        # doit's forked processes end through multiprocessing, which skips atexit but runs these
        multiprocessing.util.Finalize(None, close_all, exitpriority=0)
    slot = (python or sys.executable, threading.get_ident())
    worker = _workers.get(slot)
    if worker is None or worker.process.poll() is not None:
        worker = _workers[slot] = Worker(slot[0])
    try:
        return worker.call(request)
    except WorkerDied:
        del _workers[slot]
        raise


@atexit.register
def close_all():
    if _owner == os.getpid():
        for worker in list(_workers.values()):
            worker.close()
        _workers.clear()
