"""lm_litert: a causal LM as a LiteRT model (.tflite) through litert-torch's generative path, in a stage worker.

How the transformers weights reach litert-torch's re-authored decoder, its signatures and precisions, how layers
are kept float, and why not litert-torch's export_hf: docs/llm.md (LiteRT).
"""

import contextlib
import importlib.util
import os
import sys
import tempfile
import types

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.litert.worker import litert, runtime
from mobilebuild.worker import lm, progress, quiet
from mobilebuild.worker.stages import exclusion

RECIPES = {("fp32", None): "none", ("int8", None): "dynamic_int8", ("int4", 32): "dynamic_int4_block32",
           ("int4", 128): "dynamic_int4_block128"}  # litert_torch.generative.utilities.converter.QuantizationName
SCHEMA_MODULE = "tensorflow.lite.python.schema_py_generated"
# the transformers architectures whose weights litert-torch's re-authored decoder takes as mapped here (a Qwen2 is a
# Llama with biases on its query, key and value projections)
ARCHITECTURES = ("llama", "qwen2")
NOT_MAPPED = ("litert-torch 0.10's generative path for transformers models (export_hf) imports TensorFlow, which this "
              "toolchain does not install, and its re-authored decoder is mapped here for model_type 'llama' and "
              "'qwen2' only")
# The parts of litert-torch's decoder, as its converter names their ops' output tensors (ai-edge-quantizer's recipes
# pick ops by a regex searched in that name; the "/" ends a block's number): what exclude can keep float
ATTENTION = r"TransformerBlock_{}/litert_torch\.generative\.layers\.attention\.CausalSelfAttention"
FEED_FORWARD = r"TransformerBlock_{}/litert_torch\.generative\.layers\.feed_forward\."
EMBEDDING = r"Embedding_tok_embedding"
LOGITS = r"_logits_output"  # the logits' projection: prefill_<n>_logits_output, decode_logits_output


@contextlib.contextmanager
def _tflite_schema_for_tensorflow():
    """litert-torch 0.10.0's generative layers (layers/lora.py) import the TFLite flatbuffer schema from TensorFlow,
    which it does not declare; ai-edge-litert ships the same generated module. It stands in for that import only:
    the names leave sys.modules after, so nothing else finds a TensorFlow."""
    from ai_edge_litert import schema_py_generated

    names = ["tensorflow", "tensorflow.lite", "tensorflow.lite.python"]
    if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is not None:  # a real one
        yield
        return
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["tensorflow.lite.python"].schema_py_generated = schema_py_generated
    sys.modules[SCHEMA_MODULE] = schema_py_generated
    try:
        yield
    finally:
        for name in (*names, SCHEMA_MODULE):
            sys.modules.pop(name, None)


def not_mapped(config):
    """Why litert-torch's re-authored decoder, as mapped here, does not build this model exactly (None: it does)."""
    if config.model_type not in ARCHITECTURES:
        return f"model_type {config.model_type!r}: {NOT_MAPPED}"
    rope = getattr(config, "rope_parameters", None) or {}
    for field, found, expected in (("hidden_act", config.hidden_act, "silu"),
                                   ("rope_parameters.rope_type", rope.get("rope_type", "default"), "default"),
                                   ("use_sliding_window", getattr(config, "use_sliding_window", False), False)):
        if found != expected:
            return (f"{field} {found!r}: litert-torch's re-authored decoder is mapped here with {field} {expected!r} "
                    "only")
    return None


def biases(config):
    """(query/key/value, output projection, MLP): which projections have biases."""
    if config.model_type == "qwen2":
        return True, False, False
    return config.attention_bias, config.attention_bias, config.mlp_bias


def head_dim(config):
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def model_config(config, max_context):
    """litert-torch's ModelConfig of a transformers Llama or Qwen2 configuration."""
    import litert_torch.generative.layers.model_config as cfg

    qkv_bias, output_bias, mlp_bias = biases(config)
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM, epsilon=config.rms_norm_eps)
    attention = cfg.AttentionConfig(
        num_heads=config.num_attention_heads, head_dim=head_dim(config), num_query_groups=config.num_key_value_heads,
        rotary_base=config.rope_parameters["rope_theta"], rotary_percentage=1.0, qkv_use_bias=qkv_bias,
        output_proj_use_bias=output_bias)
    feed_forward = cfg.FeedForwardConfig(type=cfg.FeedForwardType.GATED,
                                         activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
                                         intermediate_size=config.intermediate_size, use_bias=mlp_bias)
    block = cfg.TransformerBlockConfig(attn_config=attention, ff_config=feed_forward,
                                       pre_attention_norm_config=norm, post_attention_norm_config=norm)
    return cfg.ModelConfig(vocab_size=config.vocab_size, num_layers=config.num_hidden_layers, max_seq_len=max_context,
                           embedding_dim=config.hidden_size, block_configs=block, final_norm_config=norm,
                           lm_head_share_weight_with_embedding=bool(config.tie_word_embeddings))


def reauthored(model, max_context):
    """litert-torch's decoder with the transformers model's weights (its loader maps transformers' tensor names)."""
    with _tflite_schema_for_tensorflow():
        from litert_torch.generative.utilities import model_builder

    config = model.config
    names = (model_builder.TENSOR_NAMES if config.tie_word_embeddings
             else model_builder.TENSOR_NAMES_WITH_SEPARATE_LM_HEAD)
    weights = dict(model.state_dict())
    return model_builder.build_decoder_only_model(checkpoint_path="", config=model_config(config, max_context),
                                                  tensor_names=names, custom_loader=lambda _path: weights,
                                                  mask_cache_size=max_context)


