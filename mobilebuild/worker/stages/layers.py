"""layers: where an int8 artifact's error comes from. Each quantized layer is compared with its float counterpart
fed the float side's inputs (a shadow comparison), so a layer is charged with the error it adds itself, not with
what the layers before it left at its output (which would always blame the last layers). The result lists the N
layers with the lowest SQNR, worst first.

Per route, with the tools its quantizer comes with:
  eager:  the quantize stage's model rebuilt as the script stage does (quantize.load_quantized), each quantized
          module shadowed by the fused float module at the same path, both fed the same (dequantized) input: torch's
          eager numeric suite (torch.ao.ns._numeric_suite.prepare_model_with_stubs, as compare_model_stub does).
  fx:     a model the quantize stage quantized in FX graph mode: torch.ao.ns._numeric_suite_fx.add_shadow_loggers,
          which feeds a copy of each quantized op the float model's input (quantized as the int8 model does).
  pt2e:   ExecuTorch int8. The stock executorch 1.3.1 wheel's runtime has no event tracer ("No etdump data found,
          try rebuilding with the CMake option EXECUTORCH_ENABLE_EVENT_TRACER"), so ETDump and the Inspector's
          numeric gap cannot run here; and inside an XNNPACK delegate the runtime shows no per-op outputs anyway.
          The quantization the lower stage runs (ExecuTorch's export recipe: torch.export, its quantizer,
          prepare_pt2e, the same calibration batches, convert_pt2e) is run again, and torchao's PT2E numeric
          debugger (prepare_for_propagation_comparison, extract_results_from_loggers) logs each node of the float
          and the quantized graph, matched by their source nodes; the quantized graph's loggers hand on the float
          graph's value, so each node is fed float inputs (quantized where the int8 graph quantizes them).
  onnx:   the shipped int8 .onnx against the float model exported again: onnxruntime.quantization.qdq_loss_debug
          (modify_model_output_intermediate_tensors, collect_activations) gives every float tensor; each quantized
          node of the QDQ model, cut out with its quantize/dequantize pairs (onnx.utils.Extractor), runs on the
          float model's inputs; create_weight_matching/compute_weight_error add each node's weight SQNR. A dynamically
          quantized model (quantize_dynamic) has no QDQ pairs: each integer unit (DynamicQuantizeLinear, then
          MatMulInteger or ConvInteger and the float ops that rescale its result; a Gather of an int8 table and its
          DequantizeLinear) is cut out from the float tensor it quantizes to the float model's tensor it replaces.
          ONNX node names map back to module paths through the exporter's name scopes.
The data is verification's (verify.evaluation_data: never calibration's), at the example's sizes.
"""

import copy
import dataclasses
import json
import math
import time
from types import SimpleNamespace

import torch
from torch.ao.ns import _numeric_suite as ns

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import metrics, progress, quiet
from mobilebuild.worker.stages import fuse, modeling, verify

METHODS = {
    "eager": "eager numeric suite (torch.ao.ns._numeric_suite shadow modules): each quantized module and its float "
             "module on the same input",
    "fx": "FX numeric suite (torch.ao.ns._numeric_suite_fx.add_shadow_loggers): each quantized op fed the float "
          "model's input",
    "pt2e": "PT2E numeric debugger (torchao prepare_for_propagation_comparison) on the int8 graph the lower stage "
            "quantizes, each node fed the float graph's input; not ETDump: the stock executorch runtime is built "
            "without the event tracer",
    "onnx": "onnxruntime.quantization.qdq_loss_debug activations; each quantized node of the shipped QDQ model, "
            "with its Q/DQ pairs, run on the float model's inputs",
}
# Nodes that only move or view data: never a layer of their own
MOVES = {"view", "reshape", "flatten", "permute", "transpose", "squeeze", "unsqueeze", "contiguous", "clone",
         "getitem", "dropout", "_assert_tensor_metadata", "expand", "alias", "detach", "to", "Reshape", "Flatten",
         "Transpose", "Squeeze", "Unsqueeze", "Identity", "Shape", "Gather", "Cast", "Constant"}

GROUP = 4  # batches per collect_activations call: it keeps every tensor of the float model for each


