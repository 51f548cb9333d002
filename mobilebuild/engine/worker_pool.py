"""Stages run in a worker process, one per interpreter, kept for the whole doit run.

Why a process of its own: it starts with PYTHONHASHSEED=0, so what TorchScript orders by string hashing comes out
the same in every build (reproducible.py); a crash in native code (a segfault, a std::terminate) fails one task
instead of the whole build; and a target may name another interpreter (`toolchain:`, e.g. a torch built with
Vulkan), which then runs its stages.

The protocol is one JSON line per request and per reply (after a STARTED line as the stage starts), on the worker's
stdin and on a pipe of its own. What a stage prints comes back in the reply, and the build prints it as the task's
output. A stage past its time limit (the recipe's `limits`) is stopped: its worker, and what that started, killed.
This module is imported by the task layer and must not import torch: the worker's side is mobilebuild.worker.serve.
"""

import atexit
import contextlib
import json
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from mobilebuild.worker.progress import STARTED

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
# Stages compute with one thread on every host. Reductions split across threads round differently, so with torch's
# default (a thread per core) batch-norm statistics, and every artifact after them, changed with the machine's core
# count: a release built in CI on 4 cores differed from the same build on an 8-core laptop. One thread is also the
# faster choice here, since `doit -n N` runs N stages side by side (benchmarks set their own thread count).
STAGE_THREADS = "1"



class WorkerDied(Exception):
    """The worker process ended while running a stage (killed, or a crash in native code)."""


class StageStopped(Exception):
    """The stage ran past its time limit: its worker, and every process the worker started, were killed."""

    def __init__(self, seconds):
        super().__init__(seconds)  # its only argument: it comes back whole from a Dask worker (pickled)
        self.seconds = seconds

    def __str__(self):
        return f"stopped after {self.seconds:g} s"


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

    def call(self, request, timeout=None):
        """The worker's reply to `request`. Past `timeout` seconds (None: no limit) the worker, and what it started,
        is killed and StageStopped raised. The time runs from the request, and again from the stage's start (the
        worker's STARTED line): the wait for a measurement on this host to end (worker/measure_alone.py) is not the
        stage's, unless it alone outlasts the limit."""
        self.stopped = False
        timer = self._timer(timeout)
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.replies.readline()
            if line.strip() == STARTED:
                if timer is not None:
                    timer.cancel()
                timer = self._timer(timeout)
                line = self.replies.readline()
        except (BrokenPipeError, OSError):
            line = ""
        finally:
            if timer is not None:
                timer.cancel()
        if not line and self.stopped:
            self.process.wait()
            raise StageStopped(timeout)
        if not line:
            code = self.process.wait()
            reason = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            raise WorkerDied(f"the stage's process ended ({reason})")
        return json.loads(line)

    def _timer(self, timeout):
        if not timeout:
            return None
        timer = threading.Timer(timeout, self.stop)
        timer.daemon = True
        timer.start()
        return timer

    def stop(self):
        """Kill the worker and what it started (a benchmark's forkserver and its measuring process, a converter's
        tool): they would otherwise run on, or hold the host's measurement lock."""
        self.stopped = True
        started = _descendants(self.process.pid)
        for pid in [self.process.pid, *started]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def close(self):
        running = self.process.poll() is None
        with contextlib.suppress(OSError):  # a dead worker's pipe: the flush may find it broken
            self.process.stdin.close()
        if running:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.replies.close()


_workers = {}
_owner = None


def call(request, python=None, timeout=None):
    """Run `request` in the worker for `python` (this interpreter by default), starting it on first use, and
    again after it died or was stopped past `timeout` seconds (StageStopped). Each thread has workers of its own
    (`doit -P thread`, Dask worker threads)."""
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
        return worker.call(request, timeout)
    except (WorkerDied, StageStopped):
        del _workers[slot]
        worker.close()
        raise


def _descendants(pid):
    """The processes below `pid`, from /proc (Linux); none where there is no /proc."""
    children = {}
    try:
        entries = os.scandir("/proc")
    except OSError:
        return []
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])  # the name, in (), may hold spaces
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found += below
        pending += below
    return found


@atexit.register
def close_all():
    if _owner == os.getpid():
        for worker in list(_workers.values()):
            worker.close()
        _workers.clear()
