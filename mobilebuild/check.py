"""`mobilebuild check RECIPE`: a compatibility pre-flight, before any build.

The recipe's model is built with random weights (no checkpoint, no training: which operations a target takes does
not depend on the values) and fused as the fuse stage fuses it. Then each target's own toolchain is asked, in
memory, what it would make of it:

- NNAPI: the node kinds torch.backends._nnapi has no converter for (`nnapi.unsupported_ops`), then the conversion
  itself, which refuses some arguments of kinds it knows; on the float model (mode none) or on the quantized one
  (modes core and full, quantized on the example input);
- ExecuTorch (XNNPACK, Vulkan, Core ML, MPS): the model lowered as the lower stage lowers it; the operators left
  outside the delegate run on ExecuTorch's portable CPU kernels (`lower.preflight_delegation`);
- PyTorch Mobile: whether this torch can run optimize_for_mobile for the backend at all (XNNPACK compiled in; the
  Vulkan or Metal export ops, `optimize.check_gpu_export`), and for int8 whether every operation of the quantized
  model has a quantized kernel (`quantize.check_runs`);
- ONNX: whether torch.onnx.export takes the float model (`export.export_float`).

Then the edge-deployment talk's and the performance recipe's architecture advice, where it applies: widths that are
not a multiple of 8, activations the target cannot fuse into the convolution or linear layer before them, an NCHW
input for XNNPACK through PyTorch Mobile, batch norm after a convolution that eager fusion did not see.

A finding is {target, kind, detail, where}; kinds "unsupported-op", "fallback" and "needs-build" block (exit code
1), "advice" does not (exit code 0). Findings about the model whatever the target have target "*".
"""

import argparse
import contextlib
import copy
import json
import re
import subprocess
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path

import torch
import torch.backends.xnnpack
from torch import nn

from mobilebuild import backends, host_lock, recipe, toolchain
from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.stages import checkpoint, export, fuse, lower, modeling, nnapi, optimize, quantize

KINDS = ("unsupported-op", "fallback", "needs-build", "advice")
BLOCKING = frozenset(KINDS[:3])
ALL_TARGETS = "*"
CHANNEL_MULTIPLE = 8
SHOWN_PLACES = 4  # layers named in one finding before "and N more"
VERSIONS = ("torch", "executorch", "onnxruntime")

# --- findings ------------------------------------------------------------------------------------------------


def finding(target, kind, detail, where):
    assert kind in KINDS, kind
    return {"target": target, "kind": kind, "detail": detail, "where": where}


def _places(names):
    shown = ", ".join(names[:SHOWN_PLACES])
    return shown + (f" and {len(names) - SHOWN_PLACES} more" if len(names) > SHOWN_PLACES else "")


# --- the model's structure -----------------------------------------------------------------------------------

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
DISPLAY = {"relu": "ReLU", "relu6": "ReLU6", "hardtanh": "Hardtanh", "hardswish": "Hardswish",
           "hardsigmoid": "Hardsigmoid", "silu": "SiLU", "gelu": "GELU", "sigmoid": "Sigmoid", "tanh": "Tanh",
           "leaky_relu": "LeakyReLU", "elu": "ELU", "mish": "Mish", "prelu": "PReLU", "softplus": "Softplus",
           "selu": "SELU", "celu": "CELU"}


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
    try:
        graph_module = torch.fx.symbolic_trace(model)
    except Exception:  # noqa: BLE001 - data-dependent control flow and the like: FX raises many types
        return _sequential_layer_activations(model)
    modules = dict(graph_module.named_modules())
    pairs = []
    for node in graph_module.graph.nodes:
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


def executed_layers(model, input_config):
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
        checkpoint.check_input(model, input_config)
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


def _scope(node):
    """'__module.features/__module.features.0' -> 'features.0' (the innermost module of a traced node)."""
    return node.scopeName().rsplit("/", 1)[-1].removeprefix("__module").removeprefix(".")


