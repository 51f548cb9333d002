"""The model as the fuse stage leaves it, and what its structure says whatever the target: which layers feed which
activations (an FX trace), the layers a forward pass calls, widths that are not a multiple of 8, batch norm that
eager fusion did not see."""

import contextlib
import sys
from pathlib import Path

import torch
from torch import nn

from mobilebuild.plan.chain import model_source
from mobilebuild.preflight.advice import ALL_TARGETS, finding
from mobilebuild.worker import outputs
from mobilebuild.worker.stages import checkpoint, fuse, modeling

CHANNEL_MULTIPLE = 8


LAYERS = (nn.modules.conv._ConvNd, nn.Linear)
# Between a layer and its activation: folded away (batch norm) or nothing at inference.
TRANSPARENT_MODULES = (nn.modules.batchnorm._BatchNorm, nn.Identity, nn.modules.dropout._DropoutNd)
TRANSPARENT_CALLS = {"batch_norm", "dropout", "identity"}
LAYER_CALLS = {"conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "conv_transpose1d": "conv",
               "conv_transpose2d": "conv", "conv_transpose3d": "conv", "linear": "linear"}
ACTIVATION_MODULES = {nn.ReLU: "relu", nn.ReLU6: "relu6", nn.Hardtanh: "hardtanh", nn.Hardswish: "hardswish",
                      nn.Hardsigmoid: "hardsigmoid", nn.SiLU: "silu", nn.GELU: "gelu", nn.Sigmoid: "sigmoid",
                      nn.Tanh: "tanh", nn.LeakyReLU: "leaky_relu", nn.ELU: "elu", nn.Mish: "mish",
                      nn.PReLU: "prelu", nn.Softplus: "softplus", nn.SELU: "selu", nn.CELU: "celu"}
ACTIVATION_CALLS = {name: name for name in ACTIVATION_MODULES.values()}


def _module_activation(module):
    kind = ACTIVATION_MODULES.get(type(module))
    if kind is None:  # a subclass of one (ReLU6 is a Hardtanh: exact types first)
        kind = next((name for cls, name in ACTIVATION_MODULES.items() if isinstance(module, cls)), None)
    return kind


def _call_name(node):
    """'relu' for F.relu, torch.relu, x.relu() and x.relu_() alike."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    return name.rstrip("_") if isinstance(name, str) else ""


def _node_module(node, modules):
    return modules.get(node.target) if node.op == "call_module" else None


def _layer_kind(node, modules):
    module = _node_module(node, modules)
    if module is not None:
        return ("conv" if isinstance(module, nn.modules.conv._ConvNd) else "linear") if isinstance(module, LAYERS) \
            else None
    return LAYER_CALLS.get(_call_name(node)) if node.op in ("call_function", "call_method") else None


def _transparent(node, modules):
    module = _node_module(node, modules)
    if module is not None:
        return isinstance(module, TRANSPARENT_MODULES)
    return node.op in ("call_function", "call_method") and _call_name(node) in TRANSPARENT_CALLS


def _activation(node, modules):
    module = _node_module(node, modules)
    if module is not None:
        return _module_activation(module)
    return ACTIVATION_CALLS.get(_call_name(node)) if node.op in ("call_function", "call_method") else None


def _sole_user(node):
    return next(iter(node.users)) if len(node.users) == 1 else None


def layer_activations(model):
    """[(layer, "conv" | "linear", activation)]: each convolution or linear layer whose output goes straight (through
    batch norm, which fusion folds) into an activation. From an FX trace of forward; for a model FX cannot trace,
    from consecutive children of nn.Sequential containers, as the fuse stage does."""
    try:  # the graph alone: a GraphModule could not hold a child named `meta` (worker.capture_root)
        graph = torch.fx.Tracer().trace(model)
    except Exception:  # noqa: BLE001 - data-dependent control flow and the like: FX raises many types
        return _sequential_layer_activations(model)
    modules = dict(model.named_modules())
    pairs = []
    for node in graph.nodes:
        kind = _layer_kind(node, modules)
        if kind is None:
            continue
        follower = _sole_user(node)
        while follower is not None and _transparent(follower, modules):
            follower = _sole_user(follower)
        activation = _activation(follower, modules) if follower is not None else None
        if activation:
            pairs.append((node.target if node.op == "call_module" else node.name, kind, activation))
    return pairs


def _sequential_layer_activations(model):
    pairs = []
    for prefix, container in model.named_modules():
        if not isinstance(container, nn.Sequential):
            continue
        children = list(container.named_children())
        for index, (name, child) in enumerate(children):
            if not isinstance(child, LAYERS):
                continue
            after = index + 1
            while after < len(children) and isinstance(children[after][1], TRANSPARENT_MODULES):
                after += 1
            activation = _module_activation(children[after][1]) if after < len(children) else None
            if activation:
                kind = "conv" if isinstance(child, nn.modules.conv._ConvNd) else "linear"
                pairs.append((f"{prefix}.{name}" if prefix else name, kind, activation))
    return pairs


def executed_layers(model, specs):
    """The convolution and linear layers one forward pass calls, in the order it calls them, and whether the first
    one receives an NHWC tensor (a model may convert its own input, as the performance recipe's does). This is the
    checkpoint stage's input check, with hooks: a model that rejects the input is the recipe's `input.shape` at
    fault."""
    order, first_input = {}, []

    def called(name, args):
        order.setdefault(name)
        if not first_input and args and isinstance(args[0], torch.Tensor):
            first_input.append(args[0])

    handles = [module.register_forward_pre_hook(lambda _, args, name=name: called(name, args))
               for name, module in model.named_modules() if isinstance(module, LAYERS)]
    try:
        checkpoint.check_input(model, specs)
    finally:
        for handle in handles:
            handle.remove()
    nhwc = bool(first_input) and first_input[0].dim() == 4 and not first_input[0].is_contiguous() \
        and first_input[0].is_contiguous(memory_format=torch.channels_last)
    return list(order), nhwc


def width_findings(model, executed):
    """Layers whose width is not a multiple of 8. The last layer called is left out: its width is the task's (the
    classes, the outputs), not an architecture choice; so is the input's channel count."""
    modules = dict(model.named_modules())
    found = []
    for name in executed[:-1]:
        layer = modules[name]
        width = layer.out_channels if isinstance(layer, nn.modules.conv._ConvNd) else layer.out_features
        if width % CHANNEL_MULTIPLE:
            found.append(finding(
                ALL_TARGETS, "advice",
                f"{width} output channels, not a multiple of {CHANNEL_MULTIPLE}: XNNPACK, QNNPACK and GPU kernels work "
                f"on groups of 4 to 8 channels and pad the rest (the talk: make channels divisible by 8)",
                f"{name} ({type(layer).__name__})"))
    return found