class _Errors:
    """Per layer: the float signal's energy and the error's, summed over every batch."""

    def __init__(self):
        self.found = {}  # name -> [op, signal, noise, extra]

    def add(self, name, op, reference, output, **extra):
        # the same values: ONNX's saved activations come flattened
        if reference.numel() != output.numel() or reference.dtype != output.dtype or not reference.is_floating_point():
            return
        reference = reference.detach().double().flatten()
        output = output.detach().double().flatten()
        entry = self.found.setdefault(name, [op, 0.0, 0.0, extra])
        entry[1] += reference.pow(2).sum().item()
        entry[2] += (reference - output).pow(2).sum().item()

    def ranked(self):
        rows = []
        for name, (op, signal, noise, extra) in self.found.items():
            if noise == 0.0:  # exact: it adds no error (a dequantization, a float module)
                continue
            elif signal == 0.0:
                value = -metrics.SQNR_CEILING_DB
            else:
                value = max(-metrics.SQNR_CEILING_DB, min(10.0 * math.log10(signal / noise), metrics.SQNR_CEILING_DB))
            rows.append({"name": name, "op": op, "sqnr_db": round(value, 2), **extra})
        return sorted(rows, key=lambda row: (row["sqnr_db"], row["name"]))


def _dequantized(value):
    if isinstance(value, (tuple, list)):
        value = next((item for item in value if isinstance(item, torch.Tensor)), None)
    if not isinstance(value, torch.Tensor):
        return None
    return value.dequantize() if value.is_quantized else value


def batches(config):
    """(batches of the example's size as tuples of tensors, what the data is): verification's data."""
    settings = SimpleNamespace(**dataclasses.asdict(config), fixed_shape="the example's sizes")
    groups, description = verify.evaluation_data(settings)
    _, data, _ = groups[0]
    size = config.inputs[0]["shape"][0]
    usable = min(len(data[0]), max(config.samples, size))  # an evaluation function's data too
    usable -= usable % size
    return list(zip(*(x[:usable].split(size) for x in data))), description


# --- eager mode and FX graph mode (the quantize stage's model) ---------------------------------------------------

def _exclusions(model, quantization):
    entries = (quantization or {}).get("exclude")
    if not entries:
        return ()
    from mobilebuild.worker.stages import exclusion  # quantize.exclude (a newer helper of the quantizing stages)

    return exclusion.resolve(model, entries)


def eager_layers(inputs, config, chunks):
    from torch.ao import quantization as tq

    from mobilebuild.worker.stages import quantize

    quantized = quantize.load_quantized(inputs, config)
    if isinstance(quantized, torch.fx.GraphModule):
        return fx_layers(inputs, config, chunks, quantized)
    reference = fuse.load(inputs["model"], config).eval()
    if isinstance(quantized, tq.QuantWrapper):  # its stubs are identities on a float model
        reference = type(quantized)(reference).eval()
    swap = _swapped_types(reference, quantized)
    ns.prepare_model_with_stubs(reference, quantized, swap, _Shadow)
    shadows = {name: module for name, module in quantized.named_modules() if isinstance(module, ns.Shadow)}
    prefix = "module." if isinstance(quantized, tq.QuantWrapper) else ""
    errors = _Errors()
    with torch.no_grad():
        for chunk in chunks:
            quantized(*chunk)
            for name, shadow in shadows.items():
                stats = shadow.logger.stats
                for output, expected in zip(stats["quantized"], stats["float"]):
                    output, expected = _dequantized(output), _dequantized(expected)
                    if output is not None and expected is not None:
                        errors.add(name.removeprefix(prefix) or name, type(shadow.shadow_module).__name__, expected,
                                   output)
                stats["quantized"], stats["float"] = [], []
    return errors, "eager"


def _swapped_types(reference, quantized):
    """The float module types whose modules quantization replaced: layers (leaves, or fused modules), not the
    containers around them."""
    from torch.ao.nn.intrinsic import _FusedModule

    found = dict(reference.named_modules())
    swap = set()
    for name, module in quantized.named_modules():
        original = found.get(name)
        if (name and original is not None and type(original) is not type(module)
                and (not list(original.children()) or isinstance(original, _FusedModule))):
            swap.add(type(original))
    return swap


class _Shadow(ns.ShadowLogger):
    """The suite's ShadowLogger keeps one sample of a batch (`x[0]` when len(x) > 1): this one keeps them all."""

    def forward(self, x, y):
        self.stats["quantized"].append(x.detach() if isinstance(x, torch.Tensor) else x)
        self.stats["float"].append(y.detach() if isinstance(y, torch.Tensor) else y)


