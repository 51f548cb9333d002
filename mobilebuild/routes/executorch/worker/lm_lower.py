"""lm_lower: a causal LM with its static KV cache as an ExecuTorch program lowered to XNNPACK (.pte).

A Llama, Qwen2 or Qwen3 in fp32 or 8da4w goes through ExecuTorch's own export_llm
(routes/executorch/worker/export_llm.py: its custom SDPA with KV cache, about 3x the decode speed on the bundled model).
Any other model, or 8da8w: transformers' own static-cache wrapper (`TorchExportableModuleWithStaticCache`:
forward(input_ids, cache_position) -> logits, the cache held as the program's mutable buffers), exported with the
prompt's length dynamic; 8da4w and 8da8w quantize the linear layers first with ExecuTorch's own torchao transform
(extension.llm.export.quantize). The program is run once before it is written. """

import os
import tempfile

import torch

from mobilebuild.routes.executorch.worker import export_llm, torchao_linears
from mobilebuild.routes.executorch.worker import runtime as et_runtime
from mobilebuild.routes.executorch.worker.setup import ensure_flatc, softmax_in_nchw
from mobilebuild.worker import lm, quiet


def program_bytes(model, config, keep_float=()):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    torchao_linears.quantize_linears(model, config.precision, config.group_size, keep_float)
    module = lm.static_cache_module(model, config.max_context)
    sequence = lm.sequence_dim(config.max_context)
    example = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "cache_position": torch.arange(2)}
    program = lm.export(module, (), example, {"input_ids": {1: sequence}, "cache_position": {0: sequence}})
    with quiet.quiet():
        # the IR check refuses torchao's quantized-weight ops, which XNNPACK's partitioner takes
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                           compile_config=EdgeCompileConfig(_check_ir_validity=False))
        return edge.to_executorch().buffer


def run(inputs, config, output):
    ensure_flatc()
    softmax_in_nchw()
    model = lm.causal_lm(config.model, inputs["checkpoint"])
    keep_float = torchao_linears.kept_float(model, config.exclude, config.precision)
    if export_llm.fits(model, config.precision):
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as scratch:
            data = export_llm.program_bytes(model, config.precision, config.max_context, config.group_size, scratch,
                                            keep_float)
    else:
        data = program_bytes(model, config, keep_float)
    generator = et_runtime.generator(data, config)  # it runs on the host before it is written
    generator.forward(torch.zeros(1, 2, dtype=torch.long), 0)
    with open(output, "wb") as handle:
        handle.write(data)
