"""lm_onnx: a causal LM as ONNX, one step with its static KV cache as inputs and outputs (past_key_<i>,
past_value_<i> -> present_key_<i>, present_value_<i>, each [1, heads, max_context, head size]), the prompt's length
dynamic; int8: onnxruntime's dynamic quantization of its weights (`quantize_dynamic`, int8 MatMul weights)."""

import os
import tempfile

import torch

from mobilebuild.worker import lm, quiet


def run(inputs, config, output):
    model = lm.causal_lm(config.model, inputs["checkpoint"])
    module = lm.CacheInOut(model, config.max_context).eval()
    past = module.empty()
    names = lm.cache_names(len(past) // 2)
    sequence = lm.sequence_dim(config.max_context)
    example = (torch.zeros(1, 2, dtype=torch.long), torch.arange(2), *past)
    program = lm.export(module, example, {},
                        {"input_ids": {1: sequence}, "cache_position": {0: sequence}, "past": (None,) * len(past)})
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as scratch:
        exported = os.path.join(scratch, "float.onnx")
        with quiet.quiet(), torch.no_grad():
            onnx_program = torch.onnx.export(
                program, dynamo=True, opset_version=18, verbose=False,
                input_names=["input_ids", "cache_position", *names],
                output_names=["logits", *(name.replace("past_", "present_") for name in names)])
            onnx_program.save(exported)
        if config.precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantized = os.path.join(scratch, "int8.onnx")
            with quiet.quiet():
                quantize_dynamic(exported, quantized, weight_type=QuantType.QInt8)
            exported = quantized
        from mobilebuild.worker.runtimes import onnxruntime as ort_runtime

        ort_runtime.generator(exported, config).forward(torch.zeros(1, 2, dtype=torch.long), 0)
        os.replace(exported, output)
