"""LiteRT models (.tflite) in the host's LiteRT interpreter (`ai_edge_litert.interpreter.Interpreter`), on its CPU
path: the XNNPACK delegate, which the interpreter applies by default, as an Android app's default LiteRT does.

Inputs and outputs go in the model's own order (the subgraph's, which is the flattened order of forward's arguments
and of the returned structure). Each input is cast to the dtype the model takes (the converter narrows int64 to int32)
and, where the model's input is int8 (`litert: {io: int8}`), quantized with that tensor's scale and zero point, as an
app feeding it would; int8 outputs are dequantized the same way, so that verify compares real numbers.

config: "timing": {"threads": n} is the interpreter's `num_threads` (XNNPACK's thread pool); one where unset.
"""

import collections
from pathlib import Path

import numpy
import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.quiet import native_stderr
from mobilebuild.worker.stages import modeling

# What the interpreter writes to the process's stderr on every load: absl's preamble, the delegate's creation and a
# deprecated XNNPACK flag it sets itself. They say nothing about the model.
NOTES = (b"INFO: Created TensorFlow Lite XNNPACK delegate", b"ERROR: Subgraph reshaping is enabled by default",
         b"WARNING: All log messages before absl::InitializeLog()", b"INFO: Initialized TensorFlow Lite runtime")
INTEGER_IO = (numpy.int8, numpy.uint8, numpy.int16)


def threads_for(config):
    return int((getattr(config, "timing", None) or {}).get("threads") or 1)


def interpreter(source, threads=1, preserve=False):
    """A LiteRT interpreter of a .tflite path or its bytes, its tensors allocated; `preserve`: every intermediate
    tensor kept readable after a run (the per-layer comparison)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    where = {"model_content": source} if isinstance(source, bytes) else {"model_path": str(source)}
    with native_stderr(dropped=NOTES):
        try:
            # preserved tensors are only those LiteRT's own kernels write: the XNNPACK delegate keeps its
            # intermediates to itself (read back, they are stale), so the comparison runs without it
            kernels = {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES} \
                if preserve else {}
            found = Interpreter(**where, num_threads=threads, experimental_preserve_all_tensors=preserve, **kernels)
            found.allocate_tensors()
        except (ValueError, RuntimeError) as exc:  # the binding raises these for bad files and missing kernels
            name = Path(source).name if not isinstance(source, bytes) else "the model"
            raise MobileBuildError(f"LiteRT's interpreter cannot load {name}: {modeling.first_line(exc)}",
                                   field="targets") from None
    return found


def to_model(value, detail):
    """A tensor as the model's input `detail` takes it: its dtype, int8 quantized with its scale and zero point."""
    array = value.detach().cpu().contiguous().numpy()
    dtype = detail["dtype"]
    scale, zero_point = detail["quantization"]
    if dtype in INTEGER_IO and scale:
        info = numpy.iinfo(dtype)
        return numpy.clip(numpy.round(array / scale + zero_point), info.min, info.max).astype(dtype)
    return array.astype(dtype, copy=False)


def from_model(array, detail):
    scale, zero_point = detail["quantization"]
    if detail["dtype"] in INTEGER_IO and scale:
        array = (array.astype(numpy.float32) - zero_point) * scale
    return torch.from_numpy(numpy.array(array))


class LitertModel:
    """An interpreter as a callable from input tensors, in forward's order, to a tensor (a tuple for several)."""

    def __init__(self, found):
        self.interpreter = found
        self.inputs, self.outputs = found.get_input_details(), found.get_output_details()

    def __call__(self, *tensors):
        found = self.interpreter
        for detail, tensor in zip(self.inputs, tensors, strict=True):
            if list(detail["shape"]) != list(tensor.shape):
                raise MobileBuildError(f"the .tflite takes {detail['name']} at {list(detail['shape'])} only, not "
                                       f"{list(tensor.shape)}", field="inputs")
            found.set_tensor(detail["index"], to_model(tensor, detail))
        found.invoke()
        produced = [from_model(found.get_tensor(detail["index"]), detail) for detail in self.outputs]
        return produced[0] if len(produced) == 1 else tuple(produced)


