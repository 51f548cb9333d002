"""Benchmarks measure alone: while one times a model, no other mobilebuild stage runs on this host.

`doit -n N`, Dask workers on the same machine and builds in other checkouts all run stages side by side; a timing
taken next to them measures the contention. A read-write lock shared by every build of this user on this host
keeps them apart: stages hold it shared, a measurement holds it exclusively. A measurement waiting for it also holds
a turnstile that stages pass on their way in, so a stream of stages cannot keep it waiting for ever. flock locks go
with their process: a killed build leaves nothing locked.

From RESERVE_FROM cores up, one core is set aside instead (`reserved_core`): stage workers keep off it, and a
one-thread measurement runs on it, one at a time, while stages go on on the others. A replay of the bundled examples'
recorded build (docs/benchmarks.md, "Scaling") puts measuring alone at 0.46 of the ideal speed-up at 16 workers, a
reserved core at 1.00; below 4 cores the core it costs is worth more than the waits it saves.

Below it, a measurement waits for the running stages while none of them has run for `patience()` seconds (30 by
default): past that it lets new stages in again, and clears the cores it needs of the stages still running (another
checkout's 11-minute lowering, say), which go on on the others until it ends. Builds side by side no longer convoy
behind one long stage.
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
PATIENCE = "MOBILEBUILD_MEASURE_PATIENCE"  # seconds a measurement waits for running stages before it clears a core
DEFAULT_PATIENCE_S = 30.0


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


def patience():
    """Seconds a measurement waits for the stages running on the host before it clears cores of them."""
    return float(os.environ.get(PATIENCE) or DEFAULT_PATIENCE_S)


def _threads_of(pid):
    """The thread ids of process `pid` and of every process below it (a stage's compiler, its emulated-ARM run)."""
    found = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # it ended meanwhile
        return found
    for thread in threads:
        found.append(int(thread))
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{thread}/children") as children:
            for child in children.read().split():
                found.extend(_threads_of(int(child)))
    return found


def _pinned(cores, pid="self"):
    """Every thread of this process (or of `pid` and the processes below it) onto `cores` (sched_setaffinity of a
    process moves its calling thread only; torch's pool may have started threads already)."""
    for thread in (os.listdir("/proc/self/task") if pid == "self" else _threads_of(pid)):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), cores)


def _measuring_core(threads):
    """The core a measurement of `threads` threads runs on, or None: it measures alone (one core holds one thread)."""
    return reserved_core() if threads == 1 else None


# how this process's last measurement was taken, for its result and the report
_TAKEN = {"policy": "alone"}


def isolation():
    """How this process's last measurement (measuring_alone) was kept apart from the stages."""
    return dict(_TAKEN)


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
    """(pid, note, when it started) of each running stage, of live processes only (a killed one leaves its note)."""
    found = []
    for note in sorted((_folder() / "stages").glob("*")):
        try:
            pid = int(note.name.split("-")[0])
            os.kill(pid, 0)
            found.append((pid, note.read_text(), note.stat().st_mtime))
        except ProcessLookupError:
            note.unlink(missing_ok=True)
        except (ValueError, OSError):  # not a note of ours; another user's process; removed meanwhile
            continue
    return found


