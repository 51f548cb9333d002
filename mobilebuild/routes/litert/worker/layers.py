"""litert: the shipped int8 .tflite against the float model, tensor by tensor. LiteRT's interpreter keeps every
intermediate tensor readable after a run (`experimental_preserve_all_tensors`); each int8 tensor an operator writes
is dequantized with its scale and zero point and compared with the float model's output of the module the converter
named it after.

Names: litert-torch names a tensor after the module stack it came from, each module as `<its class>_<its attribute>`
under the root's class ("pkg.Net/torch.nn.modules.conv.Conv2d_conv1;2"); a fused operator's output carries each
fused module's location, the last one's first ("...ReLU_1;;...Conv2d_0;1"). Those map back to module paths here by
building the same strings from the float model's modules; a tensor whose location is no module's (an operation the
model's own forward runs, a tensor the converter made) is counted as unmapped, by operator, never guessed. Where a
module wrote several tensors, its last one (in the interpreter's order) is its output; a model output, which the
signature names, is the module's that its operator's weights are named after; a QUANTIZE after an operator LiteRT
computed in float (a squeeze-excitation's Hardsigmoid) gives that module's output.

Unlike the shadow comparisons of the other routes, the interpreter cannot run one operator on the float model's
inputs: each tensor carries the error of the layers before it too (the method's detail says so), so read the ranking
as where the error grows.
"""

import collections

import torch
from torch.ao.nn.intrinsic import _FusedModule

from mobilebuild.routes.litert.worker import runtime
from mobilebuild.worker import capture_root
from mobilebuild.worker.layers.common import Errors
from mobilebuild.worker.stages import fuse

DETAIL = ("each int8 tensor of the shipped model (LiteRT's interpreter, all tensors preserved) against the float "
          "model's output of the module the converter named it after; cumulative: a tensor carries the error of the "
          "layers before it")


def locations(model):
    """The converter's module location string -> (module path, class name), for every module of `model`. A module
    inside a fused one (the Conv2d of a ConvReLU2d) stands for the fused module: the converter names the fused
    operator's output after the inner module, and that output is the fused module's."""
    root = f"{type(model).__module__}.{type(model).__qualname__}"
    found, scope = {root: ("", type(model).__name__)}, {"": root}
    modules = dict(model.named_modules())
    for path, module in modules.items():
        if not path:
            continue
        parent, _, attribute = path.rpartition(".")
        scope[path] = f"{scope[parent]}/{type(module).__module__}.{type(module).__qualname__}_{attribute}"
        owner = parent if isinstance(modules[parent], _FusedModule) else path
        found[scope[path]] = (owner, type(modules[owner]).__name__)
    return found


def module_of(tensor_name, known):
    """(module path, class) of a tensor's first location, or None where it names no module."""
    first = tensor_name.split(";;")[0].rsplit(";", 1)[0]
    return known.get(first)


def layers(model):
    """The module paths a tensor is compared at: modules with no module inside, and fused modules."""
    return {path for path, module in model.named_modules()
            if path and (isinstance(module, _FusedModule) or not any(module.children()))}


def compare(inputs, config, chunks):
    """The layers hook (see mobilebuild.worker.stages.layers)."""
    model = capture_root.nested(fuse.load(inputs["model"], config).eval(), len(chunks[0]))
    known = locations(model)
    leaves = layers(model)
    found = runtime.interpreter(inputs["artifact"], preserve=True)
    details = {detail["index"]: detail for detail in found.get_tensor_details()}
    last = {}  # module path -> (class, the last int8 tensor an operator wrote for it)
    unmapped = collections.Counter()  # operator kind -> its int8 outputs that map to no module
    for op in found._get_ops_details():  # the interpreter's execution order
        for index in op["outputs"]:
            detail = details.get(index)
            if detail is None or detail["dtype"] not in runtime.INTEGER_IO or not detail["quantization"][0]:
                continue
            place = next(filter(None, (module_of(name, known) for name in _names(op, detail, details))), None)
            if place is None:
                unmapped[op["op_name"]] += 1
            elif place[0] in leaves:
                last[place[0]] = (place[1], detail)
    floats = {}
    # a copy: an in-place activation after the module (torchvision's Hardswish(inplace=True) after a Conv2d)
    # overwrites the very tensor the module returned
    hooks = [module.register_forward_hook(lambda _m, _i, out, path=path: floats.__setitem__(path, _copy(out)))
             for path, module in model.named_modules() if path in last]
    model_inputs = found.get_input_details()
    errors = Errors()
    try:
        for chunk in chunks:
            with torch.no_grad():
                model(*chunk)
            for detail, tensor in zip(model_inputs, chunk, strict=True):
                found.set_tensor(detail["index"], runtime.to_model(tensor, detail))
            found.invoke()
            for path, (kind, detail) in last.items():
                reference = floats.get(path)
                if not isinstance(reference, torch.Tensor):
                    continue
                output = runtime.from_model(found.get_tensor(detail["index"]), detail)
                errors.add(path, kind, in_layout(reference, output), output)
    finally:
        for hook in hooks:
            hook.remove()
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(unmapped.items()))
    detail = DETAIL + (f"; {unmapped.total()} int8 tensor(s) whose converter names map to no module, not compared "
                       f"(written by {kinds})" if unmapped else "")
    return errors, "litert", detail


def _names(op, detail, details):
    """The names that may say which module an operator's int8 output belongs to: its own; for a QUANTIZE, its float
    input's (the converter names it `...Wrapper;n`, its input after the module that computed it in float); for an
    output the signature renamed ("serving_default_output_0_output"), its weights' (the inputs after the first)."""
    inputs = op["inputs"][:1] if op["op_name"] == "QUANTIZE" else op["inputs"][1:]
    return (detail["name"], *(details[i]["name"] for i in inputs if i in details))


def _copy(value):
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def in_layout(reference, output):
    """The float output in the tensor's layout: the converter computes 4-D tensors channels-last (NHWC) between the
    transposes it puts at the model's edges (a 4x4x4 map looks the same either way: the layout decides)."""
    if reference.dim() == 4 and list(output.shape) == list(reference.permute(0, 2, 3, 1).shape):
        return reference.permute(0, 2, 3, 1)
    return reference

