"""litert: the fused eager model converted to a LiteRT model (.tflite) by litert-torch, in the process of a stage
worker (it imports jax and LiteRT's converter: never the build's process).

How each precision is made (fp32, fp16 weights, int8 static through PT2E, dynamic-range), why the converter takes
the example's sizes only, and why its bytes are reproducible: docs/litert.md.
"""

import dataclasses
import logging
import re

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.litert.worker import runtime
from mobilebuild.worker import capture_root, progress
from mobilebuild.worker.quiet import native_stderr, quiet
from mobilebuild.worker.stages import calibration, exclusion, fuse, modeling

PT2E_OBSERVERS = ("histogram", "minmax", "moving_average")  # routes.torchscript.TORCH_OBSERVERS, torchao's pt2e
# absl's lines (I0000 ... flatbuffer_export.cc] Estimated count of arithmetic ops; the oneDNN notice at import) and
# its preamble: what the converter and LiteRT's libraries print natively on every conversion
NATIVE_NOTES = (b"I0000 ", b"W0000 ", b"WARNING: All log messages before absl::InitializeLog()")


def converting():
    """What a conversion runs in: its progress tree (printed from Python), MLIR op counts and oneDNN notices (native)
    and torch's log lines go; failures still raise."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(native_stderr(dropped=NATIVE_NOTES))
    stack.enter_context(quiet(logs=logging.WARNING))
    return stack


def examples(specs):
    return tuple(x.contiguous() for x in modeling.example_inputs(specs))


def quantizer(weights=None, exclude=(), observer=None):
    """litert-torch's PT2E quantizer for the recipe's static quantize settings."""
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e import HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver

    config = get_symmetric_quantization_config(is_per_channel=weights != "per_tensor")
    if observer is not None:
        kind = dict(zip(PT2E_OBSERVERS, (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver)))[observer]
        activation = dataclasses.replace(config.input_activation,
                                         observer_or_fake_quant_ctr=kind.with_args(eps=2**-12))  # as the default's
        config = dataclasses.replace(config, input_activation=activation, output_activation=activation)
    return (_excluding(exclude) if exclude else PT2EQuantizer()).set_global(config)


def _excluding(paths):
    """litert-torch's PT2E quantizer leaving the nodes of the modules at `paths` unannotated (float): each of its
    pattern annotators gets a filter that refuses them, before it propagates annotations to the ops that share them
    (removing annotations after that left shared specs pointing at nodes without any: torchao's KeyError). Its own
    set_module_name takes no None ("not supported yet"), and its module-name filter reads torch.dynamo's
    nn_module_stack keys, which torch.export's graphs lack; torchao's filter reads both."""
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer
    from torchao.quantization.pt2e.quantizer.utils import get_module_name_filter

    inside = [get_module_name_filter(path) for path in paths]

    def kept(filter_fn):
        return lambda node: not any(found(node) for found in inside) and (filter_fn is None or filter_fn(node))

    class Excluding(PT2EQuantizer):
        def _annotate_all_static_patterns(self, model, config, filter_fn=None):
            return super()._annotate_all_static_patterns(model, config, kept(filter_fn))

    return Excluding()


def quantized(model, samples, chosen):
    """`model` captured by torch.export, observed on `samples` and converted to a quantized graph for the converter
    (fold_quantize=False: the converter folds the weights' quantization itself)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad():
        try:
            captured = torch.export.export(model, samples[0]).module()
        except Exception as exc:  # torch.export raises many types
            raise convert_error(exc, "torch.export cannot capture the model") from None
        prepared = prepare_pt2e(captured, chosen)
        for sample in samples:
            prepared(*sample)
        return convert_pt2e(prepared, fold_quantize=False)


def convert(model, specs, quant=None):
    """The .tflite bytes of `model` (or of its PT2E-quantized graph, with the quantizer `quant` that made it)."""
    import litert_torch
    from litert_torch.quantize.quant_config import QuantConfig

    options = {"quant_config": QuantConfig(pt2e_quantizer=quant)} if quant is not None else {}
    try:
        with torch.no_grad():
            data = bytes(litert_torch.convert(model, examples(specs), **options).model_content())
    except MobileBuildError:
        raise
    except Exception as exc:  # torch.export, the JAX lowering and the MLIR converter raise many types
        raise convert_error(exc, "litert-torch cannot convert the model") from None
    return recipe_names(data, [spec["name"] for spec in specs])


POSITIONAL = re.compile(rb"args_(\d+)")


def recipe_names(data, names):
    """The model with its inputs named as the recipe names them, in its signature and its input tensors
    ("serving_default_image"). litert-torch names them after forward's positional arguments (`args_0`...); it takes
    other names only as keyword arguments (`sample_kwargs`), which must be forward's parameter names, and a recipe's
    input names need not be (torchvision's models take `x`)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(data, 0)
    graph = model.subgraphs[0]
    for signature in model.signatureDefs or ():
        for entry in signature.inputs:
            found = POSITIONAL.fullmatch(entry.name)
            if found is None or int(found[1]) >= len(names):
                continue
            name = names[int(found[1])].encode()
            tensor = graph.tensors[entry.tensorIndex]
            if tensor.name.endswith(entry.name):  # "serving_default_args_0"
                tensor.name = tensor.name[:-len(entry.name)] + name
            entry.name = name
    return _packed(model, len(data))


def _packed(model, size):
    import flatbuffers

    builder = flatbuffers.Builder(size + 4096)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def convert_error(exc, what):
    return MobileBuildError(f"{what} ({type(exc).__name__}: {modeling.first_line(exc)}); LiteRT takes the models "
                            "torch.export captures whole, at fixed sizes, with operations its converter lowers",
                            field="targets")


def fp16_weights(data):
    """The float model's weights stored as float16 (ai-edge-quantizer's FLOAT_CASTING weight-only recipe)."""
    from ai_edge_quantizer.algorithm_manager import AlgorithmName

    return edge_quantized(data, "add_weight_only_config", num_bits=16, algorithm_key=AlgorithmName.FLOAT_CASTING)


def dynamic_range(data, weights=None):
    """The float model's dynamic-range int8 form (ai-edge-quantizer's dynamic_wi8_afp32, per-tensor weights where
    quantize.weights says so): int8 weights, activations quantized by LiteRT's kernels as they run. Not PT2E's dynamic
    config: its conversion quantizes an embedding table with a zero point LiteRT's EMBEDDING_LOOKUP refuses
    ("zero_point->data[0] == 0 was not true", measured on a Transformer's token embedding)."""
    from ai_edge_quantizer.qtyping import QuantGranularity

    granularity = QuantGranularity.TENSORWISE if weights == "per_tensor" else QuantGranularity.CHANNELWISE
    return edge_quantized(data, "add_dynamic_config", num_bits=8, granularity=granularity)


def edge_quantized(data, kind, **settings):
    """`data` quantized by ai-edge-quantizer with one recipe entry for every operator it supports: its
    RecipeManager's `kind` ("add_dynamic_config"...) with `settings`."""
    from ai_edge_quantizer import quantizer as edge_quantizer
    from ai_edge_quantizer.qtyping import TFLOperationName
    from ai_edge_quantizer.recipe_manager import RecipeManager

    recipe = RecipeManager()
    getattr(recipe, kind)(regex=".*", operation_name=TFLOperationName.ALL_SUPPORTED, **settings)
    found = edge_quantizer.Quantizer(data)
    found.load_quantization_recipe(recipe.get_quantization_recipe())
    return bytes(found.quantize().quantized_model)


def float_io(data):
    """A fully integer model with float inputs and outputs: a QUANTIZE op before each int8 input and a DEQUANTIZE
    after each int8 output, each taking the tensor's name (its int8 tensor is renamed `<name>_int8`), as TensorFlow
    Lite's converter made them by default. The quantization itself is unchanged."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(data, 0)
    graph = model.subgraphs[0]
    moved = {}

    def twin(index):
        tensor = graph.tensors[index]
        found = schema.TensorT()
        found.shape, found.shapeSignature, found.name = tensor.shape, tensor.shapeSignature, tensor.name
        found.type, found.buffer = schema.TensorType.FLOAT32, 0  # buffer 0: the empty one, for run-time tensors
        tensor.name = tensor.name + b"_int8"
        graph.tensors.append(found)
        moved[index] = len(graph.tensors) - 1
        return moved[index]

    def operator(code, options_type, options, inputs, outputs):
        found = schema.OperatorT()
        found.opcodeIndex, found.inputs, found.outputs = _opcode(model, code), inputs, outputs
        found.builtinOptionsType, found.builtinOptions = options_type, options
        return found

    integer = (schema.TensorType.INT8, schema.TensorType.UINT8)
    head = [operator(schema.BuiltinOperator.QUANTIZE, schema.BuiltinOptions.QuantizeOptions,
                     schema.QuantizeOptionsT(), [twin(index)], [index])
            for index in graph.inputs if graph.tensors[index].type in integer]
    tail = [operator(schema.BuiltinOperator.DEQUANTIZE, schema.BuiltinOptions.DequantizeOptions,
                     schema.DequantizeOptionsT(), [index], [twin(index)])
            for index in graph.outputs if graph.tensors[index].type in integer]
    if not moved:
        return data
    graph.inputs = [moved.get(int(index), int(index)) for index in graph.inputs]
    graph.outputs = [moved.get(int(index), int(index)) for index in graph.outputs]
    graph.operators = head + list(graph.operators) + tail
    for signature in model.signatureDefs or ():
        for entry in (*signature.inputs, *signature.outputs):
            entry.tensorIndex = moved.get(entry.tensorIndex, entry.tensorIndex)
    return _packed(model, len(data))


def _opcode(model, code):
    """The index of builtin operator `code` among the model's operator codes, added where missing; version 2 (int8)."""
    from ai_edge_litert import schema_py_generated as schema

    for index, found in enumerate(model.operatorCodes):
        if found.builtinCode == code:
            found.version = max(found.version, 2)
            return index
    found = schema.OperatorCodeT()
    found.builtinCode, found.deprecatedBuiltinCode, found.version = code, min(code, 127), 2
    model.operatorCodes.append(found)
    return len(model.operatorCodes) - 1


def to_bytes(model, config, exclude=()):
    """The target's .tflite bytes (see the module's docstring)."""
    options = config.options or {}
    if config.precision != "int8" or config.mode == "dynamic":
        progress.note("converting with litert-torch")
        with converting():
            data = convert(model, config.inputs)
            if config.precision == "int8":
                progress.note("quantizing (dynamic-range: int8 weights, activations quantized as it runs)")
                return dynamic_range(data, config.weights)
            if options.get("weights") == "fp16":
                progress.note("storing the weights as float16 (ai-edge-quantizer)")
                data = fp16_weights(data)
        return data
    if not config.calibration:
        raise MobileBuildError("int8 LiteRT conversion needs calibration batches", field="quantize.calibration")
    samples = calibration.at_example_sizes(config.calibration, config.inputs, "a LiteRT model takes")
    progress.note(f"quantizing (PT2E), calibrated on {len(samples)} batch{'es' if len(samples) > 1 else ''}")
    with converting():
        chosen = quantizer(config.weights, exclude, config.observer)
        graph = quantized(model, samples, chosen)
        progress.note("converting with litert-torch")
        data = convert(graph, config.inputs, chosen)
    return data if options.get("io") == "int8" else float_io(data)


def run(inputs, config, output):
    model = capture_root.nested(fuse.load(inputs["model"], config).eval(), len(config.inputs))
    exclude = exclusion.resolve(model, config.exclude) if config.precision == "int8" else ()
    data = to_bytes(model, config, exclude)
    # a file LiteRT's interpreter cannot load (a kernel refusing its quantization) is refused here, in one line,
    # rather than shipped: every .tflite loads on the host's CPU, device-only targets' included
    runtime.interpreter(data)
    if config.precision == "int8":
        float_weights_warning(data, exclude)
    with open(output, "wb") as handle:
        handle.write(data)


def float_weights_warning(data, exclude):
    """One line where most of an int8 file's weight bytes stayed float (litert-torch converts a PT2E-quantized
    Conv3d to a float CONV_3D: torchvision's r3d_18 int8 is 132.9 MB against 133.5 MB fp32). Verify records the
    same facts (runtimes.litert.inspect) and the report shows the float share."""
    from ai_edge_litert import schema_py_generated as schema

    line = runtime.float_weights_line(runtime.weights(schema.ModelT.InitFromPackedBuf(data, 0)))
    if line and exclude:  # asked for: a note, as what else the converter left float cannot be told apart here
        print(f"   note: {line}; quantize.exclude keeps {len(exclude)} module(s) float")
    elif line:
        print(f"   warning: {line}; the converter left those operators float")
