"""The record of how long each node took to build: what benchmarks/replay.py replays on simulated workers to show
what a scheduling policy costs at 2 to 64 workers.

One JSON line per node built here (not fetched from the shared cache), appended by the process that ran it (doit's
workers append side by side; a line this short is written whole): its task, when it started and ended (epoch
seconds), its waits (worker/measure_alone.py): the seconds it waited for measurements to end ("stages"), its
measurement for running stages to finish ("measurements"), and how long its measurement held the host ("alone"), and
the stage's peak resident memory in MB where its worker measured it ("peak_rss_mb", worker/peak_rss.py).
The newest line of a task is its time; `doit clean` leaves the record, which only ever informs a replay.
"""

import contextlib
import json
import os
import time

RECORD = ".mobilebuild/node_times.jsonl"


def note(task, started, waited, peak_rss_mb=None):
    """Append `task`'s line: it started at `started` (time.time()) and ends now, with `waited` (take_waited's) and
    the stage's peak resident memory."""
    line = {"task": task, "started": round(started, 3), "ended": round(time.time(), 3),
            **{kind: round(seconds, 3) for kind, seconds in (waited or {}).items() if round(seconds, 3)},
            **({"peak_rss_mb": peak_rss_mb} if peak_rss_mb is not None else {})}
    with contextlib.suppress(OSError):  # a read-only checkout builds all the same
        os.makedirs(os.path.dirname(RECORD), exist_ok=True)
        with open(RECORD, "a") as handle:
            handle.write(json.dumps(line) + "\n")


def read(path=RECORD):
    """{task: its newest line} of the record at `path`."""
    found = {}
    with contextlib.suppress(FileNotFoundError), open(path) as handle:
        for line in handle:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                found[entry["task"]] = entry
    return found
