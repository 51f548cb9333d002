"""PyTorch and ExecuTorch for the emulated aarch64 Python (`mobilebuild arm64 setup`): which wheels, and how to make
them load. Imports neither torch nor doit: it runs on the host before either matters.

PyPI's only aarch64 torch is a CUDA build: its libraries need libcudart, cuDNN, CUPTI, NCCL, cuBLAS... which the
emulated process neither has nor could use. `make_loadable` writes a stub in place of each such library, defining the
symbols torch imports from it (each returns an error code, so `torch.cuda.is_available()` is False), into the folder
torch's own RPATH already looks in (`site/nvidia/cu13/lib`): nothing to add to the emulated process's environment.
ExecuTorch's pybindings link that libtorch, so .pte runs need the same stubs.
"""

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

# The host tools `make_loadable` runs, all from one Debian package.
READELF, ASSEMBLER, LINKER = "aarch64-linux-gnu-readelf", "aarch64-linux-gnu-as", "aarch64-linux-gnu-ld"
TOOLS_PACKAGE = "binutils-aarch64-linux-gnu"

# What the emulated process imports: torch (whose `import` needs typing_extensions alone of its dependencies) and
# ExecuTorch's binding, imported alone (routes/executorch/worker/guest.py); numpy comes with the other runtimes. Checked
# by running each runner's artifacts under emulation.
PACKAGES = ("torch", "executorch", "typing_extensions")

# Where torch's libraries look for the CUDA ones (their RPATH has $ORIGIN/../../nvidia/cu13/lib), relative to site.
STUB_FOLDER = Path("nvidia", "cu13", "lib")
# The libraries stubbed: CUDA's. Any other missing library is a real one to take from Debian, not to stub (the only
# one today: libatomic1, which ExecuTorch's LLM runner binding `_llm_runner` links; the runners here do not load it).
CUDA_LIBRARY = re.compile(r"lib(cu|nv|nccl)")
MARKER = ".mobilebuild-stubs"  # in STUB_FOLDER: says the libraries there are ours, and which ones

# The stubs' functions return this: cudaErrorNoDevice / CUDA_ERROR_NO_DEVICE, and an error in every other CUDA
# library's status codes. Functions that return a message (cudaGetErrorString...) return a pointer to one instead.
ERROR_CODE = 100
MESSAGE_FUNCTION = re.compile(r"(Error|Status|Result)(String|Name)$")


def wheels(version_of):
    """`name==version` of each aarch64 wheel to download, pinned to the host's versions (`version_of(name)`, as
    importlib.metadata.version answers): the host made the artifacts with those."""
    return [f"{name}=={version_of(name)}" for name in PACKAGES]


def missing_tools():
    """The tools `make_loadable` needs that are not on PATH (`apt-get install TOOLS_PACKAGE` brings them)."""
    return [tool for tool in (READELF, ASSEMBLER, LINKER) if shutil.which(tool) is None]


def make_loadable(sysroot, site, work):
    """Make `import torch` and ExecuTorch's binding load under `qemu-aarch64 -L sysroot` with
    `site` on the path: a stub for each library torch's or ExecuTorch's binaries need and neither `site` nor the
    sysroot has. Idempotent (stubs already made for the same wheels are kept). `work`: a scratch folder. Returns the
    extra environment entries the emulated process needs (none: the stubs are where torch's RPATH looks)."""
    sysroot, site, work = Path(sysroot), Path(site), Path(work)
    stubs = site / STUB_FOLDER
    binaries = sorted(path for folder in (site / "torch", site / "executorch") for path in folder.rglob("*.so*")
                      if path.is_file() and _is_elf(path))
    present = {path.name for path in site.rglob("*.so*")} - _ours(stubs)
    present |= {path.name for folder in _library_folders(sysroot) for path in folder.glob("*.so*")}
    needed = {name for binary in binaries for name in _needed(binary)}
    missing = sorted(name for name in needed - present if CUDA_LIBRARY.match(name))
    wanted = _stub_symbols(missing, binaries, sysroot, site)
    signature = "".join(f"{name} {_digest(versions)}\n" for name, versions in sorted(wanted.items()))
    marker = stubs / MARKER
    if marker.exists() and marker.read_text() == signature and all((stubs / name).exists() for name in missing):
        return []
    stubs.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for name, versions in wanted.items():
        _stub(name, versions, stubs / name, work)
    marker.write_text(signature)
    return []


def _digest(versions):
    listing = sorted((version or "", name, is_object) for version, symbols in versions.items()
                     for name, is_object in symbols.items())
    return hashlib.sha256(repr(listing).encode()).hexdigest()


def _run(*argv):
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def _is_elf(path):
    with open(path, "rb") as handle:
        return handle.read(4) == b"\x7fELF"


def _ours(stubs):
    marker = stubs / MARKER
    return {line.split()[0] for line in marker.read_text().splitlines()} if marker.exists() else set()