def unfolded_batch_norms(fused, input_config):
    """Batch norm right after a convolution (or linear layer) that is still there after fusion: a pair eager fusion
    did not see (a module called twice, functional calls, a forward FX cannot trace outside nn.Sequential).
    Found in a TorchScript trace of the fused model; returns (findings, notes)."""
    try:
        with torch.no_grad():
            traced = torch.jit.trace(fused, modeling.example_input(input_config), check_trace=False)
    except Exception as exc:  # noqa: BLE001 - tracing raises many types
        return [], [f"Conv-BN pairs not checked: torch.jit.trace fails on the model ({modeling.first_line(exc)})"]
    modules = dict(fused.named_modules())
    found = []
    for node in traced.inlined_graph.nodes():
        producer = node.inputsAt(0).node() if node.kind() == "aten::batch_norm" else None
        if producer is None or producer.kind() not in CONV_KINDS:
            continue
        layer, norm = _scope(producer), _scope(node)
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


class Model:
    """The recipe's model as the fuse stage leaves it, and what its structure says."""

    def __init__(self, recipe_, root):
        self.input = recipe_.input
        with _importable(root):
            model = modeling.build_model(recipe_.model, recipe_.model["seed"])
            executed, self.converts_to_nhwc = executed_layers(model, self.input)
            self.activations = layer_activations(model)
            self.findings = width_findings(model, executed)
            self.fused, _ = fuse.fuse(model, recipe_.fuse)
        batch_norms, self.notes = unfolded_batch_norms(self.fused, self.input)
        self.findings += batch_norms
        self._quantized = {}

    def float_copy(self):
        return copy.deepcopy(self.fused)

    def quantized(self, engine, settings):
        """The fused model quantized as the quantize stage does, calibrated on the example input alone (which
        operations it holds does not depend on the ranges); a copy each time, as callers modify it."""
        key = (engine, settings["mode"], settings.get("weights"))
        if key not in self._quantized:
            model = self.float_copy()
            if settings["mode"] == "dynamic":
                self._quantized[key] = quantize.dynamic(model, engine, settings.get("weights"))
            else:  # QAT converts to the same quantized modules as static quantization
                self._quantized[key] = quantize.static(model, engine, [modeling.example_input(self.input)],
                                                       settings.get("weights"))
        return copy.deepcopy(self._quantized[key])


@contextlib.contextmanager
def _importable(root):
    """Recipe factories name modules of the repository (as execute_stage puts it on the path)."""
    entry = str(Path(root).resolve())
    added = entry not in sys.path
    if added:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if added:
            sys.path.remove(entry)


# --- activations each target fuses ------------------------------------------------------------------------------

CLAMPS = frozenset({"relu", "relu6", "hardtanh"})
# key -> ({layer kind: activations fused into it}, who fuses). A layer kind left out: no claim either way.
FUSION = {
    "xnnpack/pytorch-mobile": ({"conv": CLAMPS, "linear": CLAMPS}, (
        "optimize_for_mobile folds only ReLU and ReLU6/Hardtanh clamps into XNNPACK's prepacked convolution and "
        "linear ops")),
    "vulkan/pytorch-mobile": ({"conv": CLAMPS}, (
        "optimize_for_mobile(backend='vulkan') folds only ReLU and ReLU6/Hardtanh clamps into its convolutions")),
    "metal/pytorch-mobile": ({"conv": CLAMPS}, (
        "optimize_for_mobile(backend='metal') folds only ReLU and ReLU6/Hardtanh clamps into its convolutions")),
    "qnnpack/pytorch-mobile": ({"conv": {"relu"}, "linear": {"relu"}},
                               "eager quantization fuses only Conv/Linear + ReLU (fuse_modules)"),
    "nnapi/pytorch-mobile": ({"conv": {"relu"}, "linear": set()}, (
        "the NNAPI converter fuses only ReLU, into quantized convolutions (conv2d_relu); ReLU6 and the rest are "
        "NNAPI operations of their own")),
    "executorch/xnnpack": ({"conv": CLAMPS, "linear": CLAMPS}, (
        "ExecuTorch's XNNPACK delegate fuses only ReLU and ReLU6/Hardtanh clamps into the op before them")),
    "executorch/vulkan": ({"conv": CLAMPS}, (
        "ExecuTorch's Vulkan delegate fuses only ReLU and ReLU6/Hardtanh clamps into convolutions (conv_with_clamp)")),
}