def fx_layers(inputs, config, chunks, quantized):
    from torch.ao.ns import _numeric_suite_fx as ns_fx

    from mobilebuild.worker.stages import fx_quantize, quantize

    fused = fuse.load(inputs["model"], config)
    quantization = config.quantization
    exclude = _exclusions(fused, quantization)
    qconfig = quantize.qconfig_for(config.engine, quantization["weights"])
    with quiet.quiet(output=False):
        observed = fx_quantize.prepared(fused, config.engine, config.inputs, qconfig, *([exclude] if exclude else []))
        shadowed = ns_fx.add_shadow_loggers("float", observed, "int8", quantized, ns_fx.OutputLogger)
    loggers = [module for module in shadowed.modules() if isinstance(module, ns_fx.OutputLogger)]
    errors = _Errors()
    with torch.no_grad():
        for chunk in chunks:
            shadowed(*chunk)
            found = ns_fx.extract_shadow_logger_info(shadowed, ns_fx.OutputLogger, "int8")
            for subgraph in found.values():
                for kind in subgraph.values():
                    for expected, output in zip(kind.get("float", []), kind.get("int8", [])):
                        name = output.get("fqn") or expected.get("fqn") or output["ref_node_name"]
                        op = _type_name(output.get("ref_node_target_type") or expected.get("ref_node_target_type"))
                        for a, b in zip(expected["values"], output["values"]):
                            a, b = _dequantized(a), _dequantized(b)
                            if a is not None and b is not None:
                                errors.add(name, op, a, b)
            for logger in loggers:
                logger.stats = []
    return errors, "fx"


def _type_name(target_type):
    text = str(target_type or "op")
    return text.rsplit(".", 1)[-1].strip("'>")


# --- ExecuTorch int8 (PT2E) ---------------------------------------------------------------------------------------

def pt2e_quantized(model, config):
    """(the float graph, the int8 graph) as the lower stage's export recipe makes them: the same quantizer, the same
    calibration batches (dynamic mode: the example input, which calibrates nothing), the same seed."""
    from executorch.export.stages import QuantizeStage
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from mobilebuild.worker.stages import lower

    exclude = _exclusions(model, {"exclude": config.exclude})
    adjust = {key: value for key, value in (("exclude", exclude), ("observer", config.observer)) if value}
    recipe = lower.export_recipe("xnnpack", "int8", config.options, config.weights, mode=config.mode, **adjust)
    samples = (lower.calibration_samples(config.calibration, config.inputs) if config.mode == "static"
               else [lower.in_layout(modeling.example_inputs(config.inputs))])
    quantizer = QuantizeStage(recipe.quantization_recipe)._get_quantizer_for_prepare_pt2e(
        recipe.quantization_recipe.quantizers)
    torch.manual_seed(0)
    with quiet.quiet(), torch.no_grad():
        captured = torch.export.export(model.eval(), samples[0], strict=True).module()
        reference = copy.deepcopy(captured)  # its nodes keep their sources: the debugger matches them
        prepared = prepare_pt2e(captured, quantizer)
        for sample in samples:
            prepared(*sample)
        return reference, convert_pt2e(prepared)


