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
from mobilebuild.routes.litert.worker import guest
from mobilebuild.worker.quiet import native_stderr
from mobilebuild.worker.stages import modeling

# What the interpreter writes to the process's stderr on every load: absl's preamble, the delegate's creation and a
# deprecated XNNPACK flag it sets itself. They say nothing about the model.
NOTES = (b"INFO: Created TensorFlow Lite XNNPACK delegate", b"ERROR: Subgraph reshaping is enabled by default",
         b"WARNING: All log messages before absl::InitializeLog()", b"INFO: Initialized TensorFlow Lite runtime")
INTEGER_IO = guest.INTEGER_IO


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
    """A tensor as the model's input `detail` takes it (guest.litert.to_model)."""
    return guest.to_model(value.detach().cpu().contiguous().numpy(), detail)


def from_model(array, detail):
    return torch.from_numpy(guest.from_model(array, detail))


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
    dtypes = {value: name.lower() for name, value in vars(schema.TensorType).items() if not name.startswith("_")}
    kinds = _kinds(model)
    integer = sum(1 for kind, op in zip(kinds, graph.operators or ()) if kind not in ("QUANTIZE", "DEQUANTIZE")
                  and any(graph.tensors[i].type in INTEGER_TYPES for i in op.inputs if i >= 0))
    constants = collections.Counter(dtypes[tensor.type] for tensor in graph.tensors if _size(model, tensor))
    found = interpreter(path)
    return {"operators": len(kinds), "op_types": dict(sorted(collections.Counter(kinds).items())),
            "int8_operators": integer, "constant_dtypes": dict(sorted(constants.items())), **weights(model),
            "inputs": [_tensor_facts(d) for d in found.get_input_details()],
            "outputs": [_tensor_facts(d) for d in found.get_output_details()], "bytes": Path(path).stat().st_size}


INTEGER_TYPES = (9, 3, 7)  # schema.TensorType INT8, UINT8, INT16
FLOAT_TYPES = (0, 1, 10)  # FLOAT32, FLOAT16, FLOAT64


def weights(model):
    """The bytes of the model's weights (its constant tensors) stored float and stored quantized (an integer tensor
    with a scale: not a shape or an axis), each buffer once, and the float ones by the operators that read them: a
    quantized model whose converter left an operator float (litert-torch's CONV_3D) shows it here. `model`: a
    schema.ModelT."""
    graph = model.subgraphs[0]
    owners = {}  # buffer -> the operator kinds that read it
    for kind, op in zip(_kinds(model), graph.operators or ()):
        for index in op.inputs:
            if index >= 0 and kind not in ("QUANTIZE", "DEQUANTIZE"):
                owners.setdefault(graph.tensors[index].buffer, set()).add(kind)
    stored, by_operator = {"float": 0, "quantized": 0}, collections.Counter()
    for buffer, tensor in {tensor.buffer: tensor for tensor in graph.tensors if _size(model, tensor)}.items():
        scaled = tensor.quantization is not None and len(tensor.quantization.scale if tensor.quantization.scale
                                                          is not None else ()) > 0
        if tensor.type in FLOAT_TYPES:
            stored["float"] += _size(model, tensor)
            for kind in sorted(owners.get(buffer, ())):
                by_operator[kind] += _size(model, tensor)
        elif tensor.type in (*INTEGER_TYPES, 2) and scaled:  # 2: INT32, a quantized bias
            stored["quantized"] += _size(model, tensor)
    total = stored["float"] + stored["quantized"]
    return {"weight_bytes": stored, "float_weight_share": round(stored["float"] / total, 4) if total else None,
            "float_weights_by_operator": dict(by_operator.most_common())}


def float_weights_line(facts):
    """One line where most of an int8 model's weight bytes are float, naming the operators that read them (with
    their share of the float bytes); or None."""
    share, total = facts["float_weight_share"], facts["weight_bytes"]["float"]
    if share is None or share <= 0.5:
        return None
    kinds = ", ".join(f"{kind} ({100 * count / total:.0f}%)" for kind, count in
                      facts["float_weights_by_operator"].items() if count * 200 >= total)  # what rounds to 1% or more
    return f"{100 * share:.0f}% of the int8 model's weight bytes stay float, read by {kinds or 'no operator'}"


def _kinds(model):
    from ai_edge_litert import schema_py_generated as schema

    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    return [names.get(model.operatorCodes[op.opcodeIndex].builtinCode, "CUSTOM") for op in model.subgraphs[0].operators
            or ()]


def _size(model, tensor):
    """The bytes a constant tensor holds (0 for a tensor computed as the model runs)."""
    buffer = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
    if buffer is None:
        return 0
    return len(buffer.data) if buffer.data is not None else int(buffer.size or 0) if buffer.offset else 0


# --- language models (lm_litert) ----------------------------------------------------------------------------------

class Generator:
    """A language model's .tflite (lm_litert) a step at a time (worker/lm.py), through its signatures: a prompt of
    a length it was built for goes through that `prefill_<n>` (the logits of every position), one token through
    `decode`; the KV cache's arrays (kv_cache_k_<i>, kv_cache_v_<i>) go in and come back, kept here between calls.
    A model that takes its attention mask (LiteRT-LM's) gets the causal one: each position sees itself and what came
    before it in the cache."""

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
        positions = numpy.arange(position, position + length, dtype=numpy.int32)
        mask = {}
        if "mask" in self.runners[name].get_input_details():
            context = self.runners[name].get_input_details()["mask"]["shape"][-1]
            mask["mask"] = numpy.where(numpy.arange(context)[None, :] > positions[:, None], -numpy.inf,
                                       0.0).astype(numpy.float32)[None, None]
        found = self.runners[name](tokens=tokens.numpy().astype(numpy.int32), input_pos=positions, **mask,
                                   **self.cache)
        self.cache = {name: found[name] for name in self.cache_inputs}
        return torch.from_numpy(numpy.array(found["logits"]))


def generator(path, config):
    """`path`: a .tflite file, or its bytes."""
    return Generator(interpreter(path, threads_for(config)))
