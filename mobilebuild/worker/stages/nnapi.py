"""nnapi: the model for Android's Neural Networks API, run through PyTorch Mobile (.ptl), as the NNAPI post does.

Three modes, the post's: "none" converts the float model; "core" converts the quantized core and wraps it in the
float quantizer/dequantizer pair, so the interface stays float; "full" converts the quantized core alone: the app
passes and receives quantized tensors. Dropout is dropped, the model is traced (not scripted) with an NHWC input
flagged `nnapi_nhwc` (many NNAPI drivers prefer NHWC; the converted model accepts any memory format and permutes
as needed), converted with torch.backends._nnapi, wrapped, given a bundled input and saved for the lite
interpreter. The converted model runs only on Android: the host has no libneuralnetworks.so.

inputs: "model" (the fused eager float model) and, for core and full, "quantized" (the quantize stage's state).
config: "mode" (none | core | full), "engine" and "quantization" (to rebuild the quantized model), "inputs" (one
float input: its shape; the memory format is always NHWC here), "options": {"bundled_inputs": bool, default true}.
"""

import copy

import torch
import torch.utils.bundled_inputs
from torch.ao.nn import quantized as nnq
from torch.backends._nnapi.prepare import convert_model_to_nnapi
from torch.backends._nnapi.serializer import _NnapiSerializer

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import reproducible
from mobilebuild.worker.stages import fuse, modeling, quantize

MODES = ("none", "core", "full")

# The converter's own dispatch table: a node kind it has no adder for fails the conversion.
SUPPORTED_KINDS = frozenset(_NnapiSerializer.ADDER_MAP)


class BundleWrapper(torch.nn.Module):
    """The post's wrapper: one module with one tensor argument, for bundled inputs and the benchmark binary.
    Its forward is defined from a string (see `wrap`), so no source file of this package is recorded in the
    artifact's debug information: the bytes do not depend on where the checkout lies."""

    def __init__(self, mod):
        super().__init__()
        self.mod = mod


def drop_dropout(model):
    """Inference only: dropout is an identity the converter has no operation for (the post drops it too)."""
    for name, child in model.named_children():
        if isinstance(child, torch.nn.modules.dropout._DropoutNd):
            setattr(model, name, torch.nn.Identity())
        else:
            drop_dropout(child)
    return model


def split_quantized(model):
    """The post's split: the quantizer and dequantizer taken out (replaced by identities) so that only the
    quantized core is traced and converted. Returns (quantizer, core, dequantizer)."""
    quantizer, dequantizer = getattr(model, "quant", None), getattr(model, "dequant", None)
    if not isinstance(quantizer, nnq.Quantize) or not isinstance(dequantizer, nnq.DeQuantize):
        raise MobileBuildError(
            "NNAPI modes core and full convert the quantized core between the model's own quantizer "
            "(model.quant) and dequantizer (model.dequant), as torchvision's quantizable models and QuantWrapper "
            "have them; this model has none there (dynamic quantization adds none: use static or QAT)",
            field="targets")
    model.quant, model.dequant = torch.nn.Identity(), torch.nn.Identity()
    return quantizer, model, dequantizer


def is_quantized(model):
    return isinstance(getattr(model, "quant", None), nnq.Quantize)


def one_float_input(specs):
    """The input spec of a model this stage converts: the converter takes float (or quantized) tensors only, and the
    post's wrapper, which bundled inputs and the benchmark binary call, takes one."""
    if len(specs) != 1 or not modeling.DTYPES[specs[0]["dtype"]].is_floating_point:
        raise MobileBuildError(f"the NNAPI route converts a model of one float input (torch.backends._nnapi takes "
                               f"float and quantized tensors, and the post's wrapper one), and this model takes "
                               f"{modeling.describe_inputs(specs)}", field="targets")
    return specs[0]


def nhwc_input(specs, quantizer=None):
    """The example input as the converter wants it: NHWC, flagged with `nnapi_nhwc` (quantized for the core)."""
    (example,) = modeling.example_inputs([one_float_input(specs)])
    if quantizer is not None:
        example = quantizer(example)
    if example.dim() == 4:
        example = example.contiguous(memory_format=torch.channels_last)
        example.nnapi_nhwc = True
    return example


def trace(model, example):
    with torch.no_grad():
        try:
            return torch.jit.trace(model, example)
        except Exception as exc:  # tracing raises many types
            raise MobileBuildError(f"torch.jit.trace failed on the model for NNAPI ({modeling.first_line(exc)}); "
                                   "the NNAPI converter needs a traceable model", field="targets") from None


def module_path(node):
    """'__module.features/__module.features.0/__module.features.0.2' -> 'features.0.2' (the innermost module)."""
    innermost = node.scopeName().rsplit("/", 1)[-1]
    return innermost.removeprefix("__module").removeprefix(".")


def _where(node, module_types):
    path = module_path(node)
    if not path:
        return "the model's own forward"
    kind = module_types.get(path)
    return f"{path}, a {kind}" if kind else path


def _converted_graph(traced):
    """What the converter walks: the frozen graph (batch norm folded into convolutions, dropout removed), top-level
    nodes only, as convert_model_to_nnapi freezes before serializing."""
    return torch.jit.freeze(traced.eval()).graph


def _hint(kind):
    out_of_place = kind[:-1] if kind.endswith("_") else None
    if out_of_place in SUPPORTED_KINDS:
        return f" [{out_of_place}, out of place, is supported: inplace=False]"
    return ""


