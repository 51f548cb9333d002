"""The ONNX graph surgery of the onnx method (onnx.py): which parts of an int8 model to compare (each quantized node
of a QDQ model with its quantize/dequantize pairs; each integer unit of a dynamically quantized one), a float model
with the tensors the comparison reads as outputs of their own, and a part cut out of the int8 model as a session of
its own."""

from types import SimpleNamespace

import onnx
import onnxruntime
from onnx.helper import make_tensor_value_info, np_dtype_to_tensor_dtype

from mobilebuild.worker.layers.common import MOVES
from mobilebuild.worker.stages import modeling


def with_outputs(proto, wanted):
    """The model with each of the `wanted` tensors its nodes compute as a graph output, declared by element type
    only: no shape, so that a dynamic dim that shape inference cannot follow (`positions[:, :seq]`) needs none."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {value.name: value.type.tensor_type.elem_type
             for value in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    listed = {value.name for value in (*model.graph.output, *model.graph.input)}
    computed = {name for node in model.graph.node for name in node.output}
    for name in sorted(wanted):
        if name in computed and name not in listed and types.get(name):
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    return model


def piece(qdq, feeds, output, dtype, values, options):
    """An ONNX Runtime session of the part of the QDQ model from the `feeds` to `output`, its inputs and output
    declared by element type only (the values come in the float model's shapes at the data's sizes), or why it
    cannot run: one line."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    declared = {name: np_dtype_to_tensor_dtype(values[name].dtype) for name in feeds}
    declared[output] = np_dtype_to_tensor_dtype(dtype)
    kept = [value for value in model.graph.value_info if value.name not in declared]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    model.graph.value_info.extend(make_tensor_value_info(name, elem, None) for name, elem in declared.items())
    try:
        extracted = onnx.utils.Extractor(model).extract_model(list(feeds), [output])
        return onnxruntime.InferenceSession(extracted.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return f"{type(exc).__name__}: {modeling.first_line(exc)}"


def quantized_nodes(qdq):
    """(node, its float inputs to feed, the output to read, the float model's name of that output, its inputs that
    stay float) for each node of a QDQ model whose activation inputs are quantized: the inputs are the tensors before
    their QuantizeLinear; the output, its DequantizeLinear's where the node's output is quantized. An input that no
    QuantizeLinear quantizes but a node computes (one of the nodes export kept float, such as an attention mask's)
    is fed the float model's value too, where it has one: the part cut out would otherwise reach back to the model's
    inputs."""
    producer = {output: node for node in qdq.graph.node for output in node.output}
    consumers = {}
    for node in qdq.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {init.name for init in qdq.graph.initializer}
    graph_inputs = {value.name for value in qdq.graph.input}
    for node in qdq.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or node.op_type in MOVES:
            continue
        feeds, unquantized = [], []
        for name in node.input:
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear":
                if name in graph_inputs or (dq is not None and dq.op_type != "Constant"):
                    unquantized.append(name)
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
        yield node, list(dict.fromkeys(feeds)), output, original, tuple(dict.fromkeys(unquantized))


INTEGER_OPS = ("MatMulInteger", "ConvInteger")  # quantize_dynamic's, fed by DynamicQuantizeLinear
RECURRENT_INTEGER_OPS = ("DynamicQuantizeLSTM",)  # quantize_dynamic's LSTM (the TorchScript exporter's), fed float


def integer_units(quantized, float_proto):
    """(the float model's node it replaces, its float inputs to feed, the output to read, that output's name in the
    float model) for each unit of a dynamically quantized model: an integer op (INTEGER_OPS) from the float tensors
    its DynamicQuantizeLinear nodes quantize, a Gather of an int8 table (an embedding) from its indices, or a
    DynamicQuantizeLSTM from its float sequence and initial states, each to the first tensor after it that the
    float model has too (quantize_dynamic gives the rescaled result the original output's name)."""
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
                and initializers[node.input[0]].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
            feeds = [name for name in node.input[1:] if name not in initializers]
        elif node.op_type in RECURRENT_INTEGER_OPS:  # its float sequence and initial states, weights int8 inside
            feeds = [name for name in node.input if name and name not in initializers]
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
        yield SimpleNamespace(name=original.name, op_type=original.op_type), feeds, output, output, ()
