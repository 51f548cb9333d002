"""ExecuTorch's own LLM export (`export_llm`: its Llama definition, its custom SDPA-with-KV-cache op, XNNPACK) for a
transformers Llama, Qwen2 or Qwen3, where it fits: the lm_lower stage's fast path.

On the bundled tiny Llama, export_llm's program decoded about 3x faster than transformers' static-cache export
lowered the same way (most of the latter's operators, the mask and the cache update, run outside the delegate):
benchmarks/llm_vs_export_llm.py. The weights are mapped to Meta's Llama names by ExecuTorch's own Qwen3
converter's table, `use_hf_rope` keeping transformers' rotary layout; verification compares the
program with the transformers model, so a mapping that went wrong cannot pass.

Its program takes (tokens [1, T], input_pos [1]) and returns the last position's logits [1, vocab]; an app runs it
with a runtime that has ExecuTorch's custom ops kernels (`llama::custom_sdpa`, `llama::update_cache`), as the LLM
runner does.
"""

import contextlib
import json
import os
import tempfile

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.executorch import lm_package
from mobilebuild.routes.executorch.worker import torchao_linears
from mobilebuild.worker import quiet

PRECISIONS = {"fp32": None, "8da4w": "8da4w"}  # ours -> export_llm's qmode
# What export_llm's Llama (examples/models/llama/model.py) finds anywhere in a checkpoint's path to take it for an
# already quantized one, whose linear layers it swaps for quantized ones: a float checkpoint at such a path (a recipe
# named "llama-8da4w": its scratch folder below the artifacts) failed to export ("Expected: torch.int8")
PREQUANTIZED = ("int8", "8da4w")
METADATA_METHOD = "get_max_seq_len"  # a method export_llm's programs have, for the LLM runner
# The transformers families ExecuTorch's Llama definition builds (as its own qwen2_5 / qwen3 configs set it up):
# model_type -> its ModelArgs beyond the sizes. Qwen2: biases on q, k and v; Qwen3: RMSNorm on each head's queries
# and keys before the rotary embedding.
FAMILIES = {"llama": {}, "qwen2": {"attention_qkv_bias": True},
            "qwen3": {"use_qk_norm": True, "qk_norm_before_rope": True}}


def fits(model, precision):
    """Whether export_llm's Llama definition builds this model exactly: a Llama, Qwen2 or Qwen3 with no biases of
    its own choosing, default rotary, SiLU and every layer full attention, in a precision export_llm makes."""
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    return (config.model_type in FAMILIES and precision in PRECISIONS
            and not getattr(config, "attention_bias", False) and not getattr(config, "mlp_bias", False)
            and rope.get("rope_type", "default") == "default" and config.hidden_act == "silu"
            and set(getattr(config, "layer_types", None) or ["full_attention"]) == {"full_attention"})


def meta_name(path):
    """A transformers weight (or module) path under Meta's names, by ExecuTorch's own Qwen3 converter's mapping (a
    Llama's names are a subset of it): `model.layers.0.self_attn.q_proj` -> `layers.0.attention.wq`; a bias
    under its weight's name (Qwen2's, as ExecuTorch's Qwen 2.5 converter maps them; that module needs torchtune,
    not installed)."""
    from executorch.examples.models.checkpoint import get_mapped_key
    from executorch.examples.models.qwen3.convert_weights import _QWEN_3_FROM_META

    stem, kind = path.rsplit(".", 1) if path.endswith((".weight", ".bias")) else (path, "")
    mapped = get_mapped_key(f"{stem}.weight", {hf: meta for meta, hf in _QWEN_3_FROM_META.items()})
    return mapped.removesuffix(".weight") + (f".{kind}" if kind else "")


def meta_state(model):
    """The transformers model's weights under Meta's names (meta_name); a tied lm_head: the embedding's."""
    found = {meta_name(key): value for key, value in model.state_dict().items()}
    found.setdefault("output.weight", found["tok_embeddings.weight"])
    return found


def params(config):
    """export_llm's params.json (ModelArgs) for the configuration."""
    return {"dim": config.hidden_size, "n_layers": config.num_hidden_layers, "n_heads": config.num_attention_heads,
            "n_kv_heads": config.num_key_value_heads, "vocab_size": config.vocab_size,
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            "hidden_dim": config.intermediate_size, "norm_eps": config.rms_norm_eps,
            "rope_theta": config.rope_parameters["rope_theta"], "use_hf_rope": True,
            **FAMILIES[config.model_type]}


