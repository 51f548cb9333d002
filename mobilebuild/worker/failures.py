"""A stage's unexpected exception, told apart: a library failing on the model, or a bug of mobilebuild's.

Where the exception was raised decides, not its type (torch raises AssertionError, RuntimeError, TypeError... for a
model it cannot handle): the innermost frame of its traceback that is neither the standard library nor generated code
(`<eval_with_key>`, `<frozen ...>`). Inside the mobilebuild package, it is ours, and its traceback is for us. Anywhere
else it was raised by code mobilebuild called on the user's behalf: a library (torch, torchvision, executorch, onnx,
onnxruntime, timm, transformers...: a folder of site-packages, named by its top-level package), or the model's own code
(a factory's module in the repository). Then the user gets one line (the library, the model part it was working on
where its frames say, its own first line) and the traceback goes to a log (engine/execute.py writes it).

A wrong call of ours into a library (a bad keyword, a missing attribute) fails in our own frame, before the library
runs, so it stays a bug; an error a native kernel raises straight into our frame (a tensor method we call) is counted
as ours too: only what fails inside the library's own code is the library's. No torch import here: the engine uses
this for the stages it runs in its own process.
"""

import sys
import sysconfig
import traceback
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # the mobilebuild package
_STANDARD = {Path(sysconfig.get_paths()[name]).resolve() for name in ("stdlib", "platstdlib")}
_INSTALLED = ("site-packages", "dist-packages")


def raised_by(exc):
    """Who raised `exc`: None for mobilebuild itself, else the library's top-level package name ("torch"), or the
    path of the model's own file (relative to the working directory, the repository, where it lies inside it)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        owner = _owner(frame.filename)
        if owner is not _SKIPPED:
            return owner
    return None


_SKIPPED = object()


def _owner(filename):
    if not filename or filename.startswith("<"):  # generated code: FX's forward, frozen importlib, exec'd strings
        return _SKIPPED
    path = Path(filename).resolve()
    if path.is_relative_to(PACKAGE):
        return None
    parts = path.parts
    for marker in _INSTALLED:
        if marker in parts:
            below = parts[parts.index(marker) + 1:]
            return Path(below[0]).stem if below else marker
    if any(path.is_relative_to(folder) for folder in _STANDARD):
        return _SKIPPED
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


class Failed(Exception):
    """A library's failure that the code calling it already knows for one (across a process boundary, where no frame
    of the library's is in this process): `failure` is library_failure's record of it."""

    def __init__(self, failure):
        super().__init__(failure["error"])
        self.failure = failure


def library_failure(exc, first_line=None):
    """The reply for a stage whose exception a library (or the model's code) raised: {"raised_by", "error" (its type
    and first line), "part" (the model's module it was working on, or None), "traceback"}; None for a bug of ours.
    `first_line(exc)` shortens the message (default: its first line that says something)."""
    if isinstance(exc, Failed):
        return exc.failure
    owner = raised_by(exc)
    if owner is None:
        return None
    line = (first_line or _first_line)(exc)
    return {"raised_by": owner, "error": f"{type(exc).__name__}: {line}" if line else type(exc).__name__,
            "part": model_part(exc.__traceback__), "traceback": "".join(traceback.format_exception(exc))}


def _first_line(exc):
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")


def model_part(tb):
    """"path (Class)" of the model's module the failing frames were working on, where their local variables hold
    modules: from the innermost frame that holds one out, the smallest module that a larger one held by the frames
    contains, named by its path in the largest of them; None where no frame holds a module, or only whole models (or
    modules of no model, like an observer a quantized module's constructor makes). Quantization's observers are
    machinery, never the part: one that prepare attached to a convolution names the convolution."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    module_type = torch.nn.Module
    frames = [[value for value in frame.f_locals.values() if isinstance(value, module_type)]
              for frame, _ in traceback.walk_tb(tb)]
    frames = [found for found in frames if found]
    try:
        held = sorted({id(module): module for found in frames for module in found}.values(), key=_size, reverse=True)
        names = {}
        for holder in held:  # the largest first: its paths are the fullest
            for name, module in holder.named_modules():
                if name:
                    names.setdefault(id(module), name)
        for found in reversed(frames):
            for module in sorted(found, key=_size):
                if id(module) in names and not _machinery(module):
                    return f"{names[id(module)]} ({type(module).__name__})"
    except Exception:  # noqa: BLE001 - a module broken enough to fail while listed: the part stays unknown
        return None
    return None


def _machinery(module):
    """An observer or fake quantizer (torch.ao's, torchao's): what quantization hangs on a model's modules."""
    return type(module).__module__.rsplit(".", 1)[-1] in ("observer", "fake_quantize")


def _size(module):
    return sum(1 for _ in module.modules())
