"""PyTorch Mobile with Android's Neural Networks API (.ptl from the nnapi stage).

The model runs only where libneuralnetworks.so exists, an Android device; on the host it can be loaded and its
serialized NNAPI model read, not run. The serialized model (NnapiModule.ser_model, int32 words) starts with the
header torch/backends/_nnapi/serializer.py writes: version, operand count, value count, operation count, input
count, output count; then per operand (type, rank, scale, zero point), per value 3 words, per operation (opcode,
input count, output count), then the operands' dimensions, ..., and the input and output operand ids last.
"""

import ctypes
import struct

import torch
from torch.backends._nnapi.serializer import NNAPI_OperandCode, NNAPI_OperationCode
from torch.jit.mobile import _load_for_lite_interpreter

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import modeling

NNAPI_LIBRARY = "libneuralnetworks.so"
HEADER_FIELDS = ("version", "operands", "values", "operations", "inputs", "outputs")
SUPPORTED_VERSION = 1


def _names(codes):
    return {value: name for name, value in vars(codes).items() if isinstance(value, int) and not name.startswith("_")}


OPERAND_TYPES = _names(NNAPI_OperandCode)
OPERATION_TYPES = _names(NNAPI_OperationCode)


def has_nnapi():
    try:
        ctypes.CDLL(NNAPI_LIBRARY)
    except OSError:
        return False
    return True


def load(path, config):
    if not has_nnapi():
        raise MobileBuildError(f"{path} is an NNAPI model: it runs only on an Android device with NNAPI "
                               f"(Android 8.1 or later); this host has no {NNAPI_LIBRARY}", field="targets")
    if config.engine:
        torch.backends.quantized.engine = config.engine
    return _load_for_lite_interpreter(str(path))


def parse_model(words):
    """The counts and the input/output operands of a serialized NNAPI model (a sequence of int32 words)."""
    words = [int(w) for w in words]
    if len(words) < len(HEADER_FIELDS):
        raise ValueError(f"{len(words)} words, shorter than the header")
    header = dict(zip(HEADER_FIELDS, words[:len(HEADER_FIELDS)]))
    if header["version"] != SUPPORTED_VERSION:
        raise ValueError(f"serialized NNAPI model version {header['version']}, expected {SUPPORTED_VERSION}")
    at = len(HEADER_FIELDS)
    operands = []
    for _ in range(header["operands"]):
        op_type, rank, scale_bits, zero_point = words[at:at + 4]
        scale = struct.unpack("<f", struct.pack("<i", scale_bits))[0]
        operands.append({"type": OPERAND_TYPES.get(op_type, op_type), "rank": rank, "scale": scale,
                         "zero_point": zero_point})
        at += 4
    at += 3 * header["values"]
    operations = {}
    for _ in range(header["operations"]):
        name = OPERATION_TYPES.get(words[at], str(words[at]))
        operations[name] = operations.get(name, 0) + 1
        at += 3
    for operand in operands:  # dimensions follow the operation table; 0 marks a size fixed at load time
        operand["dims"] = words[at:at + operand.pop("rank")]
        at += len(operand["dims"])
    outputs = words[len(words) - header["outputs"]:]
    inputs = words[len(words) - header["outputs"] - header["inputs"]:len(words) - header["outputs"]]
    return {**header, "operation_types": dict(sorted(operations.items())),
            "input_operands": [_describe(operands[i]) for i in inputs],
            "output_operands": [_describe(operands[i]) for i in outputs]}


def _describe(operand):
    if "QUANT" not in str(operand["type"]):
        return {"type": operand["type"], "dims": operand["dims"]}
    return {**operand, "scale": round(operand["scale"], 9)}


def _nnapi_module(module):
    found = [sub for _, sub in module.named_modules() if hasattr(sub, "ser_model")]
    return found[0] if found else None


def _loads(loader, path):
    try:
        return loader(str(path)), None
    except (RuntimeError, ValueError, OSError) as exc:  # not a model, another format, an unknown operator
        return None, modeling.first_line(exc)


def _bundled_input_count(lite, scripted):
    """What the benchmark binary would find (get_num_bundled_inputs), asked of whichever loader worked."""
    if lite is not None:
        return int(lite.run_method("get_num_bundled_inputs")) if lite.find_method("get_num_bundled_inputs") else 0
    if scripted is not None:
        return int(scripted.get_num_bundled_inputs()) if hasattr(scripted, "get_num_bundled_inputs") else 0
    return None


def _interface_mode(scripted, nnapi_model):
    """"none" when NNAPI computes in float; "core" when a float quantizer and dequantizer surround the quantized
    NNAPI model; "full" when the app passes quantized tensors."""
    if not any("QUANT" in str(op["type"]) for op in nnapi_model["input_operands"]):
        return "none"
    quantizers = [sub for _, sub in scripted.named_modules() if sub.original_name == "Quantize"]
    return "core" if quantizers else "full"


def inspect(path, config):
    lite, lite_error = _loads(_load_for_lite_interpreter, path)
    scripted, script_error = _loads(lambda p: torch.jit.load(p, map_location="cpu"), path)
    facts = {"loads": {"lite_interpreter": lite is not None, "torch.jit.load": scripted is not None},
             "bundled_inputs": _bundled_input_count(lite, scripted),
             "runs_on_host": has_nnapi()}
    errors = {name: error for name, error in (("lite_interpreter", lite_error), ("torch.jit.load", script_error))
              if error}
    if errors:
        facts["load_errors"] = errors
    holder = _nnapi_module(scripted) if scripted is not None else None
    facts["nnapi_model_present"] = holder is not None
    if holder is None:
        return facts
    try:
        facts["nnapi_model"] = parse_model(holder.ser_model.tolist())
    except (ValueError, IndexError, KeyError) as exc:
        facts["nnapi_model_error"] = str(exc)
        return facts
    facts["weights"] = {"tensors": len(holder.weights),
                        "bytes": sum(w.numel() * w.element_size() for w in holder.weights)}
    facts["mode"] = _interface_mode(scripted, facts["nnapi_model"])
    mode = getattr(config, "mode", None)
    if mode and mode != facts["mode"]:
        facts["configured_mode"] = mode
    return facts
