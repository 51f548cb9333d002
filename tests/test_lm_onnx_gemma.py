"""Gemma 3 through the ONNX routes, a token at a time against eager transformers, on tiny random Gemma 3 text models.

lm_onnx: a StaticSlidingWindowLayer counts its tokens in a Python int, which the export froze at 0: every exported
step took its positions from 0, and decoding was at about 0 dB (a published Gemma 3 config of two layers: -2.2 dB);
with a window shorter than the context the export failed outright.

lm_genai: onnxruntime-genai's builder read one flat rope_parameters, which transformers 5 keeps per layer type
(KeyError: 'rope_type'), and gave the sliding layers the global layers' linear RoPE scaling."""

import pytest
import torch
from test_generation import random_lm

from mobilebuild.plan import generation
from mobilebuild.plan.chain import model_source
from mobilebuild.worker import lm

GEMMA = {"model_type": "gemma3_text", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
         "max_position_embeddings": 256, "sliding_window": 512, "rope_theta": 1000000.0,
         "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 24, "rms_norm_eps": 1e-6,
         "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
MAX_CONTEXT = 32
SQNR_DB = 60


def built(tmp_path, config):
    """(the eager model, lm_onnx's fp32 artifact as its runtime's generator), built by the stage's run from a
    checkpoint of seeded random weights."""
    from mobilebuild.routes.onnx.worker import lm_onnx
    from mobilebuild.routes.onnx.worker import runtime as ort_runtime

    model = random_lm(config)
    checkpoint, output = tmp_path / "checkpoint.pt", tmp_path / "model.onnx"
    torch.save(model.state_dict(), checkpoint)
    source = model_source({"transformers": "AutoModelForCausalLM", "config": config}, [{"name": "input_ids"}],
                          generative=True)
    settings = generation.LMExportConfig(model=source, precision="fp32", max_context=MAX_CONTEXT)
    lm_onnx.run({"checkpoint": checkpoint}, settings, output)
    return model, ort_runtime.generator(output, settings)


@pytest.mark.parametrize("changes", [
    {},  # the published pattern: two layers, both sliding, a window longer than the context
    {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]},  # past the window, one global
], ids=["published", "short-window"])
def test_gemma3_onnx_decodes_as_eager(tmp_path, changes):
    from mobilebuild.worker import lm
    from mobilebuild.worker.stages import lm_verify

    model, artifact = built(tmp_path, {**GEMMA, **changes})
    prompt = torch.randint(0, GEMMA["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(1))
    found = lm_verify.compare_prompt(artifact, lm.EagerGenerator(model), prompt, 6)
    assert found["sqnr_prefill_db"] > SQNR_DB and found["sqnr_decode_db"] > SQNR_DB, found
    assert found["agreement"] == 1.0, found


def test_the_exported_cache_holds_the_whole_context_for_every_layer():
    """Each layer's past is [1, heads, max_context, head size], as lm_onnx's docstring says, sliding or not."""
    module = lm.CacheInOut(random_lm({**GEMMA, "sliding_window": 4}), MAX_CONTEXT)
    assert [tuple(tensor.shape) for tensor in module.empty()] == [(1, 1, MAX_CONTEXT, 16)] * 4


# --- lm_genai: onnxruntime-genai's builder ----------------------------------------------------------------------

BPE_VOCAB = 320
SHORT_WINDOW = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    from mobilebuild.examples import pydoc_lm

    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    pydoc_lm.bpe_tokenizer(path, vocab_size=BPE_VOCAB)
    return path


@pytest.mark.parametrize("rope, window", [
    ({}, SHORT_WINDOW), ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, SHORT_WINDOW),
    ({}, {"layer_types": ["sliding_attention", "full_attention"]}),  # the published window, 512: over the context
], ids=["default-rope", "linear-rope", "window-over-the-context"])  # linear: Gemma 3 4B and larger, global layers
def test_gemma3_genai_model_folder_decodes_as_eager(tmp_path, tokenizer_json, rope, window):
    """The builder's model folder, through lm_genai's own build, its window shorter than the context, or longer (a
    windowed cache, the builder's default, made the runtime refuse a max_length under the window)."""
    from types import SimpleNamespace

    from mobilebuild.routes.onnx.worker import genai_runtime, lm_genai
    from mobilebuild.worker import archive, lm
    from mobilebuild.worker.stages import lm_verify

    model = random_lm({**GEMMA, "vocab_size": BPE_VOCAB, **window, **rope})
    source, folder, packaged = tmp_path / "transformers", tmp_path / "genai", tmp_path / "model.zip"
    model.save_pretrained(source)
    lm_genai._save_tokenizer(tokenizer_json, source)
    lm_genai._build(source, folder, SimpleNamespace(precision="fp32", group_size=32), tmp_path / "cache")
    archive.write_folder(folder, packaged)
    prompt = torch.randint(0, BPE_VOCAB, (1, 6), generator=torch.Generator().manual_seed(1))
    artifact = genai_runtime.Generator(packaged, MAX_CONTEXT)
    found = lm_verify.compare_prompt(artifact, lm.EagerGenerator(model), prompt, 6)
    assert found["sqnr_prefill_db"] > SQNR_DB and found["sqnr_decode_db"] > SQNR_DB, found
    assert found["agreement"] == 1.0, found


def test_gemma3s_rope_is_flattened_for_the_builder_and_what_it_cannot_build_is_refused():
    from types import SimpleNamespace

    from mobilebuild.routes.onnx.worker import genai_builder

    config = SimpleNamespace(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                 "rope_theta": 1e6},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    genai_builder.gemma3_rope(config)
    assert (config.rope_parameters, config.rope_theta, config.rope_local_base_freq) == (
        {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}, 1e6, 1e4)
    genai_builder.gemma3_rope(config)  # flat already: as it was
    assert config.rope_parameters["rope_type"] == "linear" and config.rope_local_base_freq == 1e4
    yarn = SimpleNamespace(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    with pytest.raises(NotImplementedError, match="Gemma 3 with yarn RoPE on its global layers and default on its "
                                                  "sliding ones"):
        genai_builder.gemma3_rope(yarn)
