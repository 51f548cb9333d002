"""lm_lower: a causal LM with its static KV cache as an ExecuTorch program lowered to XNNPACK (.pte), its weights
apart (.ptd, both zipped) where its LM head stays float (routes/executorch/lm_package.py).

A Llama, Qwen2 or Qwen3 in fp32 or 8da4w goes through ExecuTorch's own export_llm
(routes/executorch/worker/export_llm.py: its custom SDPA with KV cache, about 3x the decode speed on the bundled model).
Any other model, or 8da8w: transformers' own static-cache wrapper (`TorchExportableModuleWithStaticCache`:
forward(input_ids, cache_position) -> logits, the cache held as the program's mutable buffers), exported with the
prompt's length dynamic; 8da4w and 8da8w quantize the linear layers first with ExecuTorch's own torchao transform
(extension.llm.export.quantize). The program is run once before the build keeps it. """

import os
import shutil
import tempfile
from pathlib import Path

import torch

from mobilebuild.routes.executorch import lm_package
from mobilebuild.routes.executorch.worker import export_llm, torchao_linears
from mobilebuild.routes.executorch.worker import runtime as et_runtime
from mobilebuild.routes.executorch.worker.setup import ensure_flatc, softmax_in_nchw
from mobilebuild.worker import archive, lm, progress, quiet


def lowered(model, config, keep_float=(), weights_apart=False):
    """transformers' static-cache export lowered to XNNPACK: ExecuTorch's program manager; `weights_apart`: every
    weight tagged for lm_package's WEIGHTS file, the delegate's (their placeholders' `delegate_constant_tag`, which
    XNNPACK's serializer reads) and the program's own (`external_constants`): one file, each weight stored once."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower

    torchao_linears.quantize_linears(model, config.precision, config.group_size, keep_float)
    module = lm.static_cache_module(model, config.max_context)
    sequence = lm.sequence_dim(config.max_context)
    example = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "cache_position": torch.arange(2)}
    program = lm.export(module, (), example, {"input_ids": {1: sequence}, "cache_position": {0: sequence}})
    if weights_apart:
        signature = program.graph_signature
        weights = {**signature.inputs_to_parameters, **signature.inputs_to_lifted_tensor_constants}
        for node in program.graph.nodes:
            if node.op == "placeholder" and node.name in weights:
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = lm_package.WEIGHTS
    with quiet.quiet():
        # the IR check refuses torchao's quantized-weight ops, which XNNPACK's partitioner takes
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                           compile_config=EdgeCompileConfig(_check_ir_validity=False))
        tag = (lambda node: lm_package.WEIGHTS) if weights_apart else False
        return edge.to_executorch(ExecutorchBackendConfig(external_constants=tag))


def program_bytes(model, config, keep_float=()):
    """The .pte of `lowered`, its weights inside."""
    return lowered(model, config, keep_float).buffer


def run(inputs, config, output):
    ensure_flatc()
    softmax_in_nchw()
    model = lm.causal_lm(config.model, inputs["checkpoint"])
    keep_float = torchao_linears.kept_float(model, config.exclude, config.precision)
    apart = lm_package.weights_apart(config.precision, config.exclude)
    with (tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as scratch,
          progress.while_running(f"exporting and lowering to XNNPACK ({config.precision})")):
        if export_llm.fits(model, config.precision):
            program = export_llm.write_program(model, config.precision, config.max_context, config.group_size,
                                               scratch, keep_float, weights_apart=apart)
        else:
            program = Path(scratch, lm_package.PROGRAM)
            manager = lowered(model, config, keep_float, weights_apart=apart)
            with quiet.quiet():
                manager.save(str(program))
                if apart:
                    manager.write_tensor_data_to_file(scratch)
        if apart:
            archive.write_zip({name: Path(scratch, name) for name in (lm_package.PROGRAM, lm_package.WEIGHTS)},
                              output)
        else:
            shutil.copyfile(program, output)
    generator = et_runtime.generator(output, config)  # it loads and runs before the build keeps it
    generator.forward(torch.zeros(1, 2, dtype=torch.long), 0)
