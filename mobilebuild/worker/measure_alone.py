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
from pathlib import Path


def _lock_file(name):
    folder = Path(tempfile.gettempdir(), f"mobilebuild-{os.getuid()}")
    folder.mkdir(exist_ok=True)
    return open(folder / name, "a")


@contextlib.contextmanager
def _locked(handle, mode):
    fcntl.flock(handle, mode)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def stage_running():
    """Around a stage: waits while a measurement runs, and lets other stages run alongside."""
    with _lock_file("turnstile.lock") as turnstile, _lock_file("stages.lock") as stages:
        with _locked(turnstile, fcntl.LOCK_EX):
            fcntl.flock(stages, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(stages, fcntl.LOCK_UN)


@contextlib.contextmanager
def measuring_alone(label):
    """Around a measurement: waits for the stages running now to finish, and holds off new ones until done."""
    with _lock_file("turnstile.lock") as turnstile, _lock_file("stages.lock") as stages, \
            _locked(turnstile, fcntl.LOCK_EX):
        try:
            fcntl.flock(stages, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"   {label}: waiting for running stages to finish (benchmarks measure alone)", file=sys.stderr,
                  flush=True)
            fcntl.flock(stages, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(stages, fcntl.LOCK_UN)
