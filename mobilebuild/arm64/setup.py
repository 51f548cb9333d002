"""`mobilebuild arm64 setup`: the environment that runs a build's CPU artifacts on emulated ARM CPUs.

What goes in: Debian's arm64 Python 3.11 and the libraries the runtimes link (`apt-get download` into a private apt
state, `dpkg -x` into a sysroot: the host's own Python is left alone), each runtime's own aarch64 wheel at the
host's version, a /proc/cpuinfo per CPU model (QEMU 7.2 has none of its own for aarch64, and onnxruntime crashes
reading the host's), and the instruction-count plugin (instructions.c) built with the host's C compiler. It lands in
the user's cache under a key of all that, written whole or not at all; a second run with the same inputs only
points `current.json` at it again. QEMU itself comes from Debian: where it is missing, one line says the apt line.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from mobilebuild.arm64.emulator import guest, qemu_version
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import arm64

# Debian bookworm's arm64 Python and what its standard library and the runtimes' wheels link
DEBS = ("python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "libc6", "libgcc-s1", "libstdc++6",
        "zlib1g", "libexpat1", "libffi8", "libssl3", "libbz2-1.0", "liblzma5", "libcrypt1", "libuuid1",
        "libsqlite3-0", "libncursesw6", "libtinfo6", "libreadline8", "libgomp1", "libzstd1", "libnsl2", "libtirpc3",
        "libdb5.3", "libgdbm6")
# the manylinux levels an aarch64 wheel may declare and bookworm's glibc (2.36) loads
PLATFORMS = ("manylinux2014_aarch64", *(f"manylinux_2_{n}_aarch64" for n in (17, 24, 26, 27, 28, 31, 34, 35, 36)))
COMMON_WHEELS = ("numpy",)
PLUGIN_SOURCE = Path(__file__).with_name("instructions.c")
# Linux's arm64 HWCAP and HWCAP2 bits, in order, by the names /proc/cpuinfo gives them (arch/arm64/kernel/cpuinfo.c)
HWCAP = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 "
         "sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg").split()
HWCAP2 = ("dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm svebf16 i8mm "
          "bf16 dgh rng bti mte ecv afp rpres mte3 sme sme_i16i64 sme_f64f64 sme_i8i32 sme_f16f32 sme_b16f32 "
          "sme_f32f32 sme_fa64").split()
AUXV = ("import struct\nwords = open('/proc/self/auxv', 'rb').read()\n"
        "pairs = dict(struct.iter_unpack('<QQ', words))\nprint(pairs.get(16, 0), pairs.get(26, 0))")


def say(line):
    print(line, flush=True)


def host_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def wanted_runtimes(registered):
    """{runtime: Arm64} of `registered` (routes.arm64_runtimes()) whose host package is installed (an aarch64 wheel
    pinned to what the host has) and whose setup finds the tools it needs; a line says what is left out and why."""
    found = {}
    for name, runtime in registered.items():
        missing = runtime.setup.missing_tools() if runtime.setup else []
        if missing:
            say(f"      {name} left out: {', '.join(missing)} not found "
                f"(apt-get install {runtime.setup.TOOLS_PACKAGE})")
        elif all(host_version(wheel) for wheel in runtime.wheels):
            found[name] = runtime
    return found


def requirements(found):
    """name==version of every wheel the runtimes need, pinned to the host's versions."""
    names = [*COMMON_WHEELS, *(wheel for runtime in found.values() for wheel in runtime.wheels)]
    names += [wheel for module in _setups(found) for wheel in module.wheels(host_version)]
    pinned = {}
    for name in names:
        bare, _, version = name.partition("==")
        pinned.setdefault(bare, version or host_version(bare))
    return [f"{name}=={version}" for name, version in pinned.items()]


def _setups(found):
    """The runtimes' setup modules, each once (PyTorch Mobile's and ExecuTorch's are one)."""
    return list({id(runtime.setup): runtime.setup for runtime in found.values() if runtime.setup}.values())


def environment_key(qemu, wanted, compiler):
    found = {"qemu": qemu, "debs": DEBS, "wheels": sorted(wanted), "plugin": _digest(PLUGIN_SOURCE.read_bytes()),
             "compiler": compiler is not None, "cpus": [[c.name, c.qemu, c.midr] for c in arm64.CPUS.values()]}
    return _digest(json.dumps(found, sort_keys=True).encode())[:16]


