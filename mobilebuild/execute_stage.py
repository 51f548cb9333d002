"""The worker's side of running a node (worker.py): the stage function, made reproducible, with the outcome as
data: the build turns it into a task result (execute.py)."""

import contextlib
import importlib
import io
import os
import sys
import traceback
import warnings
from pathlib import Path

from mobilebuild import host_lock, progress
from mobilebuild.errors import MobileBuildError

# torch.ao.quantization and torch.jit print deprecation notices on every call; they say nothing about the user's
# recipe.
_QUIET = [(FutureWarning, r"torch(\..*)?"), (DeprecationWarning, r"torch(\..*)?"), (Warning, r"torch\.ao\..*"),
          (UserWarning, r"torch\._utils")]


# Stages that take the host lock themselves, for the measurement only (host_lock.py).
MEASURING = {"bench"}

_current_root = None


def enter_root(root):
    """Work in `root`, the repository (or a Dask worker's scratch copy of it): relative paths resolve there and
    recipe factories import from there. Modules imported from an earlier root are dropped, so that a long-lived
    worker never runs a stale copy of a factory."""
    global _current_root
    if root == _current_root:
        return
    if _current_root is not None:
        previous = os.path.join(_current_root, "")
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(previous):
                del sys.modules[name]
        with contextlib.suppress(ValueError):
            sys.path.remove(_current_root)
    os.chdir(root)
    sys.path.insert(0, root)
    _current_root = root


def run_stage(stage, inputs, config, output, root, task=None):
    """Run one stage function for `task` (the name progress notes go under), then make its output reproducible."""
    from mobilebuild import reproducible  # torch

    enter_root(root)
    with warnings.catch_warnings(), reproducible.jit_session(), progress.working_on(task):
        for category, module in _QUIET:
            warnings.filterwarnings("ignore", category=category, module=module)
        module = importlib.import_module(f"mobilebuild.stages.{stage}")
        module.run({role: Path(p) for role, p in inputs.items()}, config, Path(output))
    reproducible.normalize_archive(output, root)


def handle(request):
    """A request from the build -> its reply: empty, a user error, an OS error, or a crash's traceback, and
    what the stage printed, which the build prints as the task's output (doit may capture it, e.g. `-r json`)."""
    printed = io.StringIO()
    alongside = contextlib.nullcontext() if request["stage"] in MEASURING else host_lock.stage_running()
    with contextlib.redirect_stdout(printed), alongside:
        reply = _outcome(request)
    sys.stderr.flush()
    return {**reply, "printed": printed.getvalue()}


def _outcome(request):
    try:
        run_stage(**request)
        return {}
    except MobileBuildError as exc:
        return {"error": {"message": exc.message, "field": exc.field, "file": exc.file}}
    except OSError as exc:
        return {"oserror": {"errno": exc.errno, "strerror": exc.strerror, "filename": _text(exc.filename),
                            "text": str(exc)}}
    except Exception:  # noqa: BLE001 - any other failure is a bug of ours: its traceback goes back to the build
        return {"crash": traceback.format_exc()}


def _text(filename):
    return filename.decode(errors="replace") if isinstance(filename, bytes) else filename
