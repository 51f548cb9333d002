"""Versions that key every node's up-to-date check. Read from package metadata: importing torch costs ~2 s."""

import functools
import hashlib
import platform
from importlib import metadata
from pathlib import Path

from mobilebuild import __version__

TRACKED_DISTRIBUTIONS = ("torch", "torchvision")


@functools.lru_cache(maxsize=None)
def versions():
    found = {"python": platform.python_version(), "mobilebuild": __version__}
    for dist in TRACKED_DISTRIBUTIONS:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    found["stages_sha256"] = stage_code_digest()
    return found


def stage_code_digest():
    """The stages' source, so a development checkout rebuilds when stage code changes, not only on releases."""
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for source in sorted([*package.glob("stages/*.py"), package / "manifest.py"]):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()
