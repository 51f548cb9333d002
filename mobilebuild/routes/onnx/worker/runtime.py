"""ONNX Runtime (.onnx) on the host's CPU execution provider, as an app's ONNX Runtime would run the file.

Sessions are deterministic (deterministic compute, sequential execution) and use `timing.threads` intra-op threads,
one when the node does not say: a phone app usually pins its own thread count, and one thread gives comparable
timings.
"""

import collections

import numpy
import onnx
import onnxruntime
import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.onnx.worker.guest import session_options
from mobilebuild.worker.stages import modeling

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# Operators that compute on int8 themselves (QOperator format, dynamic quantization).
INTEGER_OPS = ("ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "MatMulIntegerToFloat")


def threads_for(config):
    return int((getattr(config, "timing", None) or {}).get("threads") or 1)


class OnnxModel:
    """An InferenceSession as a callable from input tensors, in the graph's input order, to a tensor (a tuple of
    tensors for several outputs)."""

    def __init__(self, session):
        self.session = session
        self.input_names = [value.name for value in session.get_inputs()]

    def __call__(self, *tensors):
        feeds = {name: tensor.detach().cpu().contiguous().numpy()
                 for name, tensor in zip(self.input_names, tensors, strict=True)}
        outputs = [torch.from_numpy(value) for value in self.session.run(None, feeds)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def load(path, config):
    try:
        session = onnxruntime.InferenceSession(str(path), session_options(threads_for(config)),
                                               providers=["CPUExecutionProvider"])
    except Exception as exc:  # the binding raises its own exception types (Fail, InvalidGraph, NotImplemented)
        raise MobileBuildError(f"ONNX Runtime {onnxruntime.__version__} cannot load {path}: "
                               f"{modeling.first_line(exc)}", field="targets") from None
    return OnnxModel(session)


def _value_facts(value):
    kind = value.type.tensor_type
    shape = [dim.dim_value if dim.HasField("dim_value") else dim.dim_param or None for dim in kind.shape.dim]
    return {"name": value.name, "shape": shape, "dtype": onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type).name}


def _int8_compute_nodes(graph):
    """Nodes in QDQ node units (DequantizeLinear -> op -> QuantizeLinear), which ONNX Runtime runs as int8
    kernels, plus operators that compute on integers themselves."""
    producers = {out: node.op_type for node in graph.node for out in node.output}
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node.op_type)
    count = 0
    for node in graph.node:
        if node.op_type in QDQ_OPS:
            continue
        if node.op_type.startswith("QLinear") or node.op_type in INTEGER_OPS:
            count += 1
            continue
        fed_dequantized = any(producers.get(name) == "DequantizeLinear" for name in node.input)
        requantized = all(consumers[out] and set(consumers[out]) == {"QuantizeLinear"} for out in node.output)
        count += fed_dequantized and requantized
    return count


def inspect(path, config):
    """Facts read from the file: opset, node counts, how much of the graph is quantized, input/output shapes."""
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    op_types = collections.Counter(node.op_type for node in graph.node)
    qdq = sum(op_types[op] for op in QDQ_OPS)
    int8_compute = _int8_compute_nodes(graph)
    return {
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "ir_version": model.ir_version,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "nodes": len(graph.node),
        "op_types": dict(sorted(op_types.items())),
        "quantized_nodes": qdq + int8_compute,
        "qdq_nodes": qdq,
        "int8_compute_nodes": int8_compute,
        "float_nodes": len(graph.node) - qdq - int8_compute,
        "inputs": [_value_facts(value) for value in graph.input],
        "outputs": [_value_facts(value) for value in graph.output],
    }


class Generator:
    """A language model's ONNX step (lm_onnx) a step at a time (worker/lm.py): the KV cache's arrays go in as
    past_* and come back as present_*, kept here between calls."""

    def __init__(self, session):
        self.session = session
        self.cache_inputs = [value for value in session.get_inputs() if value.name.startswith("past_")]
        self.cache = None

    def forward(self, tokens, position):
        if position == 0 or self.cache is None:
            self.cache = [numpy.zeros(value.shape, dtype=numpy.float32) for value in self.cache_inputs]
        feeds = {"input_ids": tokens.numpy(), "cache_position": numpy.arange(position, position + tokens.shape[1]),
                 **{value.name: array for value, array in zip(self.cache_inputs, self.cache)}}
        logits, *self.cache = self.session.run(None, feeds)
        return torch.from_numpy(logits)


def generator(path, config):
    return Generator(load(path, config).session)