def _library_folders(sysroot):
    return [sysroot / path for path in ("lib", "usr/lib", "lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu")
            if (sysroot / path).is_dir()]


def _needed(binary):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", _run(READELF, "-d", "-W", str(binary)))


def _symbols(binary):
    """(defined names, [(undefined name, its version or None, the library that version belongs to or None, is an
    object)]) of `binary`'s dynamic symbols; weak undefined ones are left out: the loader lets them stay unresolved."""
    defined, undefined, files = set(), [], _version_files(binary)
    for line in _run(READELF, "--dyn-syms", "-W", str(binary)).splitlines():
        fields = line.split()
        if len(fields) < 8 or not fields[0].endswith(":"):
            continue
        kind, bind, index, name = fields[3], fields[4], fields[6], fields[7]
        base, _, version = name.partition("@")
        if index == "UND":
            if bind != "WEAK" and base:
                version = version.lstrip("@") or None
                undefined.append((base, version, files.get(version), kind == "OBJECT"))
        elif bind in ("GLOBAL", "WEAK", "UNIQUE"):
            defined.add(base)
    return defined, undefined


def _version_files(binary):
    """{version name: the library `binary` needs it from}, from its version needs (".gnu.version_r")."""
    files, current = {}, None
    for line in _run(READELF, "-V", "-W", str(binary)).splitlines():
        if match := re.search(r"File: (\S+)", line):
            current = match[1]
        elif current and (match := re.search(r"Name: (\S+)", line)):
            files[match[1]] = current
    return files


def _stub_symbols(missing, binaries, sysroot, site):
    """{missing library: {version node or None: {symbol: is an object}}}: the symbols no present library defines,
    each in the stub of the library its version belongs to (torch's binaries name it), the unversioned ones (the
    driver API's, cuFile's, NCCL's, cuSPARSELt's) in every stub."""
    defined, undefined = set(), []
    providers = [path for path in site.rglob("*.so*") if path.is_file() and path.name not in missing
                 and _is_elf(path)]
    providers += [path for folder in _library_folders(sysroot) for path in folder.glob("*.so*")
                  if path.is_file() and not path.is_symlink() and _is_elf(path)]
    providers += [path for path in (sysroot / "usr/bin").glob("python3*") if path.is_file() and _is_elf(path)]
    importers = {path.resolve() for path in binaries}
    for path in {path.resolve() for path in providers} | importers:
        found, wanted = _symbols(path)
        defined |= found
        if path in importers:
            undefined += wanted
    stubs = {name: {} for name in missing}
    for name, version, owner, is_object in undefined:
        if name in defined or (version and owner not in stubs):  # another library's: not ours to make up
            continue
        for library in [owner] if version else missing:
            stubs[library].setdefault(version, {})[name] = is_object
    return stubs


def _stub(soname, versions, target, work):
    """An aarch64 shared library `target` named `soname` defining `versions`' symbols, assembled and linked."""
    source, obj, script = (work / f"{soname}.{ext}" for ext in ("s", "o", "map"))
    functions = sorted(name for symbols in versions.values() for name, is_object in symbols.items()
                       if not is_object and not MESSAGE_FUNCTION.search(name))
    messages = sorted(name for symbols in versions.values() for name, is_object in symbols.items()
                      if not is_object and MESSAGE_FUNCTION.search(name))
    objects = sorted(name for symbols in versions.values() for name, is_object in symbols.items() if is_object)
    lines = [".text", ".p2align 2"]
    for name in functions:
        lines += [f'.globl "{name}"', f'.type "{name}", %function', f'"{name}":']
    lines += [f"mov x0, #{ERROR_CODE}", "ret"]
    for name in messages:
        lines += [f'.globl "{name}"', f'.type "{name}", %function', f'"{name}":']
    lines += ["adrp x0, message", "add x0, x0, :lo12:message", "ret"]
    lines += [".section .rodata", "message:", f'.asciz "{soname} is a stub: no CUDA in this process"', ".bss",
              ".p2align 4"]
    for name in objects:  # data torch imports from a CUDA library: zeroed room
        lines += [f'.globl "{name}"', f'.type "{name}", %object', f'.size "{name}", 256', f'"{name}":', ".zero 256"]
    source.write_text("\n".join(lines) + "\n")
    nodes = sorted(version for version in versions if version)  # version nodes, as torch's binaries name them
    script.write_text("".join(f"{version} {{ global: {' '.join(map(_quoted, sorted(versions[version])))} }};\n"
                              for version in nodes))
    _run(ASSEMBLER, "-o", str(obj), str(source))
    argv = [LINKER, "-shared", "-soname", soname, "-o", str(target), str(obj)]
    _run(*argv, f"--version-script={script}") if nodes else _run(*argv)


def _quoted(name):
    return f'"{name}";'
