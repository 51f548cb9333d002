"""Versions that key every node's up-to-date check. Read from package metadata: importing torch costs ~2 s."""

import functools
import hashlib
import json
import os
import subprocess
from pathlib import Path

from mobilebuild import __version__, probe
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import routes

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # where another interpreter finds mobilebuild.probe


@functools.lru_cache(maxsize=None)
def versions(interpreter=None, packages=None):
    """The toolchain: this interpreter's versions, or those of the `toolchain` interpreter that runs a node. Given
    `packages` (a node's own: its route's and the library of models it builds with, Node.packages), only torch's,
    torchvision's and theirs among routes.distributions(): what keys a node's up-to-date check, so that registering
    or upgrading another route family or library rebuilds none of its nodes.
    Cached: one dict per combination (engine/uptodate.py encodes each once)."""
    found = installed(interpreter)
    if packages is not None:
        dropped = set(routes.distributions()) - {"torch", "torchvision", *packages}
        found = {name: version for name, version in found.items() if name not in dropped}
    return {**found, "mobilebuild": __version__, "stages_sha256": stage_code_digest()}


@functools.lru_cache(maxsize=None)
def installed(interpreter=None):
    """{"python", each of routes.distributions(): its version, or None where it is not installed}, as this
    interpreter or a target's `toolchain` interpreter has them."""
    return probe.facts(routes.distributions()) if interpreter is None else probe_interpreter(interpreter)


def probe_interpreter(interpreter, gpu_ops=None):
    """mobilebuild.probe's facts, as another interpreter (a target's `toolchain`) has them."""
    request = json.dumps({"distributions": routes.distributions(), "gpu_ops": gpu_ops})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([interpreter, "-m", "mobilebuild.probe", request], check=True, capture_output=True,
                            text=True, timeout=120, env=env)
    return json.loads(result.stdout.strip().splitlines()[-1])


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


# Everything that runs in a stage, and so shapes an artifact's bytes or a result: the stages, the runtimes that
# verify and time artifacts, and what serves them (its frames sit in a traced model's debug info): the worker side
# every family shares, and each family's worker half
PACKAGE = Path(__file__).parents[1]


def worker_sources():
    return sorted([*(PACKAGE / "worker").rglob("*.py"), *(PACKAGE / "routes").glob("*/worker/**/*.py")])


@functools.lru_cache(maxsize=None)
def stage_code_digest():
    """The source of the worker side, so a development checkout rebuilds when it changes, not only on releases."""
    digest = hashlib.sha256()
    for source in worker_sources():
        digest.update(source.relative_to(PACKAGE).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()