def load(path, config):
    return LitertModel(interpreter(path, threads_for(config)))


def _tensor_facts(detail):
    scale, zero_point = detail["quantization"]
    return {"name": detail["name"], "shape": [int(n) for n in detail["shape_signature"]],
            "dtype": numpy.dtype(detail["dtype"]).name, **({"scale": float(scale), "zero_point": int(zero_point)}
                                                           if scale else {})}


def inspect(path, config):
    """Facts read from the file without running it: operators, how many compute on integers, the constant tensors'
    dtypes, the inputs and outputs. The host reads them for device-only targets too (the file is the same format)."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
    graph = model.subgraphs[0]
    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    dtypes = {value: name.lower() for name, value in vars(schema.TensorType).items() if not name.startswith("_")}
    kinds = [names.get(model.operatorCodes[op.opcodeIndex].builtinCode, "CUSTOM") for op in graph.operators or ()]
    integer = sum(1 for kind, op in zip(kinds, graph.operators or ()) if kind not in ("QUANTIZE", "DEQUANTIZE")
                  and any(graph.tensors[i].type in INTEGER_TYPES for i in op.inputs if i >= 0))
    constants = collections.Counter(dtypes[tensor.type] for tensor in graph.tensors if _holds_data(model, tensor))
    found = interpreter(path)
    return {"operators": len(kinds), "op_types": dict(sorted(collections.Counter(kinds).items())),
            "int8_operators": integer, "constant_dtypes": dict(sorted(constants.items())),
            "inputs": [_tensor_facts(d) for d in found.get_input_details()],
            "outputs": [_tensor_facts(d) for d in found.get_output_details()], "bytes": Path(path).stat().st_size}


INTEGER_TYPES = (9, 3, 7)  # schema.TensorType INT8, UINT8, INT16


def _holds_data(model, tensor):
    buffer = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
    return buffer is not None and (buffer.data is not None and len(buffer.data) > 0 or bool(buffer.offset))


# --- language models (lm_litert) ----------------------------------------------------------------------------------

class Generator:
    """A language model's .tflite (lm_litert) a step at a time (worker/lm.py), through its signatures: a prompt of
    a length it was built for goes through that `prefill_<n>` (the logits of every position), one token through
    `decode`; the KV cache's arrays (kv_cache_k_<i>, kv_cache_v_<i>) go in and come back, kept here between calls."""

    all_positions = False  # its prefills take their own lengths only: a perplexity window goes a token at a time

    def __init__(self, found):
        self.runners = {name: found.get_signature_runner(name) for name in found.get_signature_list()}
        self.cache_inputs = {name: detail for name, detail in self.runners["decode"].get_input_details().items()
                             if name.startswith("kv_cache_")}
        self.cache = None

    def forward(self, tokens, position):
        length = tokens.shape[1]
        name = "decode" if length == 1 else f"prefill_{length}"
        if name not in self.runners:
            built = sorted(int(n.removeprefix("prefill_")) for n in self.runners if n.startswith("prefill_"))
            raise MobileBuildError(f"the .tflite prefills prompts of {', '.join(map(str, built))} tokens only, not "
                                   f"{length} (generate.prompt_lengths when it was built)", field="generate")
        if position == 0 or self.cache is None:
            self.cache = {name: numpy.zeros(detail["shape"], dtype=detail["dtype"])
                          for name, detail in self.cache_inputs.items()}
        found = self.runners[name](tokens=tokens.numpy().astype(numpy.int32),
                                   input_pos=numpy.arange(position, position + length, dtype=numpy.int32),
                                   **self.cache)
        self.cache = {name: found[name] for name in self.cache_inputs}
        return torch.from_numpy(numpy.array(found["logits"]))


def generator(path, config):
    """`path`: a .tflite file, or its bytes."""
    return Generator(interpreter(path, threads_for(config)))