def activation_findings(target_id, fusion_key, activations):
    """One finding per activation kind that follows layers the target cannot fuse it into."""
    if fusion_key not in FUSION:
        return []
    fused_into, who = FUSION[fusion_key]
    unfused = {}
    for layer, kind, activation in activations:
        if kind in fused_into and activation not in fused_into[kind]:
            unfused.setdefault(activation, []).append(layer)
    return [finding(target_id, "advice",
                    f"{DISPLAY[activation]} does not fuse into the convolution/linear layer before it "
                    f"({len(layers)}x): {who}; it runs as a separate pass over the layer's output (the talk: use "
                    "efficient, fusable activations like ReLU)",
                    _places(layers))
            for activation, layers in unfused.items()]


# --- one target ----------------------------------------------------------------------------------------------


# nnapi.unsupported_ops' lines: "aten::hardtanh_ (features.2, a ReLU6, and 3 more) [hint]"
NNAPI_LINE = re.compile(r"(?P<kind>\S+) \((?P<where>.*?)\)(?P<hint>.*)")


class TargetCheck:
    """What one target's toolchain makes of the model: findings, notes (what was not checked, and why), and facts
    such as the delegation summary."""

    def __init__(self, target, route, model, shared, interpreter):
        self.target, self.route, self.model, self.shared = target, route, model, shared
        self.interpreter = interpreter
        self.findings, self.notes, self.facts = [], [], {}

    def add(self, kind, detail, where):
        self.findings.append(finding(self.target.id, kind, detail, where))

    def memo(self, key, compute):
        """Targets asking the same question (two ONNX targets export the same float model) share the answer,
        failures included."""
        if key not in self.shared:
            try:
                self.shared[key] = (compute(), None)
            except MobileBuildError as exc:
                self.shared[key] = (None, exc)
        value, error = self.shared[key]
        if error is not None:
            raise error
        return value

    def run(self):
        stage = self.route.final_stage
        {"optimize": self.pytorch_mobile, "nnapi": self.nnapi, "lower": self.executorch,
         "export": self.onnx}[stage]()
        if self.interpreter and stage != "optimize":
            self.notes.append(f"operations checked with this torch {torch.__version__}; the target builds with "
                              f"its toolchain {self.target.toolchain}")

    # PyTorch Mobile: optimize_for_mobile for CPU (XNNPACK, QNNPACK) or GPU (Vulkan, Metal)

    def pytorch_mobile(self):
        route, target = self.route, self.target
        try:
            build = torch_build(self.interpreter)
        except MobileBuildError as exc:
            self.add("needs-build", exc.message, "toolchain")
            return
        if route.backend in optimize.GPU_EXPORT_OPS:
            problem = gpu_export_problem(route.backend, self.interpreter, build)
            if problem:
                self.add("needs-build", problem, "optimize_for_mobile")
        elif not build["xnnpack"]:
            self.add("needs-build", f"optimize_for_mobile needs XNNPACK, and this torch {build['version']} was built "
                                    "without it (official wheels from 2.13 on); use torch 2.12 or name one built with "
                                    "USE_XNNPACK=1 in the target's `toolchain`", "optimize_for_mobile")
        if route.precision(target) == "int8":
            self.int8_kernels(build)
        self.findings += activation_findings(target.id, f"{route.backend}/{route.runtime}", self.model.activations)
        if route.backend == "xnnpack" and self.model.input["memory_format"] != "channels_last" \
                and len(self.model.input["shape"]) == 4 and not self.model.converts_to_nhwc:
            self.add("advice", "the input is NCHW (contiguous): XNNPACK computes in NHWC and converts around every "
                               "convolution (MobileNetV2 here: about 415 ms against 28 ms); set "
                               "input.memory_format: channels_last (the performance recipe, step 4)",
                     "input.memory_format")

    def int8_kernels(self, build):
        engine = self.route.engine
        if engine not in build["engines"]:
            self.add("needs-build", f"this torch {build['version']} has no {engine!r} quantized engine (has: "
                                    f"{', '.join(build['engines'])})", "quantize")
            return
        if self.interpreter:
            self.notes.append("quantized kernels checked with this interpreter's torch, not the target's toolchain")
        try:
            quantized = self.model.quantized(engine, self.target.quantize)
            quantize.check_runs(quantized, self.model.input, engine, field="model")
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message, f"int8 ({engine})")

    # NNAPI: torch.backends._nnapi, traced NHWC

    def nnapi(self):
        mode = self.target.nnapi.get("mode", "none")
        input_config = self.model.input
        if mode != "none" and self.route.engine not in torch_build()["engines"]:
            self.add("needs-build", f"this torch {torch.__version__} has no {self.route.engine!r} quantized engine, "
                                    f"which NNAPI mode {mode} quantizes with", "quantize")
            return
        try:
            if mode == "none":
                model, quantizer = nnapi.drop_dropout(self.model.float_copy()), None
            else:
                quantizer, model, _ = nnapi.split_quantized(nnapi.drop_dropout(
                    self.model.quantized(self.route.engine, self.target.quantize)))
            example = nnapi.nhwc_input(input_config, quantizer)
            with nnapi.own_type_namespace():
                traced = nnapi.trace(model, example)
                unsupported = nnapi.unsupported_ops(traced, input_config)
                if not unsupported:  # every kind has a converter; the converter may still refuse their arguments
                    nnapi.to_nnapi(traced, example)
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message, f"NNAPI mode {mode}")
            unsupported = []
        for line in unsupported:
            parts = NNAPI_LINE.match(line)
            self.add("unsupported-op", f"torch.backends._nnapi has no conversion for {parts['kind']}{parts['hint']}",
                     parts["where"])
        self.findings += activation_findings(self.target.id, "nnapi/pytorch-mobile", self.model.activations)

    # ExecuTorch: lowered in memory for the delegate

    def executorch(self):
        options = dict(self.target.executorch)
        delegate = options.pop("delegate", self.route.delegate)
        precision = self.route.precision(self.target)
        self.facts["delegate"] = delegate
        key = ("lower", delegate, precision, json.dumps(options, sort_keys=True))
        try:
            summary = self.memo(key, lambda: lower.preflight_delegation(
                self.model.float_copy(), self.model.input, delegate, precision, options))
        except ImportError as exc:  # a delegate's optional dependency (coremltools) is missing
            self.notes.append(f"not checked: ExecuTorch's {delegate} delegate cannot be loaded here "
                              f"({modeling.first_line(exc)})")
            return
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message + self._layout_hint(exc.message), f"lowering to {delegate}")
            return
        self.facts["delegation"] = summary
        name = lower.BACKEND_NAMES[delegate]
        message = lower.undelegated_message(summary, delegate)
        if message:
            self.add("fallback", message, "whole program")
        else:
            for operator, calls in summary["fallback_ops"].items():
                self.add("fallback", f"{calls} call{'s' if calls > 1 else ''} on ExecuTorch's portable CPU kernels, "
                                     f"outside {name} (the program makes {summary['delegated_calls']} delegate "
                                     f"call{'s' if summary['delegated_calls'] > 1 else ''})"
                                     + self._layout_hint(operator), operator)
        self.findings += activation_findings(self.target.id, f"executorch/{delegate}", self.model.activations)

    def _layout_hint(self, text):
        """Both were seen with MobileNetV2 and a channels_last input, and are gone with a contiguous one."""
        if self.model.input["memory_format"] != "channels_last":
            return ""
        if "as_strided" in text:
            return "; it is the reshape of an NHWC tensor, from the channels_last input (input.memory_format)"
        if "dim order" in text:
            return "; the input is channels_last (input.memory_format): Core ML lowers it contiguous"
        return ""

    # ONNX: torch.onnx.export of the float model

    def onnx(self):
        opset = self.target.onnx.get("opset")
        try:
            self.memo(("onnx", opset), lambda: export.export_float(self.model.float_copy(), self.model.input, opset)
                      .ByteSize())
        except MobileBuildError as exc:
            self.add("unsupported-op", exc.message, "torch.onnx.export")
            return
        if self.route.precision(self.target) == "int8":
            self.notes.append("int8: ONNX Runtime's static quantization is not tried here, only the float export it "
                              "starts from")


