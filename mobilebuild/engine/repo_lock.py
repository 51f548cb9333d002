"""One build at a time in a repository: a second build waits for the first and says so, instead of racing it
over the same artifacts and doit's dependency file."""

import fcntl
import os
import sys
from pathlib import Path

LOCK_FILE = ".mobilebuild/build.lock"
_held = []  # the open, locked file: the lock lasts as long as the process


def hold_build_lock(root="."):
    if _held:
        return
    path = Path(root, LOCK_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        # the real stderr: doit's JSON reporter swaps sys.stderr for a buffer it reports only at the end
        print(f"another build is running in this repository (pid {holder}, {LOCK_FILE}); waiting for it to finish",
              file=sys.__stderr__, flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    _held.append(handle)


def release_build_lock():
    """Let go of the lock before the process ends: `mobilebuild check` runs the build's tasks, then inspects what they
    made while a build may start (and, in a test, runs a build itself)."""
    while _held:
        handle = _held.pop()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