def pt2e_layers(inputs, config, chunks):
    from torchao.quantization.pt2e._numeric_debugger import (
        OutputLogger,
        extract_results_from_loggers,
        prepare_for_propagation_comparison,
    )

    from mobilebuild.worker.stages import lower

    progress.note("quantizing as the lower stage does")
    reference, quantized = pt2e_quantized(fuse.load(inputs["model"], config), config)
    reference = prepare_for_propagation_comparison(reference)
    quantized = prepare_for_propagation_comparison(quantized)
    handing = {}  # debug info -> the float graph's value for the batch that runs
    # The int8 graph's quantize and dequantize nodes carry the debug info of the node whose output they quantize:
    # the last logger of each debug info sees the value as the int8 graph passes it on
    last = {}
    for node in quantized.graph.nodes:
        if node.op == "call_module" and isinstance(quantized.get_submodule(node.target), OutputLogger):
            last[quantized.get_submodule(node.target).debug_info] = node.target

    class Feeding(OutputLogger):
        """Logs the int8 graph's value of a node, then hands the float graph's on: the next node gets float
        inputs."""

        def forward(self, x):
            expected = handing.get(self.debug_info)
            if (isinstance(x, torch.Tensor) and isinstance(expected, torch.Tensor) and expected.shape == x.shape
                    and expected.dtype == x.dtype):
                self.stats.append(x.detach())
                return expected
            return x

    for name, module in list(quantized.named_children()):
        if isinstance(module, OutputLogger) and last.get(module.debug_info) == name:
            setattr(quantized, name, Feeding(module.debug_info, module.node_name, module.nn_module_stack))
    errors = _Errors()
    with torch.no_grad(), quiet.quiet(output=False):
        for chunk in chunks:
            chunk = lower.in_layout(chunk)
            for module in (*reference.children(), *quantized.children()):
                if isinstance(module, OutputLogger):
                    module.stats = []
            reference(*chunk)
            expected = extract_results_from_loggers(reference)
            handing.clear()
            handing.update({info: stats[-1] for info, (_, _, stats) in expected.items() if stats})
            quantized(*chunk)
            for module in quantized.children():
                if not isinstance(module, Feeding) or not module.stats or module.debug_info not in expected:
                    continue
                node_name, stack, _ = expected[module.debug_info]
                op = _aten_name(node_name)
                if op in MOVES:
                    continue
                name, kind = _module_of(stack, node_name, op)
                errors.add(name, kind, handing[module.debug_info], module.stats[-1])
    return errors, "pt2e"


def _aten_name(node_name):
    """conv2d_1 -> conv2d."""
    base = (node_name or "").rstrip("0123456789")
    return base[:-1] if base.endswith("_") else base


def _module_of(stack, node_name, op):
    """(module path, what it is) of a node of an exported graph: the innermost module it comes from and its class
    where that is one of torch.nn's layers (Conv2d, Linear, ReLU), else the operation (the `add` of a residual
    block)."""
    if not isinstance(stack, dict) or not stack:
        return node_name, op
    path, kind = list(stack.values())[-1]
    path = path.removeprefix("L['self'].") or node_name
    kind = kind if isinstance(kind, str) else f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', kind)}"
    if kind.startswith("torch.nn.") or kind.startswith("torch.ao.nn."):
        return path, kind.rsplit(".", 1)[-1]
    return path, op


# --- ONNX Runtime int8 (QDQ) ---------------------------------------------------------------------------------------

def _scopes(proto):
    """ONNX node name -> (module path, class name) from the exporter's metadata."""
    import ast

    found = {}
    for node in proto.graph.node:
        meta = {entry.key: entry.value for entry in node.metadata_props}
        try:
            scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "None")) or []
            classes = ast.literal_eval(meta.get("pkg.torch.onnx.class_hierarchy", "None")) or []
        except (ValueError, SyntaxError):
            continue
        # name_scopes: the root '', each module's path, the node's own name; class_hierarchy: their classes
        if len(scopes) > 2 and scopes[-2]:
            kind = classes[len(scopes) - 2] if len(classes) >= len(scopes) - 1 else None
            found[node.name] = (scopes[-2], kind.rsplit(".", 1)[-1] if isinstance(kind, str) else None)
    return found


