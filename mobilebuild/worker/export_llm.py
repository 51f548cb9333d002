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

import json
import os

import torch

from mobilebuild.worker import quiet

PRECISIONS = {"fp32": None, "8da4w": "8da4w"}  # ours -> export_llm's qmode
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


def meta_state(model):
    """The transformers model's weights under Meta's names, by ExecuTorch's own Qwen3 converter's mapping (a
    Llama's names are a subset of it); a bias under its weight's name (Qwen2's, as ExecuTorch's Qwen 2.5
    converter maps them; that module needs torchtune, not installed); a tied lm_head: the embedding's."""
    from executorch.examples.models.checkpoint import get_mapped_key
    from executorch.examples.models.qwen3.convert_weights import _QWEN_3_FROM_META

    meta_from_hf = {hf: meta for meta, hf in _QWEN_3_FROM_META.items()}
    found = {}
    for key, value in model.state_dict().items():
        stem, kind = key.rsplit(".", 1)
        found[get_mapped_key(f"{stem}.weight", meta_from_hf).removesuffix("weight") + kind] = value
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


def program_bytes(model, precision, max_context, group_size, scratch):
    """export_llm (export_llama with an LlmConfig, as its command line builds one) for the model's weights: KV cache
    and custom SDPA on, the prompt's length dynamic, XNNPACK; 8da4w: its torchao quantization in groups."""
    with quiet.native_stderr(dropped=b"I tokenizers:"):  # its tokenizers' registration note, at import
        from executorch.examples.models.llama.export_llama_lib import export_llama
        from executorch.extension.llm.export.config.llm_config import LlmConfig

    checkpoint, settings = os.path.join(scratch, "meta.pth"), os.path.join(scratch, "params.json")
    torch.save(meta_state(model), checkpoint)
    with open(settings, "w") as handle:
        json.dump(params(model.config), handle)
    output = os.path.join(scratch, "export_llm.pte")
    llm = LlmConfig()
    llm.base.checkpoint, llm.base.params = checkpoint, settings
    llm.model.use_kv_cache = llm.model.use_sdpa_with_kv_cache = llm.model.enable_dynamic_shape = True
    llm.export.max_seq_length = llm.export.max_context_length = max_context
    llm.export.output_dir, llm.export.output_name = scratch, output  # a name ending .pte is the path
    llm.backend.xnnpack.enabled = llm.backend.xnnpack.extended_ops = True
    if PRECISIONS[precision]:
        llm.quantization.qmode, llm.quantization.group_size = PRECISIONS[precision], group_size
    with quiet.quiet():
        export_llama(llm)
    with open(output, "rb") as handle:
        return handle.read()
