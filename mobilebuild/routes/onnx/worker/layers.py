"""onnx: the shipped int8 .onnx against the float model exported again, run with each tensor the comparison needs as
an output of its own, in the shape it has at the data's sizes (whatever shape inference could declare: a dynamic dim's
`positions[:, :seq]` has none); each quantized node of the QDQ model, cut out with its quantize/dequantize pairs
(onnx.utils.Extractor), runs on the float model's inputs (an input export kept float, as an attention mask, included);
onnxruntime.quantization.qdq_loss_debug's create_weight_matching/compute_weight_error add each node's weight SQNR (its
weight's, not its bias's), without its log lines about the copies of a shared bias. A dynamically quantized model
(quantize_dynamic) has no QDQ pairs: each integer unit (DynamicQuantizeLinear, then MatMulInteger or ConvInteger and
the float ops that rescale its result; a Gather of an int8 table and its DequantizeLinear) is cut out from the float
tensor it quantizes to the float model's tensor it replaces. ONNX node names map back to module paths through the
exporter's name scopes. The graph surgery (what to cut out, and cutting it) is onnx_surgery.py's."""

import ast
import math
import tempfile
from pathlib import Path

import numpy
import onnx
import onnxruntime
import torch
from onnxruntime.quantization import qdq_loss_debug

from mobilebuild.routes.onnx.worker import export, onnx_surgery
from mobilebuild.worker import capture_root, metrics, progress, quiet
from mobilebuild.worker.layers.common import Errors
from mobilebuild.worker.stages import fuse, modeling

DETAIL = ("each quantized node of the shipped QDQ model, with its Q/DQ pairs, run on the float model's inputs (read "
          "from an onnxruntime run of the float model); weight SQNR from onnxruntime.quantization.qdq_loss_debug")