def _cleared_cores():
    """The cores a measurement has cleared of stages, while it runs (its note names them and its process)."""
    try:
        *cores, pid = (_folder() / "cleared").read_text().split()
        os.kill(int(pid), 0)
        return {int(core) for core in cores}
    except (OSError, ValueError):  # none; its measurement was killed; another user's
        return set()


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
    runs alone, and lets other stages run alongside; keeps this process off a reserved core, and off the cores a
    measurement has cleared while it runs."""
    usable = os.sched_getaffinity(0)
    core = reserved_core()
    if core is not None and core in usable:
        usable -= {core}
        _pinned(usable)
    with _lock_file("turnstile.lock") as turnstile, _lock_file("stages.lock") as stages:
        started = time.perf_counter()
        with _locked(turnstile, fcntl.LOCK_EX):
            fcntl.flock(stages, fcntl.LOCK_SH)
        _WAITED["stages"] += time.perf_counter() - started
        try:
            with _named(task, root):  # named first: a measurement clearing cores from now on moves this process
                cleared = _cleared_cores() & usable
                if cleared and usable - cleared:
                    _pinned(usable - cleared)
                try:
                    yield
                finally:
                    if cleared:
                        _pinned(usable)
        finally:
            fcntl.flock(stages, fcntl.LOCK_UN)


@contextlib.contextmanager
def measuring_alone(label, threads=1):
    """Around a measurement of `threads` threads: on the reserved core where one is; else alone once the stages
    running now finish, holding off new ones; or, where they run past `patience()`, on cores cleared of them. One
    measurement at a time on this host. Yields how long it waited, in seconds; `isolation()` says how it was taken."""
    started, since = time.perf_counter(), time.time()
    core = _measuring_core(threads)
    with contextlib.ExitStack() as held:
        if core is not None:
            cores, taken = {core}, {"policy": "reserved core", "core": core}
        elif _alone(held, label, threads, since):
            cores, taken = None, {"policy": "alone"}
        else:
            cores = set(sorted(os.sched_getaffinity(0))[-threads:])
            taken = {"policy": "cleared core", "core": min(cores), "cores": sorted(cores)}
        _take_turn(held, label, core)
        if taken["policy"] == "cleared core":
            taken["stages"] = len(held.enter_context(_cleared(cores)))
        waited = time.perf_counter() - started
        _WAITED["measurements"] += waited
        if cores:
            held.callback(_pinned, os.sched_getaffinity(0))
            _pinned(cores)
        _TAKEN.clear()
        _TAKEN.update(taken)
        try:
            yield waited
        finally:
            _WAITED["alone"] += time.perf_counter() - started - waited


def _alone(held, label, threads, since):
    """True once this process holds the host alone (the stages running now finished; new ones wait until `held`
    ends); False where cores can be cleared instead (fewer threads than cores) and a running stage has run past
    `patience()`, or the wait since `since` has: the turnstile is let go, and stages start again. A stage that has
    run long already is not waited for at all: the measurements after the first that cleared a core of it would each
    hold the host's stages off for as long again."""
    turnstile = held.enter_context(_lock_file("turnstile.lock"))
    stages = held.enter_context(_lock_file("stages.lock"))
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(stages, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        running = _running()
        shown = "; ".join(text for _, text, _ in running[:2]) + (
            f"; and {len(running) - 2} more" if len(running) > 2 else "")
        if threads < len(os.sched_getaffinity(0)):
            # no stage starts while the turnstile is held: the oldest running now sets the limit
            deadline = min([since, *(started for _, _, started in running)]) + patience()
            if not _waited_for(stages, deadline, label, shown):
                fcntl.flock(turnstile, fcntl.LOCK_UN)
                print(f"   {label}: a stage has run past {patience():.0f} s: measuring on a core cleared of the "
                      f"running stages, which go on on the others{': ' + shown if shown else ''}", file=sys.stderr,
                      flush=True)
                return False
        else:
            print(f"   {label}: waiting for running stages to finish (benchmarks measure alone)"
                  f"{': ' + shown if shown else ''}", file=sys.stderr, flush=True)
            fcntl.flock(stages, fcntl.LOCK_EX)
    held.callback(fcntl.flock, turnstile, fcntl.LOCK_UN)
    held.callback(fcntl.flock, stages, fcntl.LOCK_UN)  # let go first
    return True


def _waited_for(stages, deadline, label, shown):
    """True once the running stages finished (`stages` held exclusively); False at `deadline` (time.time())."""
    if time.time() < deadline:
        print(f"   {label}: waiting for running stages to finish (benchmarks measure alone, "
              f"{deadline - time.time():.0f} s at most){': ' + shown if shown else ''}", file=sys.stderr, flush=True)
    while time.time() < deadline:
        try:
            fcntl.flock(stages, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(0.1)
    return False


def _take_turn(held, label, core):
    """One measurement at a time on this host, whichever way each is kept apart from the stages."""
    turn = held.enter_context(_lock_file("measure.lock"))
    try:
        fcntl.flock(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        where = f"on core {core}" if core is not None else "on this host"
        print(f"   {label}: waiting for the measurement {where} to end", file=sys.stderr, flush=True)
        fcntl.flock(turn, fcntl.LOCK_EX)
    held.callback(fcntl.flock, turn, fcntl.LOCK_UN)


@contextlib.contextmanager
def _cleared(cores):
    """`cores` cleared of the running stages (and of the processes below them), which go on on their other cores:
    yields {pid: affinity before} of those it moved, and gives the cores back after. Stages starting meanwhile keep
    off them by the note (stage_running)."""
    note = _folder() / "cleared"
    note.write_text(" ".join(str(core) for core in sorted(cores)) + f" {os.getpid()}")
    moved = {}
    try:
        for pid, _, _ in _running():
            with contextlib.suppress(OSError):  # it ended meanwhile
                usable = os.sched_getaffinity(pid)
                if usable & cores and usable - cores:
                    moved[pid] = usable
                    _pinned(usable - cores, pid)
        yield moved
    finally:
        note.unlink(missing_ok=True)
        for pid, usable in moved.items():
            for thread in _threads_of(pid):  # threads started meanwhile too
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(thread, os.sched_getaffinity(thread) | (usable & cores))