def onnx_layers(inputs, config, chunks):
    import tempfile
    from pathlib import Path

    import numpy
    import onnx
    import onnxruntime
    from onnxruntime.quantization import qdq_loss_debug

    from mobilebuild.worker.stages import export

    progress.note("exporting the float model again")
    proto = export.export_float(fuse.load(inputs["model"], config), config.inputs,
                                (config.options or {}).get("opset"), config.outputs)
    modules = _scopes(proto)
    qdq = onnx.load(inputs["artifact"])
    names = [spec["name"] for spec in config.inputs]
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    errors = _Errors()
    with tempfile.TemporaryDirectory(prefix="mobilebuild-layers-") as folder:
        float_path, qdq_path = Path(folder) / "float.onnx", Path(folder) / "qdq.onnx"
        onnx.save(export.reproducible(onnx.load_from_string(proto.SerializeToString())), float_path)
        onnx.save(qdq, qdq_path)
        augmented = Path(folder) / "float-all.onnx"
        qdq_loss_debug.modify_model_output_intermediate_tensors(float_path, augmented)
        weights = _weight_errors(qdq_loss_debug, float_path, qdq_path)
        layers = list(_quantized_nodes(qdq)) + list(_integer_units(qdq, proto))
        pieces = {}
        extractor = onnx.utils.Extractor(_at_example(qdq, config.inputs))
        for node, feeds, output, original in layers:
            piece = extractor.extract_model(feeds, [output])
            pieces[node.name] = onnxruntime.InferenceSession(piece.SerializeToString(), options,
                                                             providers=["CPUExecutionProvider"])
        for group in (chunks[start:start + GROUP] for start in range(0, len(chunks), GROUP)):
            reader = [{name: x.contiguous().numpy() for name, x in zip(names, chunk)} for chunk in group]
            found = qdq_loss_debug.collect_activations(str(augmented), iter(reader), session_options=options)
            for index, feed in enumerate(reader):
                values = {name: arrays[index] for name, arrays in found.items()} | feed
                for node, feeds, output, original in layers:
                    if original not in values or any(feed not in values for feed in feeds):
                        continue
                    piece = pieces[node.name]
                    given = {spec.name: _shaped(values[spec.name], spec.shape) for spec in piece.get_inputs()}
                    (produced,) = piece.run([output], given)
                    path, kind = modules.get(node.name, (node.name, None))
                    extra = {"weight_sqnr_db": weights[node.name]} if node.name in weights else {}
                    errors.add(path if kind else node.name, kind or node.op_type,
                               torch.from_numpy(numpy.asarray(values[original])),
                               torch.from_numpy(numpy.asarray(produced)), **extra)
    return errors, "onnx"


def _at_example(proto, specs):
    """The model with shapes inferred; where the recipe has dynamic dims, from its inputs at the example's sizes (the
    comparison's data), so that the pieces cut from it take concrete shapes where inference can follow them
    (collect_activations gives every tensor flattened: see _shaped)."""
    import onnx

    if not any(spec.get("dynamic") for spec in specs):
        return onnx.shape_inference.infer_shapes(proto)
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    del fixed.graph.value_info[:]
    for value, spec in zip(fixed.graph.input, specs):
        for dim, size in zip(value.type.tensor_type.shape.dim, spec["shape"]):
            dim.dim_value = size
    return onnx.shape_inference.infer_shapes(fixed, data_prop=True)


def _shaped(values, shape):
    """A tensor collect_activations gave flattened, in the shape a piece's input declares; a shape with symbolic dims
    (where inference could not follow the example's sizes) solved from the tensor's size where it has one unknown,
    or one name on several axes (an attention's [seq, seq]); else left flat (the piece then fails, and says so)."""
    import numpy

    symbolic = [dim for dim in shape if not isinstance(dim, int)]
    if not symbolic:
        return numpy.reshape(values, shape)
    known = math.prod(dim for dim in shape if isinstance(dim, int))
    if len(symbolic) == 1:
        return numpy.reshape(values, [dim if isinstance(dim, int) else -1 for dim in shape])
    if len(set(symbolic)) == 1 and symbolic[0] and known:
        size = round((values.size / known) ** (1 / len(symbolic)))
        return numpy.reshape(values, [dim if isinstance(dim, int) else size for dim in shape])
    return values


def _weight_errors(qdq_loss_debug, float_path, qdq_path):
    """ONNX node name -> the SQNR of its quantized weight."""
    import onnx

    try:
        errors = qdq_loss_debug.compute_weight_error(qdq_loss_debug.create_weight_matching(str(float_path),
                                                                                           str(qdq_path)))
    except Exception:  # a debugging aid: the layer ranking does not need it
        return {}
    found = {}
    for node in onnx.load(str(float_path)).graph.node:
        for name in node.input:
            if name in errors:
                found[node.name] = round(float(errors[name]), 2)
    return found


def _quantized_nodes(qdq):
    """(node, its float inputs to feed, the output to read, the float model's name of that output) for each node of a
    QDQ model whose activation inputs are quantized: the inputs are the tensors before their QuantizeLinear; the
    output, its DequantizeLinear's where the node's output is quantized."""
    producer = {output: node for node in qdq.graph.node for output in node.output}
    consumers = {}
    for node in qdq.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {init.name for init in qdq.graph.initializer}
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.op_type in MOVES:
            continue
        feeds = []
        for name in node.input:
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = producer.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in initializers:
                feeds.append(q.input[0])
        if not feeds or not node.output:
            continue
        output = node.output[0]
        original = output.removesuffix("_QuantizeLinear_Input")  # a graph output the quantizer renamed
        q = next((user for user in consumers.get(output, ()) if user.op_type == "QuantizeLinear"), None)
        if q is not None:
            dq = next((user for user in consumers.get(q.output[0], ()) if user.op_type == "DequantizeLinear"), None)
            if dq is not None:
                output = dq.output[0]
        yield node, list(dict.fromkeys(feeds)), output, original