# --- what this torch (or the target's toolchain) was built with ----------------------------------------------------

_PROBE = """
import json, sys
import torch
import torch.backends.xnnpack
ops = json.loads(sys.argv[1])
print(json.dumps({"version": torch.__version__, "xnnpack": bool(torch.backends.xnnpack.enabled),
                  "engines": list(torch.backends.quantized.supported_engines),
                  "gpu": {name: hasattr(getattr(torch.ops, ns), op) for name, (ns, op) in ops.items()}}))
"""
_BUILDS = {}


def torch_build(interpreter=None):
    """The facts about a torch build that decide whether PyTorch Mobile targets can be made with it."""
    if interpreter not in _BUILDS:
        ops = {name: spec[:2] for name, spec in optimize.GPU_EXPORT_OPS.items()}
        if interpreter is None:
            _BUILDS[None] = {"version": torch.__version__, "xnnpack": bool(torch.backends.xnnpack.enabled),
                             "engines": list(torch.backends.quantized.supported_engines),
                             "gpu": {name: hasattr(getattr(torch.ops, ns), op) for name, (ns, op) in ops.items()}}
        else:
            result = subprocess.run([interpreter, "-c", _PROBE, json.dumps(ops)], capture_output=True, text=True,
                                    timeout=120, check=False)
            if result.returncode:
                last = (result.stderr.strip().splitlines() or ["no output"])[-1]
                raise MobileBuildError(f"the toolchain {interpreter} cannot import torch: {last}")
            _BUILDS[interpreter] = json.loads(result.stdout.strip().splitlines()[-1])
    return _BUILDS[interpreter]


