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
        return TaskFailed(str(exc.located(node.recipe_file)))
    size = os.path.getsize(node.output)
    print(f"   {node.output} ({size / 1e6:.2f} MB, {time.perf_counter() - started:.1f} s)", flush=True)
    return TaskFailed(f"{node.recipe_file}: {verdict}") if verdict else None


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
