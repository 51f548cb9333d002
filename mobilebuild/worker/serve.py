"""The stage worker's side (`python -m mobilebuild.worker`, started by build/worker_pool.py): requests in, the
stage function run reproducibly, the outcome back as data, which the build turns into a task result
(build/execute.py)."""

import atexit
import contextlib
import importlib
import io
import json
import os
import signal
import sys
import traceback
import warnings
from pathlib import Path

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import stages
from mobilebuild.worker import failures, measure_alone, peak_rss, progress, quiet
from mobilebuild.worker.progress import STARTED

# torch.ao.quantization and torch.jit print deprecation notices on every call; they say nothing about the user's
# recipe.
_QUIET = [(FutureWarning, r"torch(\..*)?"), (DeprecationWarning, r"torch(\..*)?"), (Warning, r"torch\.ao\..*"),
          (UserWarning, r"torch\._utils"), (FutureWarning, r"transformers(\..*)?")]
# torch's own deprecations that Python attributes to another module: a deep copy of a pytree spec (torch.export's
# graphs hold them) builds its LeafSpec in copyreg, and LeafSpec's class warns on construction
_QUIET_MESSAGES = [(FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated")]


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


def run_stage(stage, inputs, config, output, root, task=None, module=None, config_type=None):
    """Run one stage function for `task` (the name progress notes go under), then make its output reproducible.
    `module` and `config_type` (a "module:Class") default to the built-in stage's (plan.stages)."""
    from mobilebuild.worker import reproducible  # torch

    enter_root(root)
    contract = stages.get(stage) if module is None or config_type is None else None
    settings = (_resolve(config_type) if config_type else contract.config)(**config)
    stage_module = module or contract.module_path
    with warnings.catch_warnings(), quiet.warnings_once(), reproducible.stage_session(), progress.working_on(task):
        for category, source in _QUIET:
            warnings.filterwarnings("ignore", category=category, module=source)
        for category, message in _QUIET_MESSAGES:
            warnings.filterwarnings("ignore", category=category, message=message)
        importlib.import_module(stage_module).run({role: Path(p) for role, p in inputs.items()}, settings, Path(output))
    reproducible.normalize_archive(output, root)


def _resolve(path):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def handle(request, started=None):
    """A request from the build -> its reply: empty, a user error, an OS error, a library's failure on the model
    (worker/failures.py), or a crash's traceback; and what the stage printed, which the build prints as the task's
    output (doit may capture it, e.g. `-r json`). `started()` is called as the stage starts, once no measurement
    holds it back: its time limit runs from then (engine/worker_pool.py). The reply says how long the stage waited
    for measurements, or its measurement for stages ("waited"), and the stage's peak resident memory
    ("peak_rss_mb", peak_rss.measured's)."""
    printed = io.StringIO()
    request = dict(request)
    measures = request.pop("measures", None)
    if measures is None:
        measures = stages.get(request["stage"]).measures
    alongside = (contextlib.nullcontext() if measures  # one that measures takes the host lock itself, to measure
                 else measure_alone.stage_running(request.get("task"), request.get("root")))
    with contextlib.redirect_stdout(printed), alongside:
        if started is not None:
            started()
        with peak_rss.measured() as memory:
            reply = _outcome(request)
    sys.stderr.flush()
    return {**reply, **memory, "printed": printed.getvalue(), "waited": measure_alone.take_waited()}


def _outcome(request):
    try:
        run_stage(**request)
        return {}
    except MobileBuildError as exc:
        return {"error": {"message": _user_text(exc.message), "field": exc.field, "file": exc.file}}
    except OSError as exc:
        return {"oserror": {"errno": exc.errno, "strerror": exc.strerror, "filename": _text(exc.filename),
                            "text": str(exc)}}
    except Exception as exc:  # noqa: BLE001 - a library failing on the model, else a bug of ours
        failure = failures.library_failure(exc, _first_line())
        if failure is not None:
            return {"failure": {**failure, "error": _user_text(failure["error"]),
                                "part": failure["part"] and _user_text(failure["part"])}}
        return {"crash": traceback.format_exc()}  # its traceback goes back to the build


def _first_line():
    """modeling.first_line (whole sentences, TorchScript's source pointer) where torch is loaded; None: the plain
    first line."""
    if "torch" not in sys.modules:
        return None
    from mobilebuild.worker.stages import modeling

    return modeling.first_line


def _user_text(text):
    """capture_root.user_text where torch is loaded (only a stage that loaded it captures a graph)."""
    if "torch" not in sys.modules:
        return text
    from mobilebuild.worker import capture_root

    return capture_root.user_text(text)


def _text(filename):
    return filename.decode(errors="replace") if isinstance(filename, bytes) else filename


def serve(reply_fd):
    """Run requests until stdin closes. The built-in route families are registered first, as in the build: the
    toolchain a stage records (bench's result) lists their packages in every worker, not only in one that happened
    to resolve a family's settings type before."""
    import mobilebuild.routes  # noqa: F401 - their plan halves: no torch

    _die_with_parent()
    with os.fdopen(reply_fd, "w") as replies:
        def started():
            replies.write(STARTED + "\n")
            replies.flush()

        for line in sys.stdin:
            reply = handle(json.loads(line), started)
            replies.write(json.dumps(reply) + "\n")
            replies.flush()


def _die_with_parent():
    """A killed build must not leave its worker writing on: Linux delivers SIGKILL when the parent dies."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:
        sys.exit(0)


def exit_now():
    """End the worker without the interpreter's teardown: torch's takes 0.7 s (module and native destructors), and
    every build waited for it at its end. What was registered to run at exit still runs (coremltools removes its
    temporary model packages then)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