def gpu_export_problem(backend, interpreter, build):
    if interpreter is None:
        try:
            optimize.check_gpu_export(backend)
        except MobileBuildError as exc:
            return exc.message
        return None
    if build["gpu"][backend]:
        return None
    namespace, op, needs = optimize.GPU_EXPORT_OPS[backend]
    return (f"optimize_for_mobile(backend={backend!r}) needs a torch built with {needs}; the target's toolchain "
            f"(torch {build['version']}) has no {namespace}::{op}")


# --- the whole recipe ------------------------------------------------------------------------------------------


def _load(recipe_path, root, only):
    """The recipe and its targets' routes; a bad recipe raises (RecipeErrors or MobileBuildError)."""
    loaded = recipe.load(recipe_path, root)
    known = [target.id for target in loaded.targets]
    unknown = [name for name in only or () if name not in known]
    if unknown:
        raise MobileBuildError(f"no target {', '.join(map(repr, unknown))} in the recipe (targets: "
                               f"{', '.join(known)})", file=loaded.file, field="targets")
    chosen, problems = [], []
    for target in loaded.targets:
        if only and target.id not in only:
            continue
        try:
            route = backends.route_for(target, loaded.file)
            interpreter = toolchain.interpreter(target.toolchain, loaded.file, root,
                                                f"targets[{target.index}].toolchain")
        except MobileBuildError as exc:
            problems.append(exc)
            continue
        chosen.append((target, route, interpreter))
    if problems:
        raise RecipeErrors(problems)
    return loaded, chosen


def _versions():
    found = {}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


