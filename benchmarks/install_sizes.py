"""What the core install of mobilebuild and each of its extras put into a Python environment: the distributions
(each with what it requires, transitively, as pip resolved it here) and their size on disk, summed from the installed
files' sizes in each distribution's RECORD. Run in an environment with every extra installed (`pip install -e
'.[all]'`); an extra's row counts what it adds to the core install:

    python benchmarks/install_sizes.py

Prints a Markdown table; docs/install.md holds one run's.
"""

import platform
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

EXTRAS = ("executorch", "onnx", "litert", "ncnn", "hub", "dask", "all")


def requirements(name, extras=()):
    """What distribution `name` requires, with `extras` of its own, on this platform: [(name, its extras)]."""
    found = []
    for line in metadata.requires(name) or []:
        requirement = Requirement(line)
        wanted = requirement.marker is None or any(
            requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras))
        if wanted:
            found.append((requirement.name, tuple(requirement.extras)))
    return found


def closure(name, extras=()):
    """Every distribution installed here that `name` (with `extras`) brings, itself included."""
    seen, pending = {}, [(name, tuple(extras))]
    while pending:
        current, wanted = pending.pop()
        key = canonicalize_name(current)
        if set(wanted) <= seen.get(key, set()) and key in seen:
            continue
        try:
            metadata.distribution(current)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform, or an optional one left out
        seen[key] = seen.get(key, set()) | set(wanted)
        pending += requirements(current, wanted)
    return set(seen)


def size(name):
    """Bytes of the distribution's installed files (its RECORD's sizes)."""
    return sum(path.size or 0 for path in metadata.distribution(name).files or [])


def mb(names):
    return sum(size(name) for name in names) / 1e6


def main():
    core = closure("mobilebuild")
    rows = [("core (`pip install -e .`)", core, mb(core))]
    for extra in EXTRAS:
        added = closure("mobilebuild", (extra,)) - core
        rows.append((f"`[{extra}]` adds", added, mb(added)))
    torch = closure("torch") - {canonicalize_name("mobilebuild")}
    print(f"Python {platform.python_version()} on {platform.machine()} ({sys.platform}), torch "
          f"{metadata.version('torch')} as pip installed it here: {mb(torch):,.0f} MB with what it requires.\n")
    print("| install | distributions | MB on disk | the largest |")
    print("|---|---:|---:|---|")
    for label, names, megabytes in rows:
        largest = sorted(names, key=size, reverse=True)[:3]
        print(f"| {label} | {len(names)} | {megabytes:,.0f} | "
              f"{', '.join(f'{name} {size(name) / 1e6:,.0f}' for name in largest)} |")


if __name__ == "__main__":
    main()
