"""nnapi: the model for Android's Neural Networks API, run through PyTorch Mobile (.ptl), as the NNAPI post does.

Three modes, the post's: "none" converts the float model; "core" converts the quantized core and wraps it in the
float quantizer/dequantizer pair (one quantizer per float input), so the interface stays float; "full" converts the
quantized core alone: the app passes and receives quantized tensors. Dropout is dropped, the model is traced with 4-D
inputs NHWC, flagged `nnapi_nhwc` (a lone input always, as the post; of several, those asking for channels_last: see
`is_nhwc`; the converted model takes any memory format and permutes), converted with torch.backends._nnapi, wrapped,
given a bundled input and saved for the lite interpreter. It runs only on Android: the host has no NNAPI library.

inputs: "model" (the fused eager float model) and, for core and full, "quantized" (the quantize stage's state).
config: "mode" (none | core | full), "engine" and "quantization" (to rebuild the quantized model), "inputs" (float32
or int32: `check_inputs`; several: `build_inputs`), "options": {"bundled_inputs": bool, default true}.
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


def _where(node, module_types):
    path = modeling.traced_module_path(node)
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
        return _unsupported_in(traceable(traced_or_model, specs))


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
    layout = ".contiguous(memory_format=torch.channels_last)" if getattr(example, "nnapi_nhwc", False) else ""
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
    check_inputs(config.inputs)
    options = config.options or {}
    wrapped = build_any(_model(inputs, config), config.mode, config.inputs, options.get("bundled_inputs", True))
    data = wrapped._save_to_buffer_for_lite_interpreter()
    with open(output, "wb") as handle:  # a failed write (full disk) raises OSError here; by path, torch aborts
        handle.write(data)


# --- several inputs, and models quantized in FX graph mode ------------------------------------------------------
# Below the single-input code on purpose: a model of one input converts exactly as it always did.

# What torch.backends._nnapi takes as an input tensor (serializer.torch_tensor_to_operand): float32 (TENSOR_FLOAT32),
# the quantized quint8 of the int8 modes (TENSOR_QUANT8_ASYMM, made here from a float input) and int32
# (TENSOR_INT32). It refuses float16, int64, bool and uint8 ("Can't handle input with dtype").
INPUT_DTYPES = ("float32", "int32")
_DTYPE_ADVICE = {
    "float16": "give it as float32 (a driver may compute float32 in fp16 itself)",
    "int64": "NNAPI has no 64-bit integers (and the converter no embedding for token ids)",
    "bool": "give it as float32",
    "uint8": "give it as float32: the int8 modes quantize each float input themselves (mode full then takes quint8)",
}


def input_field(specs, index):
    """The recipe field of input `index`: `input` for the one-input shorthand, else `inputs[i]`."""
    return "input" if len(specs) == 1 else f"inputs[{index}]"


def check_inputs(specs):
    """Every input a tensor type the converter takes, else one line naming the first that is not (`inputs[1].dtype`);
    the task that fails names the target."""
    for index, spec in enumerate(specs):
        if spec["dtype"] not in INPUT_DTYPES:
            raise MobileBuildError(
                f"the NNAPI target cannot take input {spec['name']} as {spec['dtype']}: torch.backends._nnapi "
                f"converts float32, int32 and (int8 modes) quantized uint8 input tensors; "
                f"{_DTYPE_ADVICE[spec['dtype']]}", field=f"{input_field(specs, index)}.dtype")
    return specs


def is_nhwc(spec, specs):
    """Whether the converter gets this input NHWC (`nnapi_nhwc`): a 4-D input that asks for channels_last; a model's
    lone 4-D input always, as the post has it (and as such targets were always built)."""
    return len(spec["shape"]) == 4 and (len(specs) == 1 or spec["memory_format"] == "channels_last")


def is_graph_quantized(model):
    """A model quantized in FX graph mode: its float inputs go through torch.quantize_per_tensor nodes."""
    return isinstance(model, torch.fx.GraphModule) and any(
        node.op == "call_function" and node.target is torch.quantize_per_tensor for node in model.graph.nodes)


def _value(module, arg):
    return getattr(module, arg.target) if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" else arg


def split_inputs(model, specs):
    """The post's split for a model quantized in FX graph mode (of one input or several): each float input's
    quantizer taken out of the graph (its scale, zero point and dtype as a quantizer module of its own) and each
    output's dequantize dropped, so that only the quantized core is traced and converted. Returns ({input index:
    quantizer}, the core, [whether each output was dequantized]), the core changed in place."""
    if not is_graph_quantized(model):
        if is_quantized(model):
            raise MobileBuildError(
                "NNAPI modes core and full split a model of several inputs at the quantizer of each input, as FX "
                "graph mode quantizes it; this model quantizes in eager mode through stubs of its own (model.quant), "
                "which say nothing of which input they quantize: remove its QuantStubs (the build then quantizes it "
                "in FX graph mode), or use mode none", field="targets")
        raise MobileBuildError("NNAPI modes core and full convert a statically quantized model (static or QAT); this "
                               "one has no input quantizers (dynamic quantization adds none)", field="targets")
    graph, order = model.graph, {spec["name"]: index for index, spec in enumerate(specs)}
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    quantizers = {}
    for position, placeholder in enumerate(placeholders[:len(specs)]):
        index = order.get(placeholder.target, position)
        quantizing = [user for user in placeholder.users
                      if user.op == "call_function" and user.target is torch.quantize_per_tensor]
        if quantizing and len(quantizing) < len(placeholder.users):
            raise MobileBuildError(f"input {specs[index]['name']} is used both quantized and in float (FX graph mode "
                                   "kept an operation on it float): NNAPI takes it one way; keep that operation out "
                                   "of quantize.exclude, or use mode none", field="targets")
        for user in quantizing:
            _, scale, zero_point, dtype = (_value(model, arg) for arg in user.args)
            quantizer = nnq.Quantize(float(scale), int(zero_point), dtype)
            if index in quantizers and (float(quantizers[index].scale), int(quantizers[index].zero_point)) != \
                    (float(scale), int(zero_point)):
                raise MobileBuildError(f"input {specs[index]['name']} is quantized twice, at different scales: NNAPI "
                                       "takes one quantized tensor per input", field="targets")
            quantizers[index] = quantizer
            user.replace_all_uses_with(placeholder)
            graph.erase_node(user)
    for node in graph.nodes:  # re-quantizing after an operation kept float: the converter takes constant qparams
        if node.op == "call_function" and node.target is torch.quantize_per_tensor:
            value, scale, zero_point, dtype = node.args
            node.args = (value, float(_value(model, scale)), int(_value(model, zero_point)), dtype)
    (output,) = [node for node in graph.nodes if node.op == "output"]
    dequantized = []

    def core_of(value):
        is_dequantize = isinstance(value, torch.fx.Node) and (
            (value.op == "call_method" and value.target == "dequantize")
            or (value.op == "call_function" and value.target is torch.dequantize))
        dequantized.append(is_dequantize)
        return value.args[0] if is_dequantize else value

    output.args = (torch.fx.node.map_aggregate(output.args[0], core_of),)
    graph.eliminate_dead_code()
    model.recompile()
    return quantizers, model, dequantized


def nnapi_inputs(specs, quantizers=None):
    """The example inputs as the converter wants them, in forward's order: each float one quantized by its own
    quantizer (int8 modes), and NHWC with `nnapi_nhwc` where `is_nhwc` says."""
    examples = []
    for index, (spec, example) in enumerate(zip(specs, modeling.example_inputs(specs))):
        if quantizers and index in quantizers:
            example = quantizers[index](example)
        if is_nhwc(spec, specs):
            example = example.contiguous(memory_format=torch.channels_last)
            example.nnapi_nhwc = True
        else:
            example = example.contiguous()
        examples.append(example)
    return examples


def several(model, specs):
    """Whether a model takes the conversion below: several inputs, an int32 one, or FX graph mode's input
    quantizers."""
    return len(specs) > 1 or specs[0]["dtype"] != "float32" or is_graph_quantized(model)


def traceable(model, specs):
    """`_traceable`, for any model."""
    if not several(model, specs):
        return _traceable(model, specs)
    return _traced_inputs(drop_dropout(copy.deepcopy(model).eval()), specs)


def build_any(model, mode, specs, bundle=True):
    """`build`, for any model: several inputs and FX graph mode's quantizers go through `build_inputs`."""
    return (build_inputs if several(model, specs) else build)(model, mode, specs, bundle)