@contextlib.contextmanager
def _quiet():
    """torch.ao and torch.jit warn about deprecations on every call; the findings are what the user reads."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def run(recipe_path, root, targets=None):
    """Check every target of the recipe at `recipe_path` (relative to `root`, or absolute), or only the target ids
    in `targets`. Returns the report: JSON-able, findings per target, seconds per check. A bad recipe, or a model
    that cannot be built from it, raises MobileBuildError (or RecipeErrors) with one line per problem."""
    root = Path(root)
    loaded, chosen = _load(recipe_path, root, targets)
    started = time.perf_counter()
    with _quiet():
        try:
            model = Model(loaded, root)
        except MobileBuildError as exc:
            raise exc.located(loaded.file) from None
        model_seconds = time.perf_counter() - started
        shared, results = {}, []
        for target, route, interpreter in chosen:
            started = time.perf_counter()
            check = TargetCheck(target, route, model, shared, interpreter)
            check.run()
            results.append({"target": target.id, "backend": route.backend, "runtime": route.runtime,
                            "precision": route.precision(target), **check.facts, "findings": check.findings,
                            "notes": check.notes, "seconds": round(time.perf_counter() - started, 2)})
    every = model.findings + [item for result in results for item in result["findings"]]
    blocking = sum(item["kind"] in BLOCKING for item in every)
    return {"recipe": loaded.name, "file": loaded.file, "versions": _versions(),
            "model": {"findings": model.findings, "notes": model.notes, "seconds": round(model_seconds, 2)},
            "targets": results, "blocking": blocking, "advice": len(every) - blocking,
            "exit_code": 1 if blocking else 0}


# --- output --------------------------------------------------------------------------------------------------


def _status(findings):
    blocking = sum(item["kind"] in BLOCKING for item in findings)
    if blocking:
        return f"BLOCKED ({blocking})"
    return f"ok, {len(findings)} advice" if findings else "ok"


def _table(findings, notes, indent="    "):
    if not findings and not notes:
        return []
    where_width = min(max([len(item["where"]) for item in findings] + [5]), 48)
    lines = [f"{indent}{'kind':<15}{'where':<{where_width + 2}}detail"] if findings else []
    order = {kind: index for index, kind in enumerate(KINDS)}
    for item in sorted(findings, key=lambda item: order[item["kind"]]):
        lines.append(f"{indent}{item['kind']:<15}{item['where']:<{where_width + 2}}{item['detail']}")
    lines += [f"{indent}note: {note}" for note in notes]
    return lines


def format(report):
    """The report as text: a header, then a table per target (the model's own findings first)."""
    versions = ", ".join(f"{name} {version}" for name, version in report["versions"].items() if version)
    model = report["model"]
    lines = [f"{report['recipe']} ({report['file']}): {versions}",
             f"model: built and fused in {model['seconds']:.1f} s; all targets: {_status(model['findings'])}"]
    lines += _table(model["findings"], model["notes"])
    for result in report["targets"]:
        delegate = f" -> {result['delegate']}" if result.get("delegate") else ""
        lines.append(f"{result['target']} ({result['backend']}, {result['runtime']}{delegate}, {result['precision']})"
                     f" in {result['seconds']:.1f} s: {_status(result['findings'])}")
        lines += _table(result["findings"], result["notes"])
    verdict = "blocked" if report["blocking"] else "no blocking findings"
    lines.append(f"{report['blocking']} blocking, {report['advice']} advice: {verdict} (exit {report['exit_code']})")
    return "\n".join(lines)


def check_command(argv):
    """`mobilebuild check RECIPE [--json] [--target ID ...]`: 0 when nothing blocks (advice only), 1 when a target
    cannot take the model as it is, 2 for a bad recipe or command line."""
    parser = argparse.ArgumentParser(prog="mobilebuild check", description="Before any build: what each target of a "
                                     "recipe cannot take of its model, and which architecture advice applies.")
    parser.add_argument("recipe", type=Path, help="the recipe file")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--target", action="append", metavar="ID", help="check only this target (repeatable)")
    try:
        options = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0)
        return exc.code
    try:
        with host_lock.stage_running():  # it converts and lowers models, as stages do: benchmarks measure alone
            report = run(options.recipe, Path.cwd(), targets=options.target)
    except RecipeErrors as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 2
    except MobileBuildError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if options.json else format(report))
    return report["exit_code"]