def compare(inputs, config, chunks):
    """The layers hook (see mobilebuild.worker.stages.layers): each quantized node (or integer unit) of the shipped
    model, cut out, on the float model's values."""
    progress.note("exporting the float model again")
    exporting = config.options or {}
    model = capture_root.nested(fuse.load(inputs["model"], config), len(config.inputs))
    proto = export.export_float(model, config.inputs, exporting.get("opset"),
                                config.outputs, exporting.get("exporter"), notes=False)
    qdq = onnx.load(inputs["artifact"])
    names = [spec["name"] for spec in config.inputs]
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    float_model = export.reproducible(onnx.load_from_string(proto.SerializeToString()))
    with tempfile.TemporaryDirectory(prefix="mobilebuild-layers-") as folder:
        float_path, qdq_path = Path(folder) / "float.onnx", Path(folder) / "qdq.onnx"
        onnx.save(float_model, float_path)
        onnx.save(qdq, qdq_path)
        weights = _weight_errors(float_path, qdq_path)
    layers = list(onnx_surgery.quantized_nodes(qdq)) + list(onnx_surgery.integer_units(qdq, proto))
    labels = _labels(proto, [node for node, *_ in layers])
    wanted = {name for _, feeds, _, original, unquantized in layers for name in (*feeds, original, *unquantized)}
    # The float model with each tensor the comparison reads as an output of its own, in the shape it has at the
    # data's sizes (whatever shapes inference could or could not declare for it)
    floating = onnxruntime.InferenceSession(onnx_surgery.with_outputs(float_model, wanted).SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
    produced = [value.name for value in floating.get_outputs()]
    pieces = {}  # node name -> its session, or why it has none
    errors = Errors()
    for chunk in chunks:
        feed = {name: x.contiguous().numpy() for name, x in zip(names, chunk)}
        values = dict(zip(produced, floating.run(None, feed))) | feed
        for node, feeds, output, original, unquantized in layers:
            if original not in values or any(name not in values for name in feeds):
                continue
            feeds = list(dict.fromkeys([*feeds, *(name for name in unquantized if name in values)]))
            name, op = labels[node.name]
            if node.name not in pieces:
                pieces[node.name] = onnx_surgery.piece(qdq, feeds, output, values[original].dtype, values, options)
            piece = pieces[node.name]
            if not isinstance(piece, str):
                try:
                    (result,) = piece.run([output], {feed_name: values[feed_name] for feed_name in feeds})
                except Exception as exc:
                    piece = pieces[node.name] = f"{type(exc).__name__}: {modeling.first_line(exc)}"
            if isinstance(piece, str):
                errors.skip(name, op, f"its {node.op_type} {node.name} cannot run alone: {piece}")
                continue
            extra = {"weight_sqnr_db": weights[node.name]} if node.name in weights else {}
            errors.add(name, op, torch.from_numpy(numpy.asarray(values[original])),
                       torch.from_numpy(numpy.asarray(result)), part=f"{node.op_type} {node.name}", **extra)
    return errors, "onnx", DETAIL


def _labels(proto, nodes):
    """ONNX node name -> (name, op) for each node compared, from the exporter's name scopes: the innermost module
    and its class where no module runs inside it (Linear, MultiheadAttention); in a container, the ONNX op,
    numbered where the container has several (a TransformerEncoderLayer's residual `Add #1`, `Add #2`); without
    a scope, the node's own name and op."""
    scopes, around = _scopes(proto)
    named, counts = {}, {}
    for node in nodes:
        path, kind = scopes.get(node.name, (None, None))
        if not path or not kind:
            named[node.name] = (node.name, node.op_type)
        elif path not in around:
            named[node.name] = (path, kind)
        else:
            named[node.name] = (path, node.op_type)
            counts[(path, node.op_type)] = counts.get((path, node.op_type), 0) + 1
    seen = {}
    for node in nodes:
        path, op = named[node.name]
        if counts.get((path, op), 0) > 1:
            seen[(path, op)] = seen.get((path, op), 0) + 1
            named[node.name] = (path, f"{op} #{seen[(path, op)]}")
    return named


def _scopes(proto):
    """(ONNX node name -> (module path, class name), the module paths other modules run inside) from the exporter's
    metadata."""
    found, around = {}, set()
    for node in proto.graph.node:
        meta = {entry.key: entry.value for entry in node.metadata_props}
        try:
            scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "None")) or []
            classes = ast.literal_eval(meta.get("pkg.torch.onnx.class_hierarchy", "None")) or []
        except (ValueError, SyntaxError):
            continue
        # name_scopes: the root '', each module's path, the node's own name; class_hierarchy: their classes. A
        # capture root's node is the model's root's
        if len(scopes) > 2 and scopes[-2] and scopes[-2] != capture_root.ROOT:
            kind = classes[len(scopes) - 2] if len(classes) >= len(scopes) - 1 else None
            found[node.name] = (scopes[-2], kind.rsplit(".", 1)[-1] if isinstance(kind, str) else None)
            around.update(path for path in scopes[1:-2] if path)
    return found, around


# create_weight_matching logs an error for each quantized constant of the QDQ model that the float model has no
# initializer of, as normal models have: quantize_static quantizes a bias that several nodes share (the exporter
# merges equal initializers, such as an untrained model's LayerNorm biases) once per node, under a new name
# ('encoder.layers.0.norm1.bias0'). Such a copy just has no weight SQNR.
UNMATCHED_WEIGHT = r"^Model Error in '[^']*': weight tensor '[^']*' not found!$"


def _weight_errors(float_path, qdq_path):
    """ONNX node name -> the SQNR of its quantized weight: its first quantized constant input (the weight, before the
    bias) whose float values are not all zero (no signal: an untrained bias)."""
    try:
        with quiet.dropped_logs("qdq_loss_debug", UNMATCHED_WEIGHT):
            matched = qdq_loss_debug.create_weight_matching(str(float_path), str(qdq_path))
        errors = qdq_loss_debug.compute_weight_error(matched)
    except Exception:  # a debugging aid: the layer ranking does not need it
        return {}
    found = {}
    for node in onnx.load(str(float_path)).graph.node:
        for name in node.input:
            if name in errors and numpy.any(matched[name]["float"]) and math.isfinite(errors[name]):
                found[node.name] = round(min(float(errors[name]), metrics.SQNR_CEILING_DB), 2)  # exact: the ceiling
                break
    return found
