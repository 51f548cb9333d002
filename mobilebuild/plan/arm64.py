"""The emulated aarch64 CPUs that verify a build's CPU artifacts on ARM code paths, and where the environment that
runs them lives (`mobilebuild arm64 setup` makes it: mobilebuild/arm64/setup.py). Names and facts only.

Each CPU model is one of QEMU user mode's, as kernels pick their code paths by the CPU's features (HWCAP): NEON
only, dot product, SVE2 and i8mm. The environment is found at plan time by one small file (`current.json`), so
that a build plans ARM nodes only where it can run them.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

HOME_VARIABLE = "MOBILEBUILD_ARM64_HOME"  # where the environments live; default: the user's cache
CURRENT = "current.json"
SETUP_COMMAND = "mobilebuild arm64 setup"


@dataclass(frozen=True)
class Cpu:
    name: str  # in recipes, results and the report
    qemu: str  # qemu-aarch64's -cpu
    generation: str  # what a reader is told it stands for
    # (implementer, part) in the /proc/cpuinfo the emulated process reads. Not QEMU's max's own (0x00, 0x051), nor a
    # Cortex-A710's, X2's or A715's: with any of those, LiteRT 2.3.0's first model load crashes under every CPU model
    midr: tuple
    # (the first QEMU version that emulates it right, why older ones do not), or None
    needs: tuple | None = None


CPUS = {cpu.name: cpu for cpu in (
    Cpu("cortex-a53", "cortex-a53", "ARMv8.0: NEON, no dot product (budget phones)", (0x41, 0xd03)),
    Cpu("cortex-a76", "cortex-a76", "ARMv8.2: dot product, fp16 (mid-range phones since 2019)", (0x41, 0xd0b)),
    # QEMU 7.2's only ARMv9-class model, SVE at 128 bits as in ARMv9 phone and server cores, SME off
    # (docs/arm64.md: XNNPACK's int8 is wrong with it on)
    Cpu("armv9-sve2", "max,sme=off,sve128=on", "ARMv9-class: SVE2 at 128 bits, i8mm, bf16 (QEMU's max CPU, SME off)",
        (0x41, 0xd49)),
    Cpu("armv9-sme", "max", "ARMv9-class with SME (QEMU's max CPU)", (0x41, 0xd49),
        needs=((8, 2, 3), "QEMU before 8.2.3 computes SME's int8 outer product (SMOPA) wrongly, so XNNPACK's SME "
                          "kernels give wrong int8 results (docs/arm64.md)")),
)}
DEFAULT_CPUS = ("cortex-a53", "cortex-a76", "armv9-sve2")
DEFAULT_SAMPLES = 2


def refused(cpu, qemu):
    """Why CPU model `cpu` cannot be trusted under QEMU version `qemu` ("7.2.22"), or None."""
    needs = CPUS[cpu].needs
    if needs is None or tuple(int(part) for part in qemu.split(".")[:3] if part.isdigit()) >= needs[0]:
        return None
    return f"{cpu} needs QEMU {'.'.join(map(str, needs[0]))} or newer, this is {qemu}: {needs[1]}"


def home(environ=None):
    environ = os.environ if environ is None else environ
    found = environ.get(HOME_VARIABLE)
    if found:
        return Path(found)
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache, "mobilebuild", "arm64")


def current(environ=None):
    """The environment `mobilebuild arm64 setup` made last ({"path", "key", "qemu", "python", "wheels", "cpus",
    "counter", "runtimes"}), or None where there is none."""
    try:
        found = json.loads((home(environ) / CURRENT).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and Path(found.get("path", "")).is_dir() else None


def emulator(environment, cpu, runtime):
    """What keys a node that runs `runtime`'s artifacts on `cpu` in `environment`: the emulator and CPU, the guest
    Python, the runtime's aarch64 wheels, and how instructions are counted. No path: a cache entry serves every
    machine with the same environment."""
    wheels = environment["runtimes"].get(runtime, {}).get("wheels", {})
    return {"qemu": environment["qemu"], "cpu": CPUS[cpu].qemu, "python": environment["python"],
            "wheels": {name: environment["wheels"][name] for name in wheels if name in environment["wheels"]},
            "counter": environment.get("counter")}
