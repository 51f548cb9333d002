"""Benchmarks measure alone: while one times a model, no other mobilebuild stage runs on this host.

`doit -n N`, Dask workers on the same machine and builds in other checkouts all run stages side by side; a timing
taken next to them measures the contention. A read-write lock shared by every build of this user on this host
keeps them apart: stages hold it shared, a measurement holds it exclusively. A measurement waiting for it also holds
a turnstile that stages pass on their way in, so a stream of stages cannot keep it waiting for ever. flock locks go
with their process: a killed build leaves nothing locked.

From RESERVE_FROM cores up, one core is set aside instead (`reserved_core`): stage workers keep off it, and a
one-thread measurement runs on it, one at a time, while stages go on on the others. A replay of the bundled examples'
recorded build (docs/benchmarks.md, "Scaling") puts today's policy at 0.46 of the ideal speed-up at 16 workers, a
reserved core at 1.00; below 4 cores the core it costs is worth more than the waits it saves.
"""

import contextlib
import fcntl
import os
import sys
import tempfile
import time
from pathlib import Path

RESERVE_FROM = 4  # cores this process may use, from which measurements get a core of their own
POLICY = "MOBILEBUILD_MEASURE"  # "alone" or "reserved-core": the policy, whatever the number of cores
RESERVED = "MOBILEBUILD_RESERVED_CORE"  # the core as the first process chose it: its children may be kept off it


def reserved_core():
    """The core set aside for measurements, or None: they run alone. The highest core this process may use, chosen
    once and passed on to the processes it starts (a stage worker's own affinity leaves it out)."""
    if RESERVED in os.environ:
        return int(os.environ[RESERVED])
    cores = os.sched_getaffinity(0)
    policy = os.environ.get(POLICY) or ("reserved-core" if len(cores) >= RESERVE_FROM else "alone")
    if policy != "reserved-core" or len(cores) < 2:
        return None
    os.environ[RESERVED] = str(max(cores))
    return max(cores)


def _pinned(cores):
    """Every thread of this process onto `cores` (sched_setaffinity of a process moves its calling thread only; torch's
    pool may have started threads already)."""
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), cores)


def _measuring_core(threads):
    """The core a measurement of `threads` threads runs on, or None: it measures alone (one core holds one thread)."""
    return reserved_core() if threads == 1 else None


def isolation(threads=1):
    """How a measurement of `threads` threads is taken here (measuring_alone), for its result and the report."""
    core = _measuring_core(threads)
    return {"policy": "alone"} if core is None else {"policy": "reserved core", "core": core}


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
    runs alone, and lets other stages run alongside; where a core is reserved, keeps this process off it."""
    core = reserved_core()
    if core is not None and core in os.sched_getaffinity(0):
        _pinned(os.sched_getaffinity(0) - {core})
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
def measuring_alone(label, threads=1):
    """Around a measurement of `threads` threads: on the reserved core where one is (one measurement at a time), else
    alone: waits for the stages running now to finish, and holds off new ones until done. Yields how long it waited,
    in seconds."""
    core = _measuring_core(threads)
    if core is not None:
        with _on_reserved_core(label, core) as waited:
            yield waited
        return
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


@contextlib.contextmanager
def _on_reserved_core(label, core):
    """This process on `core` alone, which stages keep off, once the measurements before it there are done."""
    started = time.perf_counter()
    before = os.sched_getaffinity(0)
    with _lock_file("reserved.lock") as reserved:
        try:
            fcntl.flock(reserved, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"   {label}: waiting for the measurement on core {core} to end", file=sys.stderr, flush=True)
            fcntl.flock(reserved, fcntl.LOCK_EX)
        waited = time.perf_counter() - started
        _WAITED["measurements"] += waited
        _pinned({core})
        try:
            yield waited
        finally:
            _pinned(before)
            fcntl.flock(reserved, fcntl.LOCK_UN)
            _WAITED["alone"] += time.perf_counter() - started - waited