def parts(model):
    """{module path of the transformers model: the name patterns of its part of litert-torch's decoder}: an attention
    and a feed-forward block per decoder layer, the embedding and lm_head (one weight where they are tied)."""
    tied = [EMBEDDING, LOGITS] if model.config.tie_word_embeddings else None
    found = {"model.embed_tokens": tied or [EMBEDDING], "lm_head": tied or [LOGITS]}
    for index in range(model.config.num_hidden_layers):
        found[f"model.layers.{index}.self_attn"] = [ATTENTION.format(index)]
        found[f"model.layers.{index}.mlp"] = [FEED_FORWARD.format(index)]
    return found


def kept_float(model, entries):
    """The name patterns of the parts quantize.exclude's entries (module paths or class names of the transformers
    model) keep float: the parts they name or hold. An entry inside a part (a single projection: litert-torch fuses
    the query, key and value projections into one) or holding none is one line."""
    found, every = [], parts(model)
    for path in exclusion.resolve(model, entries):
        held = [patterns for name, patterns in every.items() if name == path or name.startswith(path + ".")]
        if not held:
            raise MobileBuildError(
                f"{path}: LiteRT keeps whole parts of litert-torch's decoder float, not a module inside one or "
                "outside them (its decoder fuses the query, key and value projections): name a decoder layer "
                "(model.layers.0), its self_attn or mlp, model.embed_tokens or lm_head", field="quantize.exclude")
        found += [pattern for patterns in held for pattern in patterns]
    return list(dict.fromkeys(found))


def float_tflite(model, config, scratch, mask_as_input=False):
    """The float .tflite from litert-torch's generative converter: its prefill and decode signatures (with
    `mask_as_input`, the attention mask an input of each, as LiteRT-LM's engine feeds it)."""
    # importing litert-torch prints absl's preamble and oneDNN's notice natively: inside converting(), they go
    with litert.converting(), torch.no_grad():
        with _tflite_schema_for_tensorflow():
            from litert_torch.generative.utilities import converter
            from litert_torch.generative.utilities.export_config import ExportConfig

        decoder = reauthored(model, config.max_context)
        progress.note(f"converting with litert-torch's generative converter ({len(config.prompt_lengths)} prefill "
                      "signature(s) and decode)")
        try:
            path = converter.convert_to_tflite(decoder, scratch, "lm", sorted(config.prompt_lengths),
                                               config.max_context, quantize=RECIPES["fp32", None],
                                               export_config=ExportConfig(output_logits_on_prefill=True,
                                                                          mask_as_input=mask_as_input))
        except MobileBuildError:
            raise
        except Exception as exc:  # torch.export, the JAX lowering and the MLIR converter raise many types
            raise litert.convert_error(exc, "litert-torch's generative converter cannot convert the language "
                                            "model") from None
    with open(path, "rb") as handle:
        return handle.read()


def quantized(data, config, keep_float=()):
    """The float .tflite quantized as litert-torch's converter quantizes it for the precision (its recipe, translated
    for ai-edge-quantizer, which it runs), the ops whose names match `keep_float` (kept_float's patterns) left
    float."""
    with litert.converting():
        with _tflite_schema_for_tensorflow():
            from litert_torch.generative.utilities import converter
            from litert_torch.quantize import translate_recipe
        from ai_edge_quantizer import algorithm_manager, qtyping, recipe_manager

        recipe = converter.get_quant_recipe_from_flag(RECIPES[config.precision, config.group_size], None)
        rules = recipe_manager.RecipeManager()
        rules.load_quantization_recipe(translate_recipe.translate_to_ai_edge_recipe(recipe.generative_recipe))
        for pattern in keep_float:
            rules.add_quantization_config(pattern, qtyping.TFLOperationName.ALL_SUPPORTED,
                                          algorithm_key=algorithm_manager.AlgorithmName.NO_QUANTIZE)
        with quiet.quiet():  # its size and time lines, its progress bars
            return bytes(translate_recipe.quantize_model(data, rules.get_quantization_recipe()))


def tflite_bytes(model, config, scratch, mask_as_input=False):
    keep_float = kept_float(model, config.exclude)  # an entry it cannot keep: one line before converting
    data = float_tflite(model, config, scratch, mask_as_input)
    if config.precision == "fp32":
        return data
    progress.note(f"quantizing with litert-torch's {RECIPES[config.precision, config.group_size]} recipe"
                  + (f", {', '.join(config.exclude)} kept float" if config.exclude else ""))
    return quantized(data, config, keep_float)


def check_mapped(model):
    """One line where litert-torch's re-authored decoder, as mapped here, does not build the model."""
    refusal = not_mapped(model.config)
    if refusal:
        raise MobileBuildError(f"litert (LiteRT) cannot build this language model: {refusal}", field="model")


def run(inputs, config, output):
    model = lm.causal_lm(config.model, inputs["checkpoint"])
    check_mapped(model)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output))) as scratch:
        data = tflite_bytes(model, config, scratch)
    generator = runtime.generator(data, config)  # it runs on the host before it is written
    generator.forward(torch.zeros(1, min(config.prompt_lengths), dtype=torch.long), 0)
    with open(output, "wb") as handle:
        handle.write(data)