CONV_KINDS = {"aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::linear"}


def unfolded_batch_norms(fused, specs):
    """Batch norm right after a convolution (or linear layer) that is still there after fusion: a pair eager fusion
    did not see (a module called twice, functional calls, a forward FX cannot trace outside nn.Sequential).
    Found in a TorchScript trace of the fused model; returns (findings, notes)."""
    try:
        with torch.no_grad():
            # strict=False: a dict or list output (a transformers model's) traces; only the graph's nodes are read
            traced = torch.jit.trace(fused, modeling.example_inputs(specs), check_trace=False, strict=False)
    except Exception as exc:  # noqa: BLE001 - tracing raises many types
        return [], [f"Conv-BN pairs not checked: torch.jit.trace fails on the model ({modeling.first_line(exc)})"]
    modules = dict(fused.named_modules())
    found = []
    for node in traced.inlined_graph.nodes():
        producer = node.inputsAt(0).node() if node.kind() == "aten::batch_norm" else None
        if producer is None or producer.kind() not in CONV_KINDS:
            continue
        layer, norm = modeling.traced_module_path(producer), modeling.traced_module_path(node)
        named = (isinstance(modules.get(layer), LAYERS)
                 and isinstance(modules.get(norm), nn.modules.batchnorm._BatchNorm))
        remedy = (f"list [{layer}, {norm}] in the recipe's `fuse`" if named else
                  "fold it in the model (torch.nn.utils.fusion.fuse_conv_bn_eval)")
        found.append(finding(
            ALL_TARGETS, "advice",
            "batch norm after a convolution that eager fusion did not see: it stays a separate pass (PyTorch Mobile "
            f"traced builds keep it unfolded, eager int8 quantizes it on its own); {remedy}",
            f"{norm or 'forward'} after {layer or 'forward'}"))
    return found, []


def describe_output(value):
    """The structure of a model's output as JSON: "tensor", {"tuple": [...]}, {"list": [...]}, {"dict": [[key,
    ...]]}, {"namedtuple": class name, "fields": [[field, ...]]}, or {"other": type name}."""
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, dict):
        return {"dict": [[str(key), describe_output(item)] for key, item in value.items()]}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {"namedtuple": type(value).__name__,
                "fields": [[field, describe_output(item)] for field, item in zip(value._fields, value)]}
    if isinstance(value, (tuple, list)):
        return {"list" if isinstance(value, list) else "tuple": list(map(describe_output, value))}
    return {"other": type(value).__name__}


def analyse(recipe_, root):
    """What the model's structure says whatever the target, as JSON: {"activations": [[layer, "conv" | "linear",
    activation]], "converts_to_nhwc": bool, "outputs": describe_output's structure, "output_names": the paths of its
    output tensors as verify names them (worker.outputs.leaves), "own_stubs": whether it has a QuantStub of its own,
    "findings": [...], "notes": [...]}. The recipe's model is built with random weights and fused as the fuse stage
    fuses it; a model that cannot be built raises MobileBuildError."""
    inputs = recipe_.inputs
    with importable(root):
        model = modeling.build_model(model_source(recipe_.model, inputs), recipe_.model["seed"])
        returned = []
        hook = model.register_forward_hook(lambda _module, _args, output: returned.append(output))
        try:
            executed, converts_to_nhwc = executed_layers(model, inputs)
        finally:
            hook.remove()
        activations = layer_activations(model)
        findings = width_findings(model, executed)
        own_stubs = any(isinstance(module, torch.ao.quantization.QuantStub) for module in model.modules())
        fused, _ = fuse.fuse(model, recipe_.fuse)
    batch_norms, notes = unfolded_batch_norms(fused, inputs)
    return {"activations": [list(pair) for pair in activations], "converts_to_nhwc": bool(converts_to_nhwc),
            "outputs": describe_output(returned[0]) if returned else None,
            "output_names": [name for name, _ in outputs.leaves(returned[0])] if returned else None,
            "own_stubs": own_stubs,
            "findings": findings + batch_norms, "notes": notes}


@contextlib.contextmanager
def importable(root):
    """Recipe factories name modules of the repository (as the stage worker, worker/serve.py, puts it on the path)."""
    entry = str(Path(root).resolve())
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added:
            sys.path.remove(entry)
