"""Emulated aarch64 processes that run artifacts for the arm64 stage: one per CPU model, kept for the worker's life.

A runtime's import costs seconds to a minute under emulation, one run of a model seconds: the stage worker keeps
the process of each CPU model it has started (mobilebuild.worker.guest.serve) and sends it every artifact of that
CPU, whichever runtime, in a JSON line; the reply comes on a pipe of its own, away from what native code prints.
Where the environment has the instruction-count plugin, QEMU loads it and the guest reads the counts back.
"""

import atexit
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from mobilebuild.arm64 import emulator
from mobilebuild.worker import failures

_SESSIONS = {}  # (environment key, CPU model) -> Session


class Session:
    def __init__(self, environment, cpu):
        self.key, self.cpu = (environment["key"], cpu), cpu
        root = Path(environment["path"])
        self.scratch = Path(tempfile.mkdtemp(prefix="mobilebuild-arm64-"))
        self.log = self.scratch / "emulated.log"
        counts = self.scratch / "instructions.txt"
        plugin = root / "instructions.so"
        counted = environment.get("counter") and plugin.is_file()
        if counted:
            counts.touch()
        reply_read, reply_write = os.pipe()
        with open(self.log, "ab") as log:
            self.process = emulator.guest(
                root, environment["cpus"][cpu]["qemu"], root / "cpus" / cpu, root / "site",
                environment.get("environment", []), ["-m", "mobilebuild.worker.guest.serve", str(reply_write)],
                timeout=None, plugin=f"{plugin},out={counts}" if counted else None, stdin=subprocess.PIPE,
                stdout=log, stderr=log, pass_fds=(reply_write,), text=True,
                env={"MOBILEBUILD_INSTRUCTIONS_FILE": str(counts)} if counted else {})
        os.close(reply_write)
        self.replies = os.fdopen(reply_read)

    def run(self, runner, artifact, inputs, options=None, threads=1, runtime=None):
        """Run `artifact` with `runner` (given `options`) on each of `inputs` (a list of runs, each a list of numpy
        arrays): (the outputs of each run, the reply's counts and seconds)."""
        import numpy

        folder = Path(tempfile.mkdtemp(dir=self.scratch))
        paths = []
        for index, arrays in enumerate(inputs):
            paths.append([str(folder / f"input-{index}-{position}.npy") for position in range(len(arrays))])
            for path, array in zip(paths[-1], arrays):
                numpy.save(path, array)
        request = {"runner": runner, "artifact": str(Path(artifact).resolve()), "inputs": paths, "threads": threads,
                   "options": options or {}, "out": str(folder)}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.replies.readline()
        except OSError:
            line = ""
        if not line:  # a crash in native code (or the emulator's): what the process printed is its traceback
            printed = self._printed()
            self.close()
            last = printed.strip().splitlines()[-1:] or [f"exit status {self.process.poll()}"]
            raise failures.Failed({"raised_by": f"{runtime or runner} on emulated {self.cpu}", "part": None,
                                   "error": f"the emulated process ended: {last[0]}", "traceback": printed})
        reply = json.loads(line)
        if "error" in reply:
            raise failures.Failed({"raised_by": f"{runtime or runner} on emulated {self.cpu}", "part": None,
                                   "error": reply["error"], "traceback": reply["traceback"]})
        outputs = [[numpy.load(path) for path in run] for run in reply.pop("outputs")]
        shutil.rmtree(folder)
        return outputs, reply

    def _printed(self, lines=200):
        """The last `lines` of what the emulated process printed (the runtimes' native logs, a crash's report)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self):
        if _SESSIONS.get(self.key) is self:
            del _SESSIONS[self.key]
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.replies.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def session(environment, cpu):
    """The emulated process of `cpu` in `environment`, started at its first use."""
    found = _SESSIONS.get((environment["key"], cpu))
    if found is None or found.process.poll() is not None:
        found = Session(environment, cpu)
        _SESSIONS[found.key] = found
    return found


@atexit.register
def _close_all():
    for found in list(_SESSIONS.values()):
        found.close()
