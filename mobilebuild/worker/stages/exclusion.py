"""quantize.exclude: the modules an int8 artifact keeps in float. A helper of the stages that quantize (quantize,
lower, onnx, litert), not a stage: it has no `run`.

The recipe's entries are resolved here, once, to the paths of the fused model's modules (`resolve`); each route
then keeps those modules float its own way: eager mode wraps each one between a DeQuantStub and a QuantStub
(`islands`), FX graph mode and PT2E get a module-name setting of None, ONNX Runtime the names of the nodes the
exporter made for them (the ONNX family's `export.excluded_nodes`).

Grammar (recipe.schema.json): an entry that is a module path of the model (`features.3`, `broken.0`) names that
module and all it holds; any other entry whose last dotted part starts with an upper-case letter names a class,
bare (`Hardswish`: every module whose class has that name) or importable (`torch.nn.Hardswish`: every module of
exactly that class). A module fused into another (the Conv2d inside a ConvReLU2d) keeps the fused module float, and
so does a module folded into another (a batch norm into the convolution before it).
"""

import difflib
import importlib

import torch
from torch import nn
from torch.ao import quantization as tq
from torch.ao.nn.intrinsic import _FusedModule

from mobilebuild.errors import MobileBuildError, few
from mobilebuild.worker import capture_root
from mobilebuild.worker.stages import fuse

FIELD = "quantize.exclude"


def is_class(entry):
    return entry.rsplit(".", 1)[-1][:1].isupper()


def _imported(entry):
    module, _, name = entry.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, None) if module else None
    except Exception:  # not importable: it can still match by the class's own dotted name
        return None


def _class_matches(module, entry, imported):
    kind = type(module)
    if "." not in entry:
        return kind.__name__ == entry
    return kind is imported or f"{kind.__module__}.{kind.__qualname__}" == entry


def resolve(model, entries, field=FIELD):
    """The paths of the modules `entries` (quantize.exclude) keep in float: a path inside a fused module, or of one
    folded into another (fuse.merged_into), becomes the fused module's, and only the outermost of nested paths is
    kept (it holds the others). Entries that match nothing are one error naming some of the model's modules."""
    if not entries:
        return []
    if isinstance(model, capture_root.Nested):  # the model's own paths, as the graph captured from the root names them
        return capture_root.paths(model, resolve(model.get_submodule(capture_root.ROOT), entries, field))
    modules = {path: module for path, module in model.named_modules() if path}
    found, unknown = set(), []
    for entry in entries:
        if entry in modules:
            found.add(entry)
            continue
        imported = _imported(entry) if is_class(entry) and "." in entry else None
        matches = [path for path, module in modules.items() if is_class(entry)
                   and _class_matches(module, entry, imported)]
        if not matches:
            unknown.append(entry)
        found.update(matches)
    if unknown:
        raise MobileBuildError(_unknown_message(unknown, modules), field=field)
    merged = fuse.merged_into(model)
    lifted = {_outside_fusion(merged.get(path, path), modules) for path in found}
    return sorted(path for path in lifted if not any(path.startswith(other + ".") for other in lifted))


def _unknown_message(unknown, modules):
    names = [entry for entry in unknown if not is_class(entry)]
    classes = [entry for entry in unknown if is_class(entry)]
    parts = []
    if names:
        near = [match for entry in names for match in difflib.get_close_matches(entry, modules, n=3, cutoff=0.6)]
        shown = list(dict.fromkeys(near + list(modules)))
        parts.append(f"no module named {', '.join(map(repr, names))} in the model (its modules: {few(shown)})")
    if classes:
        kinds = list(dict.fromkeys(type(module).__name__ for module in modules.values()))
        parts.append(f"no module of class {', '.join(map(repr, classes))} in the model (its classes: "
                     f"{few(kinds, limit=5)})")
    return "; ".join(parts)


def _outside_fusion(path, modules):
    """`path`, or the outermost fused module that holds it."""
    parts = path.split(".")
    for end in range(1, len(parts)):
        if isinstance(modules.get(".".join(parts[:end])), _FusedModule):
            return ".".join(parts[:end])
    return path


# --- eager mode ----------------------------------------------------------------------------------------------------

class FloatIsland(nn.Module):
    """An excluded module between a DeQuantStub and a QuantStub: how eager mode runs one module in float inside a
    quantized model (its own qconfig None keeps it unobserved and unconverted; the QuantStub after it is observed and
    requantizes its output for the quantized module that follows). With `requantize` false its output stays float:
    for a module whose output goes straight to the model's DeQuantStub, which passes a float tensor through."""

    def __init__(self, module, requantize=True):
        super().__init__()
        self.dequant = tq.DeQuantStub()
        self.module = module
        self.quant = tq.QuantStub() if requantize else nn.Identity()
        module.qconfig = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant(self.module(self.dequant(x)))


def islands(model, paths, whole=None, example=()):
    """`model` with each module at `paths` in a FloatIsland, in place (the paths are resolve's: disjoint). `whole`
    (the model with its stubs, run on `example`) shows which of them end the model: their output is not requantized,
    since the DeQuantStub after them would take the int8 step straight back (MobileNetV2's classifier kept float
    still lost top-1 agreement to it: 0.06, against 0.95 on ExecuTorch, whose float output stays float)."""
    last = _ending(whole, paths, example) if whole is not None and paths else set()
    for path in paths:
        parent, _, name = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, name, FloatIsland(getattr(owner, name), requantize=path not in last))
    return model


def _ending(whole, paths, example):
    """The paths (relative to the model inside `whole`, or to `whole` itself) whose every call is followed by a
    DeQuantStub's, in the order modules finish (the leaves, and the excluded modules as one): modules whose output
    leaves the model."""
    order, handles = [], []
    for name, module in whole.named_modules():
        path = name.removeprefix("module.") if isinstance(whole, tq.QuantWrapper) else name
        inside = any(path.startswith(other + ".") for other in paths)
        if path in paths or (not inside and not any(module.children())):
            key = path if path in paths else "dequant" if isinstance(module, tq.DeQuantStub) else None
            handles.append(module.register_forward_hook(lambda *_, key=key: order.append(key)))
    try:
        with torch.no_grad():
            whole(*example)
    finally:
        for handle in handles:
            handle.remove()
    calls = list(zip(order, order[1:] + [None]))
    return {path for path in paths if any(key == path for key, _ in calls)
            and all(following == "dequant" for key, following in calls if key == path)}
