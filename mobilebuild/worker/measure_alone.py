"""Benchmarks measure alone: while one times a model, no other mobilebuild stage runs on this host.

`doit -n N`, Dask workers on the same machine and builds in other checkouts all run stages side by side; a timing
taken next to them measures the contention. A read-write lock shared by every build of this user on this host
keeps them apart: stages hold it shared, a measurement holds it exclusively. A measurement waiting for it also holds
a turnstile that stages pass on their way in, so a stream of stages cannot keep it waiting for ever. flock locks go
with their process: a killed build leaves nothing locked.
"""

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

# Seconds this process waited since take_waited() last asked: stages for a measurement to end, measurements for
# running stages to finish; and "alone": how long its measurements held the host. The build adds every worker's
# waits up and says the totals on its last line; each node's go to the record of its times (engine/node_times.py).
_WAITED = {"stages": 0.0, "measurements": 0.0, "alone": 0.0}


def take_waited():
    """{"stages": s, "measurements": s, "alone": s} since the last call, then zeros."""
    found = dict(_WAITED)
    _WAITED.update(dict.fromkeys(_WAITED, 0.0))
    return found


def add_waited(kind, seconds):
    """A wait this process learnt of from another it started (a measurement's own process)."""
    _WAITED[kind] += seconds


def _folder():
    folder = Path(tempfile.gettempdir(), f"mobilebuild-{os.getuid()}")
    folder.mkdir(exist_ok=True)
    return folder


def _lock_file(name):
    return open(_folder() / name, "a")


@contextlib.contextmanager
def _named(task, root):
    """A note of who runs a stage (task, checkout, pid), while it runs: a waiting measurement names what it waits for,
    another checkout's build included."""
    holders = _folder() / "stages"
    holders.mkdir(exist_ok=True)
    note = holders / f"{os.getpid()}-{id(task)}"
    note.write_text(f"{task or 'a stage'} in {root or 'this checkout'} (pid {os.getpid()})")
    try:
        yield
    finally:
        note.unlink(missing_ok=True)


def _running():
    """What the notes of running stages say, those of live processes only (a killed one leaves its note)."""
    found = []
    for note in sorted((_folder() / "stages").glob("*")):
        try:
            os.kill(int(note.name.split("-")[0]), 0)
            found.append(note.read_text())
        except ProcessLookupError:
            note.unlink(missing_ok=True)
        except (ValueError, OSError):  # not a note of ours; another user's process; removed meanwhile
            continue
    return found


@contextlib.contextmanager
def _locked(handle, mode):
    fcntl.flock(handle, mode)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def stage_running(task=None, root=None):
    """Around a stage (`task` in the checkout `root`, for a waiting measurement's message): waits while a measurement
    runs, and lets other stages run alongside."""
    with _lock_file("turnstile.lock") as turnstile, _lock_file("stages.lock") as stages:
        started = time.perf_counter()
        with _locked(turnstile, fcntl.LOCK_EX):
            fcntl.flock(stages, fcntl.LOCK_SH)
        _WAITED["stages"] += time.perf_counter() - started
        try:
            with _named(task, root):
                yield
        finally:
            fcntl.flock(stages, fcntl.LOCK_UN)


@contextlib.contextmanager
def measuring_alone(label):
    """Around a measurement: waits for the stages running now to finish, and holds off new ones until done. Yields
    how long it waited, in seconds."""
    started = time.perf_counter()
    with _lock_file("turnstile.lock") as turnstile, _lock_file("stages.lock") as stages, \
            _locked(turnstile, fcntl.LOCK_EX):
        try:
            fcntl.flock(stages, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            running = _running()
            shown = "; ".join(running[:2]) + (f"; and {len(running) - 2} more" if len(running) > 2 else "")
            print(f"   {label}: waiting for running stages to finish (benchmarks measure alone)"
                  f"{': ' + shown if shown else ''}", file=sys.stderr, flush=True)
            fcntl.flock(stages, fcntl.LOCK_EX)
        waited = time.perf_counter() - started
        _WAITED["measurements"] += waited
        try:
            yield waited
        finally:
            fcntl.flock(stages, fcntl.LOCK_UN)
            _WAITED["alone"] += time.perf_counter() - started - waited