def _traced_inputs(model, specs):
    """`_traceable` for a model of several inputs, or one quantized in FX graph mode (through its core)."""
    quantizers = split_inputs(model, specs)[0] if is_graph_quantized(model) else {}
    return trace(model, tuple(nnapi_inputs(specs, quantizers)))


def wrap_inputs(nnapi_model, specs, quantizers, dequantized, mode):
    """The post's wrapper for several inputs: one module taking each input by name (for bundled inputs and the
    benchmark binary); in "core" mode it quantizes each float input with its own quantizer and dequantizes each
    output the core returns quantized. Defined from a string, as BundleWrapper's."""
    names = modeling.parameter_names(specs)
    holder = BundleWrapper(nnapi_model)
    arguments = list(names)
    if mode == "core":
        for index, quantizer in quantizers.items():
            setattr(holder, f"quant_{index}", quantizer)
            arguments[index] = f"self.quant_{index}({names[index]})"
        if any(dequantized):
            holder.dequant = nnq.DeQuantize()
    wrapper = torch.jit.script(holder)
    body = f"    out = self.mod({', '.join(arguments)})\n"
    if mode == "core" and any(dequantized):
        if len(dequantized) == 1 and not _returns_tuple(nnapi_model):
            body += "    return self.dequant(out)\n"
        else:
            leaves = [f"self.dequant(out[{i}])" if flag else f"out[{i}]" for i, flag in enumerate(dequantized)]
            body += f"    return ({', '.join(leaves)},)\n"
    else:
        body += "    return out\n"
    wrapper.define(f"def forward(self, {', '.join(f'{name}: Tensor' for name in names)}):\n{body}")
    return wrapper