def _digest(data):
    return hashlib.sha256(data).hexdigest()


def setup(registered, environ=None):
    """Make (or find) the environment for the runtimes `registered` (routes.arm64_runtimes()) and point
    current.json at it; returns its description."""
    home = arm64.home(environ)
    qemu = qemu_version()
    runtimes = wanted_runtimes(registered)
    wanted = requirements(runtimes)
    compiler = shutil.which("cc") or shutil.which("gcc")
    key = environment_key(qemu, wanted, compiler)
    target = home / key
    if not (target / "environment.json").is_file():
        home.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".partial-", dir=home))
        try:
            _build(work, home, qemu, runtimes, wanted, compiler, key)
            shutil.rmtree(target, ignore_errors=True)
            work.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        say(f"aarch64 environment {key} is up to date")
    found = json.loads((target / "environment.json").read_text())
    found["path"] = str(target)
    store_current(home, found)
    return found


def store_current(home, found):
    partial = home / f".{arm64.CURRENT}.partial"
    partial.write_text(json.dumps(found, indent=2, sort_keys=True))
    partial.replace(home / arm64.CURRENT)


def _build(work, home, qemu, runtimes, wanted, compiler, key):
    sysroot, site = work / "sysroot", work / "site"
    say(f"[1/5] Debian's arm64 Python 3.11 and its libraries ({len(DEBS)} packages) -> sysroot")
    debs = _sysroot(home / "apt", sysroot)
    say(f"[2/5] aarch64 wheels: {', '.join(wanted)}")
    _wheels(home / "wheels", site, wanted)
    extra = []
    for module in _setups(runtimes):
        say("      " + " ".join(module.make_loadable.__doc__.split(":")[0].split()))
        extra += module.make_loadable(sysroot, site, work)
    _compile(sysroot, site)
    say(f"[3/5] CPU models: {', '.join(arm64.CPUS)}")
    cpus = {cpu.name: _cpu_root(work, sysroot, site, cpu, extra) for cpu in arm64.CPUS.values()}
    say("[4/5] the instruction-count plugin")
    counter = _plugin(work, compiler)
    say("[5/5] each runtime imported under emulation")
    versions = dict(requirement.split("==") for requirement in wanted)
    for name, runtime in runtimes.items():
        _check_import(work, cpus, site, extra, runtime.runner)
    found = {"key": key, "qemu": qemu, "python": _guest_python_version(work, site, extra), "wheels": versions,
             "cpus": cpus, "counter": counter, "environment": extra, "debs": debs,
             "runtimes": {name: {"runner": runtime.runner, "wheels": list(runtime.wheels)}
                          for name, runtime in runtimes.items()}}
    (work / "environment.json").write_text(json.dumps(found, indent=2, sort_keys=True))


def _sysroot(state, sysroot):
    """Debian's arm64 packages (DEBS) unpacked into `sysroot`; returns their file names."""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise MobileBuildError("the aarch64 environment is made from Debian 12's arm64 packages: apt-get and dpkg "
                               "are needed (Debian 12, bookworm)")
    for folder in (state / "lists" / "partial", state / "cache" / "archives" / "partial"):
        folder.mkdir(parents=True, exist_ok=True)
    debs = Path(tempfile.mkdtemp(dir=sysroot.parent))
    updated = subprocess.run(["apt-get", *_apt_options(state), "update"], capture_output=True, text=True)
    fetched = subprocess.run(["apt-get", *_apt_options(state), "download", *DEBS], cwd=debs, capture_output=True,
                             text=True)
    if fetched.returncode != 0:
        last = (fetched.stderr or updated.stderr).strip().splitlines()
        raise MobileBuildError(f"apt-get could not download Debian's arm64 packages: {last[-1] if last else ''}")
    sysroot.mkdir()
    files = sorted(debs.glob("*.deb"))
    for deb in files:
        subprocess.run(["dpkg", "-x", str(deb), str(sysroot)], check=True)
    shutil.rmtree(debs)
    return [deb.name for deb in files]  # their versions, which the environment's description records


