"""QEMU's user mode running the environment's aarch64 Python (setup.py makes it) as one CPU model."""

import shutil
import subprocess
from pathlib import Path

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import arm64

QEMU = "qemu-aarch64"
QEMU_APT = "apt-get install qemu-user"
GUEST_PYTHON = "usr/bin/python3.11"
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # the guest imports mobilebuild.worker.guest from here


def qemu_version():
    """qemu-aarch64's version ("7.2.22"), or a one-line error naming the apt line."""
    if shutil.which(QEMU) is None:
        raise MobileBuildError(f"{QEMU} not found: install QEMU's user mode ({QEMU_APT}), then run "
                               f"`{arm64.SETUP_COMMAND}` again")
    words = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=True).stdout.split()
    return words[words.index("version") + 1]


def guest(work, qemu_cpu, root, site, extra, arguments, timeout, plugin=None, **popen):
    """Run the emulated Python with `arguments` (check=True, captured), or start it (popen given)."""
    command = [QEMU, "-cpu", qemu_cpu, "-L", str(root), *(["-plugin", plugin] if plugin else []),
               str(Path(work) / "sysroot" / GUEST_PYTHON), *arguments]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{site}:{PACKAGE_PARENT}", "PYTHONHASHSEED": "0",
           "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", **dict(entry.split("=", 1) for entry in extra)}
    if popen:
        return subprocess.Popen(command, env={**env, **popen.pop("env", {})}, **popen)
    found = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if found.returncode != 0:
        last = found.stderr.strip().splitlines()
        raise MobileBuildError(f"the emulated Python failed ({' '.join(arguments[:2])}): "
                               f"{last[-1] if last else found.returncode}")
    return found