def _returns_tuple(nnapi_model):
    """Whether the converted model returns a tuple (the model returned several tensors) or one tensor."""
    return isinstance(nnapi_model.forward.schema.returns[0].type, torch.TupleType)


def _bundled_arg(spec, example, quantizer, mode):
    """One input of the bundled input: as `bundled_input` for a float one (quantized in mode full where the core
    takes it quantized), integers from the input's range."""
    if not modeling.DTYPES[spec["dtype"]].is_floating_point:
        low, high = modeling.value_range(spec)
        stub = torch.zeros(1, dtype=example.dtype).expand(*example.shape)
        return torch.utils.bundled_inputs.InflatableArg(value=stub, fmt=f"torch.randint_like({{}}, {low}, {high})")
    if quantizer is None:
        mode = "none"
    float_example = torch.zeros(example.shape)  # the shape and the layout flag are all bundled_input reads
    float_example.nnapi_nhwc = getattr(example, "nnapi_nhwc", False)
    return bundled_input(float_example, quantizer, mode)


def _scalar_type(value):
    kind = value.type()
    return kind.scalarType() if isinstance(kind, torch.TensorType) else None


def check_dtype_changes(traced):
    """The converter converts aten::to as an identity (`add_to`: "to('cpu')"): `.to(torch.float32)` of an int32
    input would leave it int32 in NNAPI, an output of the wrong type or an operation of two types it then refuses
    with an assertion. One line naming where, before converting."""
    module_types = {name: module.original_name for name, module in traced.named_modules() if name}
    for node in traced.inlined_graph.nodes():  # traced types (freezing, as the converter does, drops them)
        if node.kind() == "aten::to":
            before, after = _scalar_type(node.inputsAt(0)), _scalar_type(node.outputsAt(0))
            if before and after and before != after:
                raise MobileBuildError(
                    f"the NNAPI converter (torch.backends._nnapi) converts aten::to as an identity, and the model "
                    f"turns {before} into {after} there ({_where(node, module_types)}): NNAPI would keep {before}; "
                    "give that input in the type the model computes in", field="targets")


def _mixed_layouts_hint(exc, specs):
    images = {spec["memory_format"] for spec in specs if len(spec["shape"]) == 4}
    if len(images) > 1 and "transpose" in exc.message:
        exc.message += (" (the 4-D inputs' memory formats differ, so one reaches NNAPI as NHWC and another as NCHW: "
                        "give them the same memory_format)")
    return exc


def build_inputs(model, mode, specs, bundle=True):
    """`build` for a model of several inputs (each float one quantized by its own quantizer in modes core and full,
    each 4-D one NHWC where it asks for channels_last), or of one input quantized in FX graph mode."""
    check_inputs(specs)
    model = drop_dropout(model.eval())
    quantizers, dequantized = {}, []
    if mode != "none":
        quantizers, model, dequantized = split_inputs(model, specs)
    elif is_quantized(model) or is_graph_quantized(model):
        raise MobileBuildError("NNAPI mode none converts a float model; this one is quantized", field="targets")
    examples = nnapi_inputs(specs, quantizers)
    with reproducible.jit_session():
        traced = trace(model, tuple(examples))
        check_supported(traced)
        check_dtype_changes(traced)
        try:
            converted = to_nnapi(traced, examples)
        except MobileBuildError as exc:
            raise _mixed_layouts_hint(exc, specs) from None
        wrapped = wrap_inputs(converted, specs, quantizers, dequantized, mode)
        if bundle:
            arguments = tuple(_bundled_arg(spec, example, quantizers.get(index), mode)
                              for index, (spec, example) in enumerate(zip(specs, examples)))
            torch.utils.bundled_inputs.augment_model_with_bundled_inputs(wrapped, [arguments])
        return wrapped
