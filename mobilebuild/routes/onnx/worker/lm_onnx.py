"""lm_onnx: a causal LM as ONNX, one step with its static KV cache as inputs and outputs (past_key_<i>,
past_value_<i> -> present_key_<i>, present_value_<i>, each [1, heads, max_context, head size]), the prompt's length
dynamic; int8: onnxruntime's dynamic quantization of its weights (`quantize_dynamic`, int8 MatMul weights); int4:
its MatMulNBits quantizer (int4 MatMul weights in blocks of generate.group_size, symmetric)."""

import os
import tempfile

import onnx
import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.onnx.worker import export, tied_head
from mobilebuild.routes.onnx.worker import runtime as ort_runtime
from mobilebuild.worker import lm, quiet
from mobilebuild.worker.stages import exclusion


def int8_weights(source, output, config, excluded=()):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(source, output, weight_type=QuantType.QInt8, nodes_to_exclude=list(excluded))


def int4_weights(source, output, config, excluded=()):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(source), block_size=config.group_size, is_symmetric=True,
                                     nodes_to_exclude=list(excluded))
    quantizer.process()
    quantizer.model.save_model_to_file(output, use_external_data_format=False)


QUANTIZERS = {"int8": int8_weights, "int4": int4_weights}
ONE_FILE_LIMIT = 2**31 - 1  # the bytes one .onnx file holds: protobuf serializes no larger message
SCOPE = "model"  # the causal LM's path inside CacheInOut: the exporter's module paths start with it


def export_float(model, max_context, path):
    """The model's one step with its cache (CacheInOut) exported by torch.onnx to `path`, with the exporter's module
    paths on its nodes."""
    module = lm.CacheInOut(model, max_context).eval()
    past = module.empty()
    names = lm.cache_names(len(past) // 2)
    sequence = lm.sequence_dim(max_context)
    example = (torch.zeros(1, 2, dtype=torch.long), torch.arange(2), *past)
    program = lm.export(module, example, {},
                        {"input_ids": {1: sequence}, "cache_position": {0: sequence}, "past": (None,) * len(past)})
    with quiet.quiet(), torch.no_grad():
        onnx_program = torch.onnx.export(
            program, dynamo=True, opset_version=18, verbose=False, input_names=["input_ids", "cache_position", *names],
            output_names=["logits", *(name.replace("past_", "present_") for name in names)])
        onnx_program.save(path)


def module_nodes(path, paths):
    """The names of the nodes the exporter made for the model's modules at `paths` (exclusion.resolve's)."""
    return export.excluded_nodes(onnx.load(path, load_external_data=False), [f"{SCOPE}.{name}" for name in paths])


def kept_float(model, path, entries):
    """The nodes quantize.exclude's entries (module paths or class names of the model) keep float; an entry whose
    modules made no node is one line."""
    found = []
    for name in exclusion.resolve(model, entries or []):
        nodes = module_nodes(path, [name])
        if not nodes:
            raise MobileBuildError(f"{name}: the ONNX export made no node for it, nothing to keep float",
                                   field="quantize.exclude")
        found += nodes
    return found


def quantized(source, output, config, excluded=()):
    with quiet.quiet():
        QUANTIZERS[config.precision](source, output, config, excluded)


def run(inputs, config, output):
    model = lm.causal_lm(config.model, inputs["checkpoint"])
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as scratch:
        exported = os.path.join(scratch, "float.onnx")
        export_float(model, config.max_context, exported)
        if config.precision != "fp32":
            excluded = kept_float(model, exported, config.exclude)
            quantized(exported, os.path.join(scratch, f"{config.precision}.onnx"), config, excluded)
            exported = os.path.join(scratch, f"{config.precision}.onnx")
        # without the source paths torch's node metadata holds, which differ between checkouts
        proto = export.reproducible(onnx.load(exported))
        tied_head.share(proto)  # an LM head tied to the embedding, which the exporter stored again: stored once
        check_one_file(proto, config.precision)
        data = proto.SerializeToString()
    with open(output, "wb") as handle:
        handle.write(data)
    ort_runtime.generator(output, config).forward(torch.zeros(1, 2, dtype=torch.long), 0)  # it loads and runs


def check_one_file(proto, precision):
    """One line where the model cannot be one .onnx file (protobuf's 2 GB; Llama-3.2-1B in fp32 is 4.9 GB), instead
    of protobuf's EncodeError as a crash."""
    weights = sum(len(tensor.raw_data) for tensor in proto.graph.initializer)
    if weights >= ONE_FILE_LIMIT:
        raise MobileBuildError(f"its {precision} ONNX model holds {weights / 1e9:.2f} GB of weights, and one .onnx "
                               "file holds under 2 GB (protobuf's limit): build int4 or int8, or for "
                               "onnxruntime-genai (runtime: onnxruntime-genai: its model folder keeps the weights in "
                               "a file of their own)", field="targets")