INTEGER_OPS = ("MatMulInteger", "ConvInteger")  # quantize_dynamic's, fed by DynamicQuantizeLinear


def _integer_units(quantized, float_proto):
    """(the float model's node it replaces, its float inputs to feed, the output to read, that output's name in the
    float model) for each unit of a dynamically quantized model: an integer op (INTEGER_OPS) from the float tensors
    its DynamicQuantizeLinear nodes quantize, or a Gather of an int8 table (an embedding) from its indices, each to
    the first tensor after it that the float model has too (quantize_dynamic gives the rescaled result the original
    output's name)."""
    from types import SimpleNamespace

    producer = {output: node for node in quantized.graph.node for output in node.output}
    consumers = {}
    for node in quantized.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {init.name: init for init in quantized.graph.initializer}
    made_by = {output: node for node in float_proto.graph.node for output in node.output}
    graph_inputs = {value.name for value in quantized.graph.input}
    for node in quantized.graph.node:
        if node.op_type in INTEGER_OPS:
            feeds = list(dict.fromkeys(producer[name].input[0] for name in node.input  # its value and zero point
                                       if name in producer and producer[name].op_type == "DynamicQuantizeLinear"))
        elif node.op_type == "Gather" and node.input and node.input[0] in initializers \
                and initializers[node.input[0]].data_type in (onnx_int8(), onnx_uint8()):
            feeds = [name for name in node.input[1:] if name not in initializers]
        else:
            continue
        output, seen = node.output[0], 0
        while output not in made_by and seen < 8:  # Cast, Mul (scales), Add (bias), DequantizeLinear
            following = consumers.get(output, [])
            if len(following) != 1:
                break
            output, seen = following[0].output[0], seen + 1
        if output not in made_by or not feeds or not all(f in made_by or f in graph_inputs for f in feeds):
            continue
        original = made_by[output]
        yield SimpleNamespace(name=original.name, op_type=original.op_type), feeds, output, output


def onnx_int8():
    import onnx

    return onnx.TensorProto.INT8


def onnx_uint8():
    import onnx

    return onnx.TensorProto.UINT8


# --- the stage ------------------------------------------------------------------------------------------------------

ROUTES = {"eager": eager_layers, "pt2e": pt2e_layers, "onnx": onnx_layers}


def run(inputs, config, output):
    started = time.perf_counter()
    result = {"artifact_sha256": store.sha256_file(inputs["artifact"]) if "artifact" in inputs else None,
              "precision": config.precision, "layers": [], "compared": 0, "method": None}
    try:
        chunks, description = batches(config)
        if not chunks:
            raise MobileBuildError("no verification input at the example's sizes", field="verify.samples")
        with quiet.native_stderr(once=True):
            errors, method = ROUTES[config.route](inputs, config, chunks)
        ranked = errors.ranked()
        result.update(layers=ranked[:config.top], compared=len(errors.found), method=method,
                      method_detail=METHODS[method], data=description,
                      samples=sum(len(chunk[0]) for chunk in chunks))
    except Exception as exc:  # a diagnosis, not a verdict: what it cannot do is said, and the build goes on
        detail = exc.message if isinstance(exc, MobileBuildError) else f"{type(exc).__name__}: " \
                                                                        f"{modeling.first_line(exc)}"
        result["error"] = f"the per-layer comparison failed: {detail}"
    result["seconds"] = round(time.perf_counter() - started, 2)
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True, allow_nan=False)
    print(f"   {summary(result)}")


def summary(result):
    """One line: 'worst layers: features.3.conv (Conv2d) 8.1 dB, ...'."""
    if result.get("error"):
        return result["error"]
    shown = ", ".join(f"{row['name']} ({row['op']}) {row['sqnr_db']:.1f} dB" for row in result.get("layers", []))
    return f"worst layers: {shown or 'none compared'} ({result.get('method')}, {result.get('seconds')} s)"
