"""Versions that key every node's up-to-date check. Read from package metadata: importing torch costs ~2 s."""

import functools
import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from mobilebuild import __version__
from mobilebuild.errors import MobileBuildError

# Everything whose version can change an artifact's bytes.
TRACKED_DISTRIBUTIONS = ("torch", "torchvision", "executorch", "torchao", "coremltools", "onnx", "onnxscript",
                         "onnxruntime")


# Run by another interpreter (a target's `toolchain`): its Python and package versions, without importing torch.
_PROBE = """
import json, platform, sys
from importlib import metadata
found = {"python": platform.python_version()}
for dist in sys.argv[1:]:
    try:
        found[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        found[dist] = None
print(json.dumps(found))
"""


@functools.lru_cache(maxsize=None)
def versions(interpreter=None):
    """What keys every node's up-to-date check: this interpreter's versions, or those of the `toolchain`
    interpreter that runs the node."""
    if interpreter is None:
        found = {"python": platform.python_version()}
        for dist in TRACKED_DISTRIBUTIONS:
            try:
                found[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                found[dist] = None
    else:
        found = json.loads(subprocess.run([interpreter, "-c", _PROBE, *TRACKED_DISTRIBUTIONS], check=True,
                                          capture_output=True, text=True, timeout=60).stdout)
    return {**found, "mobilebuild": __version__, "stages_sha256": stage_code_digest()}


def interpreter(spec, recipe_file, root, field):
    """A target's `toolchain`: the Python interpreter it names (absolute, or relative to the recipe), checked to
    run; None for this interpreter."""
    if spec is None:
        return None
    path = Path(spec) if Path(spec).is_absolute() else Path(root, recipe_file).parent / spec
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise MobileBuildError(f"{spec} is not an executable Python interpreter", file=recipe_file, field=field)
    try:
        versions(str(path))
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
        raise MobileBuildError(f"{spec} does not run as a Python interpreter: {exc}", file=recipe_file,
                               field=field) from None
    return str(path)


def stage_code_digest():
    """The source of everything that shapes an artifact's bytes, so a development checkout rebuilds when it
    changes, not only on releases."""
    package = Path(__file__).parent
    digest = hashlib.sha256()
    # worker.py and execute_stage.py too: their frames sit in a traced model's debug info
    shaping = ["manifest.py", "reproducible.py", "execute_stage.py", "worker.py", "executorch_setup.py", "metrics.py",
               "timing.py"]
    for source in sorted([*package.glob("stages/*.py"), *package.glob("runtimes/*.py"),
                          *(package / name for name in shaping)]):
        if source.is_file():
            digest.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()