def _apt_options(state):
    return ["-o", "APT::Architecture=arm64", "-o", "APT::Architectures=arm64",
            "-o", f"Dir::State::Lists={state / 'lists'}", "-o", f"Dir::Cache={state / 'cache'}",
            "-o", "Dir::State::status=/dev/null", "-o", "Debug::NoLocking=1", "-q"]


def _pip(*words):
    platforms = [word for platform in PLATFORMS for word in ("--platform", platform)]
    found = subprocess.run([sys.executable, "-m", "pip", *words, "--no-deps", "--only-binary=:all:",
                            "--python-version", "3.11", "--implementation", "cp", *platforms, "--quiet"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        last = [line for line in found.stderr.splitlines() if line.startswith("ERROR")] or found.stderr.splitlines()
        raise MobileBuildError(f"pip could not get the aarch64 wheels: {last[0] if last else found.returncode}")


def _wheels(cache, site, wanted):
    cache.mkdir(parents=True, exist_ok=True)
    _pip("download", "--dest", str(cache), *wanted)
    names = {requirement.split("==")[0].lower().replace("-", "_") + "-" + requirement.split("==")[1]
             for requirement in wanted}
    files = [str(path) for path in sorted(cache.glob("*.whl"))
             if "-".join(path.name.split("-")[:2]).lower() in names]
    _pip("install", "--no-index", "--target", str(site), *files)


def _compile(sysroot, site):
    """Bytecode for the emulated Python's standard library and wheels, compiled by this host's Python 3.11 (the same
    bytecode): Debian's packages ship none, and the emulated process writes none (it runs with
    PYTHONDONTWRITEBYTECODE, so that builds side by side share the environment read-only); compiling torch's modules
    under emulation at every start took longer than running them."""
    for folder in (sysroot / "usr" / "lib" / "python3.11", site):
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(folder)], capture_output=True)


def cpuinfo(cpu, features):
    implementer, part = cpu.midr
    return (f"processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: {' '.join(features)}\nCPU implementer\t: "
            f"0x{implementer:02x}\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0x{part:03x}\n"
            "CPU revision\t: 0\n\n")


def _cpu_root(work, sysroot, site, cpu, extra):
    """The sysroot as CPU model `cpu` sees it (QEMU's -L prefix): links to the shared sysroot's folders, and a
    /proc/cpuinfo of its own with the features QEMU gives it (read from the emulated process's auxiliary vector)."""
    root = work / "cpus" / cpu.name
    (root / "proc").mkdir(parents=True)
    for entry in sysroot.iterdir():
        (root / entry.name).symlink_to(os.path.relpath(entry, root))
    words = guest(work, cpu.qemu, root, site, extra, ["-c", AUXV], timeout=120).stdout.split()
    found = features(int(words[-2]), int(words[-1]))
    (root / "proc" / "cpuinfo").write_text(cpuinfo(cpu, found))
    return {"qemu": cpu.qemu, "features": found}


def features(hwcap, hwcap2):
    """The names /proc/cpuinfo gives the bits of AT_HWCAP and AT_HWCAP2."""
    return ([name for bit, name in enumerate(HWCAP) if hwcap >> bit & 1]
            + [name for bit, name in enumerate(HWCAP2) if hwcap2 >> bit & 1])


def _plugin(work, compiler):
    """The plugin's source digest (what keys the counts), or None where no C compiler builds it."""
    if compiler is None:
        say("      no C compiler (cc): artifacts are verified, but instructions are not counted (apt-get install gcc)")
        return None
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(work / "instructions.so"), str(PLUGIN_SOURCE)],
                   check=True, capture_output=True)
    return _digest(PLUGIN_SOURCE.read_bytes())[:12]


def _check_import(work, cpus, site, extra, runner):
    first = next(iter(arm64.CPUS.values()))
    guest(work, first.qemu, work / "cpus" / first.name, site, extra,
          ["-c", f"from mobilebuild.worker.guest.serve import load_runner; load_runner({runner!r})"], timeout=600)


def _guest_python_version(work, site, extra):
    first = next(iter(arm64.CPUS.values()))
    return guest(work, first.qemu, work / "cpus" / first.name, site, extra,
                 ["-c", "import platform; print(platform.python_version())"], timeout=120).stdout.split()[-1]