def _unsupported_in(traced):
    module_types = {name: module.original_name for name, module in traced.named_modules() if name}
    places = {}
    for node in _converted_graph(traced).nodes():
        if node.kind() not in SUPPORTED_KINDS:
            places.setdefault(node.kind(), []).append(_where(node, module_types))
    return [f"{kind} ({where[0]}" + (f", and {len(where) - 1} more" if len(where) > 1 else "") + f"){_hint(kind)}"
            for kind, where in places.items()]


def _traceable(model, specs):
    """An eager model prepared as the stage prepares it, traced; a quantized one through its core."""
    model = drop_dropout(copy.deepcopy(model).eval())
    quantizer = None
    if is_quantized(model):
        quantizer, model, _ = split_quantized(model)
    return trace(model, nhwc_input(specs, quantizer))


def unsupported_ops(traced_or_model, specs):
    """The operations torch.backends._nnapi cannot convert, one line each: 'kind (module path, a ModuleType)'.

    Takes a traced TorchScript module (traced with an NHWC input, as this stage does) or an eager model (float,
    or eager-quantized with model.quant/model.dequant), which is then prepared and traced the stage's way. An empty
    list means every node kind has a converter; the converter may still refuse a node's arguments.
    """
    if isinstance(traced_or_model, torch.jit.ScriptModule):
        return _unsupported_in(traced_or_model)
    with reproducible.jit_session():
        return _unsupported_in(_traceable(traced_or_model, specs))


def check_supported(traced):
    problems = _unsupported_in(traced)
    if problems:
        raise MobileBuildError(f"the NNAPI converter (torch.backends._nnapi) has no conversion for "
                               f"{', '.join(problems)}", field="targets")


class _LocatingSerializer(_NnapiSerializer):
    """Remembers the node being converted: the converter's own errors seldom say where in the model they are."""

    current = None

    def add_node(self, node):
        self.current = node
        super().add_node(node)


def to_nnapi(traced, example):
    serializer = _LocatingSerializer(config=None)
    try:
        return convert_model_to_nnapi(traced, example, serializer=serializer)
    except Exception as exc:  # the converter raises bare Exceptions and AssertionErrors on nodes it refuses
        node = serializer.current
        module_types = {name: module.original_name for name, module in traced.named_modules() if name}
        where = f" at {node.kind()} ({_where(node, module_types)})" if node is not None else ""
        raise MobileBuildError(f"the NNAPI converter (torch.backends._nnapi) fails{where}: "
                               f"{modeling.first_line(exc)}", field="targets") from None


def bundled_input(example, quantizer, mode):
    """A compact bundled input (the shape only; random values drawn when it is inflated), NHWC as the post bundles
    it; quantized with the model's own input quantization in "full" mode. The post bundles a whole zero tensor,
    which costs 600 kB for a 224x224 image."""
    stub = torch.zeros(1, dtype=torch.float32).expand(*example.shape)
    layout = ".contiguous(memory_format=torch.channels_last)" if example.dim() == 4 else ""
    if mode == "full":
        scale, zero_point = float(quantizer.scale), int(quantizer.zero_point)
        fmt = f"torch.quantize_per_tensor(torch.randn_like({{}}), {scale!r}, {zero_point}, {quantizer.dtype}){layout}"
    else:
        fmt = f"torch.randn_like({{}}){layout}"
    return torch.utils.bundled_inputs.InflatableArg(value=stub, fmt=fmt)


def wrap(nnapi_model, quantizer, dequantizer, mode):
    if mode == "core":  # float interface around the quantized core
        nnapi_model = torch.nn.Sequential(quantizer, nnapi_model, dequantizer)
    wrapper = torch.jit.script(BundleWrapper(nnapi_model))
    wrapper.define("def forward(self, arg):\n    return self.mod(arg)\n")
    return wrapper


def build(model, mode, specs, bundle=True):
    """The post's conversion of an eager model (float for "none", eager-quantized for "core"/"full"), as a
    scripted module ready to save for the lite interpreter."""
    model = drop_dropout(model.eval())
    quantizer = dequantizer = None
    if mode != "none":
        quantizer, model, dequantizer = split_quantized(model)
    elif is_quantized(model):
        raise MobileBuildError("NNAPI mode none converts a float model; this one is quantized", field="targets")
    example = nhwc_input(specs, quantizer)
    with reproducible.jit_session():
        traced = trace(model, example)
        check_supported(traced)
        wrapped = wrap(to_nnapi(traced, example), quantizer, dequantizer, mode)
        if bundle:
            torch.utils.bundled_inputs.augment_model_with_bundled_inputs(
                wrapped, [(bundled_input(example, quantizer, mode),)])
        return wrapped


def _model(inputs, config):
    """The model to convert: the fused one, or quantized from it; both rebuilt from the recipe, read weights-only."""
    if config.mode == "none":
        return fuse.load(inputs["model"], config)
    if "quantized" not in inputs or not config.quantization:
        raise MobileBuildError(f"NNAPI mode {config.mode} converts a quantized model: add a quantize step",
                               field="quantize")
    return quantize.load_quantized(inputs, config)


def run(inputs, config, output):
    if config.mode not in MODES:
        raise MobileBuildError(f"unknown NNAPI mode {config.mode!r} (known: {', '.join(MODES)})", field="targets")
    one_float_input(config.inputs)
    options = config.options or {}
    wrapped = build(_model(inputs, config), config.mode, config.inputs, options.get("bundled_inputs", True))
    data = wrapped._save_to_buffer_for_lite_interpreter()
    with open(output, "wb") as handle:  # a failed write (full disk) raises OSError here; by path, torch aborts
        handle.write(data)
