"""Running one graph node: the stage function behind it, an atomic output, user errors as one line.

Imported by the task layer, so it must not import torch itself: stage modules are imported when a node runs.
"""

import contextlib
import importlib
import os
import shutil
import sys
import time
import warnings
from pathlib import Path

from doit.exceptions import TaskFailed

from mobilebuild import graph, store
from mobilebuild.errors import MobileBuildError

# Stages without tensors live outside mobilebuild.stages.
STAGE_MODULES = {"manifest": "mobilebuild.manifest"}

# torch.ao.quantization and torch.jit print deprecation notices on every call; they say nothing about the user's
# recipe.
_QUIET = [(FutureWarning, r"torch(\..*)?"), (DeprecationWarning, r"torch(\..*)?"), (Warning, r"torch\.ao\..*"),
          (UserWarning, r"torch\._utils")]


def stage_module(stage):
    return importlib.import_module(STAGE_MODULES.get(stage, f"mobilebuild.stages.{stage}"))


def run_node(node):
    """Build one node; return doit's TaskFailed (rendered as a single line) for a user mistake."""
    root = os.getcwd()
    if root not in sys.path:
        sys.path.insert(0, root)  # recipe factories name modules of the repository
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            for category, module in _QUIET:
                warnings.filterwarnings("ignore", category=category, module=module)
            module = stage_module(node.stage)
            with store.atomic_output(node.output) as tmp:
                # A stage returns a message when what it wrote is a bad result rather than a broken input
                # (a verification below threshold): the file is kept, and the task still fails.
                verdict = module.run({role: Path(p) for role, p in node.inputs.items()}, node.config, tmp)
    except MobileBuildError as exc:
        exc.field = recipe_field(exc.field, node.fields)
        return TaskFailed(str(exc.located(node.recipe_file)))
    except OSError as exc:  # a full disk, a file-size limit, a read-only artifacts folder: the machine, not the recipe
        return TaskFailed(_os_problem(exc, node.output))
    size = os.path.getsize(node.output)
    print(f"   {node.output} ({size / 1e6:.2f} MB, {time.perf_counter() - started:.1f} s)", flush=True)
    return TaskFailed(f"{node.recipe_file}: {verdict}") if verdict else None


def recipe_field(field, fields):
    """A stage names settings by their recipe-level field ("quantize.calibration.path"); a target's own settings
    sit under the target (see graph.Node.fields)."""
    for prefix in sorted(fields, key=len, reverse=True):
        if field and (field == prefix or field.startswith((f"{prefix}.", f"{prefix}["))):
            return fields[prefix] + field[len(prefix):]
    return field


def _os_problem(exc, output):
    """One line naming the file and the OS's reason. Writes go to a temporary file beside the output (or, through
    a file handle, name no file at all): either way the artifact is what could not be written."""
    name = Path(os.fsdecode(exc.filename)) if isinstance(exc.filename, (str, bytes)) and exc.filename else None
    output = Path(output)
    if name is None or name == output or name == output.parent or name.name.startswith(f".{output.name}"):
        return f"cannot write {output}: {exc.strerror or exc}"
    return f"{name}: {exc.strerror or exc}"


def clean_output(path):
    """doit clean: remove the artifact, leftovers of interrupted writes, and directories left empty."""
    path = Path(path)
    path.unlink(missing_ok=True)
    if path.parent.is_dir():
        store.remove_partials(path.parent)
    for directory in (path.parent, path.parent.parent):
        try:
            directory.rmdir()
        except OSError:
            break


def write_report():
    from mobilebuild import report  # matplotlib: only when a report is written

    report.main(graph.ARTIFACTS_DIR)


def clean_plots():
    plots = Path(graph.ARTIFACTS_DIR) / "plots"
    shutil.rmtree(plots, ignore_errors=True)
    with contextlib.suppress(OSError):
        plots.parent.rmdir()