def program_bytes(model, precision, max_context, group_size, scratch, keep_float=()):
    """write_program's .pte, its weights inside."""
    with open(write_program(model, precision, max_context, group_size, scratch, keep_float), "rb") as handle:
        return handle.read()


def write_program(model, precision, max_context, group_size, scratch, keep_float=(), weights_apart=False):
    """export_llm (export_llama with an LlmConfig, as its command line builds one) for the model's weights: KV cache
    and custom SDPA on, the prompt's length dynamic, XNNPACK; 8da4w: its torchao quantization in groups. With linear
    layers kept float (`keep_float`, transformers paths), export_llama's own steps for XNNPACK, its model quantized
    between them by ExecuTorch's torchao transform with those layers passed over (its quantization takes no filter).
    Writes lm_package's PROGRAM in `scratch` and returns its path; `weights_apart`: every weight in its WEIGHTS
    beside it (export_llm's foundation_weights_file)."""
    with quiet.native_stderr(dropped=b"I tokenizers:"):  # its tokenizers' registration note, at import
        from executorch.examples.models.llama import export_llama_lib
        from executorch.extension.llm.export.config.llm_config import LlmConfig

    output = os.path.join(scratch, lm_package.PROGRAM)
    with _checkpoint_folder(scratch) as folder:
        checkpoint, settings = os.path.join(folder, "meta.pth"), os.path.join(folder, "params.json")
        torch.save(meta_state(model), checkpoint)
        with open(settings, "w") as handle:
            json.dump(params(model.config), handle)
        llm = LlmConfig()
        llm.base.checkpoint, llm.base.params = checkpoint, settings
        llm.model.use_kv_cache = llm.model.use_sdpa_with_kv_cache = llm.model.enable_dynamic_shape = True
        llm.export.max_seq_length = llm.export.max_context_length = max_context
        llm.export.output_dir, llm.export.output_name = scratch, output  # a name ending .pte is the path
        llm.export.foundation_weights_file = lm_package.WEIGHTS if weights_apart else None  # written in output_dir
        llm.backend.xnnpack.enabled = llm.backend.xnnpack.extended_ops = True
        with quiet.quiet():
            if keep_float and PRECISIONS[precision]:
                _export_keeping_float(export_llama_lib, llm, precision, group_size,
                                      {meta_name(p) for p in keep_float}, output)
            else:
                if PRECISIONS[precision]:
                    llm.quantization.qmode, llm.quantization.group_size = PRECISIONS[precision], group_size
                export_llama_lib.export_llama(llm)
    return output


@contextlib.contextmanager
def _checkpoint_folder(scratch):
    """Where the float checkpoint goes: `scratch`, unless its path names a quantization export_llm's Llama reads
    from a checkpoint's path (PREQUANTIZED), then a temporary folder of the system's."""
    if not any(name in os.path.abspath(scratch) for name in PREQUANTIZED):
        yield scratch
        return
    with tempfile.TemporaryDirectory(prefix="mobilebuild-checkpoint-") as folder:
        if any(name in folder for name in PREQUANTIZED):
            raise MobileBuildError(f"the temporary folder {folder} names {' or '.join(PREQUANTIZED)}, which "
                                   "ExecuTorch's export_llm takes for an already quantized checkpoint: set TMPDIR to "
                                   "another folder")
        yield folder


def _export_keeping_float(library, llm, precision, group_size, keep_float, output):
    """export_llama's path for XNNPACK (_export_llama: no PT2E quantizers) with the float model quantized by
    torchao_linears.quantize_linears, the linear layers at `keep_float` (Meta's names) left out; the weights apart
    as export_llama tags them for its foundation_weights_file."""
    manager = library._prepare_for_llama_export(llm)
    torchao_linears.quantize_linears(manager.model, precision, group_size, keep_float)
    exported = manager.export()
    exported.run_canonical_optimizations()
    weights = llm.export.foundation_weights_file
    library._to_edge_and_lower_llama_xnnpack(exported, exported.modelname, [], None, [], None,
                                             xnnpack_extended_ops=True,
                                             gen_tag_fn=(lambda node: weights) if weights else None).save_to_pte(output)
