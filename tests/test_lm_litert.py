"""Language models on LiteRT (routes/litert/plan.py's generative block, routes/litert/worker/lm_litert.py, the LiteRT
runtime's generator): the plan's node and what keys it, one-line refusals, and (slow) a tiny random Llama converted by
litert-torch's generative converter, verified token by token and timed through real doit, its bytes the same from two
checkouts; a tiny Qwen2 with biases and tied embeddings against its eager model."""

import copy
import json

import pytest
from conftest import checkouts
from test_generation import LM, _plan_problems, keys
from test_recipe import write

import mobilebuild.routes  # noqa: F401  (the route families register their stages)
from mobilebuild.plan import graph, recipe

TARGETS = [{"backend": "xnnpack", "runtime": "litert"},
           {"backend": "xnnpack", "runtime": "litert", "precision": "int8", "name": "litert-int8"}]


def litert_lm(**generate):
    found = copy.deepcopy(LM)
    found["generate"].update(generate)
    found["targets"] = copy.deepcopy(TARGETS)
    return found


def test_a_language_model_plans_a_litert_conversion_keyed_on_its_prompt_lengths(tmp_path):
    write(tmp_path, litert_lm())
    (loaded,) = recipe.load_all(tmp_path)
    nodes = {node.task_name: node for node in graph.recipe_nodes(loaded, str(tmp_path))}
    assert {"lm_litert:lm-xnnpack-litert", "lm_litert:lm-litert-int8", "lm_verify:lm-litert-int8",
            "lm_bench:lm-xnnpack-litert"} <= set(nodes)
    converted = nodes["lm_litert:lm-xnnpack-litert"]
    assert converted.output.endswith(".tflite")
    # keyed on litert-torch's version, as the family's other nodes, and on no other family's packages
    assert {"litert-torch", "ai-edge-litert"} <= set(converted.key()["toolchain"])
    assert "executorch" not in converted.key()["toolchain"]
    before = keys(tmp_path, litert_lm())
    after = keys(tmp_path, litert_lm(prompt_lengths=[4]))
    # its prefill signatures take the prompt lengths: the conversion reads them, unlike the other LM routes'
    assert {name for name in before if before[name] != after[name]
            and name.startswith("lm_litert")} == {"lm_litert:lm-xnnpack-litert", "lm_litert:lm-litert-int8"}


GPT2 = {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64}


@pytest.mark.parametrize("target, group_size, config, expected", [
    ({"precision": "int4"}, 16, None, "generate.group_size: LiteRT's int4 (litert-torch's dynamic_int4 recipes) takes "
                                      "blocks of 32 or 128 weights, not 16"),
    ({"precision": "8da4w"}, 32, None, "targets[0].precision: precision '8da4w' is not available for a language "
                                       "model on xnnpack (litert); expected one of fp32, int8, int4"),
    ({}, 32, GPT2, "model.config.model_type: model_type 'gpt2': LiteRT's generative path takes model_type 'llama' "
                   "or 'qwen2' only (litert-torch's export_hf needs TensorFlow)"),
])
def test_bad_litert_language_model_settings_are_one_line_each(tmp_path, target, group_size, config, expected):
    data = litert_lm(group_size=group_size)
    data["targets"] = [{**TARGETS[0], **target}]
    if config:
        data["model"]["config"] = config
    found = _plan_problems(tmp_path, data)
    assert any(expected in line for line in found), found
    assert all("\n" not in line for line in found)


def test_a_model_litert_torchs_decoder_does_not_build_is_refused_naming_why():
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    from mobilebuild.routes.litert.worker import lm_litert

    assert lm_litert.not_mapped(LlamaConfig(hidden_size=32, num_attention_heads=2, attention_bias=True)) is None
    assert lm_litert.not_mapped(Qwen2Config(hidden_size=32, num_attention_heads=2)) is None
    assert "model_type 'gpt2'" in lm_litert.not_mapped(GPT2Config())
    assert "export_hf" in lm_litert.not_mapped(GPT2Config())
    assert lm_litert.not_mapped(LlamaConfig(hidden_act="gelu")).startswith("hidden_act 'gelu'")
    assert lm_litert.not_mapped(Qwen2Config(use_sliding_window=True)).startswith("use_sliding_window True")


@pytest.mark.slow
def test_a_qwen2_with_biases_and_tied_embeddings_converts_exactly(tmp_path):
    """transformers' Qwen2ForCausalLM from a tiny config: its query, key and value biases (random here: transformers
    initialises them to zero) and its tied lm_head go into litert-torch's decoder."""
    import types

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mobilebuild.routes.litert.worker import lm_litert
    from mobilebuild.routes.litert.worker import runtime as litert
    from mobilebuild.worker import lm
    from mobilebuild.worker.stages import lm_verify

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(0, 0.5)
    config = types.SimpleNamespace(precision="fp32", group_size=None, exclude=None, max_context=16, prompt_lengths=[4],
                                   timing={"threads": 1})
    data = lm_litert.tflite_bytes(model.eval(), config, str(tmp_path))
    found = lm_verify.compare_prompt(litert.generator(data, config), lm.EagerGenerator(model),
                                     torch.arange(4).view(1, -1), 4)
    assert found["sqnr_prefill_db"] > 60 and found["sqnr_decode_db"] > 60 and found["agreement"] == 1.0


@pytest.mark.slow
def test_a_tiny_language_model_converts_verifies_and_times_on_litert_the_same_from_two_checkouts(tmp_path):
    """transformers' LlamaForCausalLM from a tiny config (random weights) through litert-torch's generative
    converter: prefill and decode signatures, run by LiteRT's interpreter."""
    first, second = checkouts(tmp_path, "a", "elsewhere/b", recipe=litert_lm())
    ran = first.doit()
    assert {"lm_litert:lm-xnnpack-litert", "lm_litert:lm-litert-int8"} <= set(ran)
    for target, precision in (("xnnpack-litert", "fp32"), ("litert-int8", "int8")):
        verified = json.loads(first.artifact(f"lm/verify-{target}.json").read_text())
        assert verified["status"] == "passed", verified
        assert verified["precision"] == precision and set(verified["prompt_lengths"]) == {"4", "8"}
        assert verified["metrics"]["perplexity_ratio"] == pytest.approx(1, abs=0.05)
        timed = json.loads(first.artifact(f"lm/bench-{target}.json").read_text())
        assert timed["decode_tokens_per_s"] > 0 and timed["peak_rss_mb"] > 0
        assert set(timed["prompt_lengths"]) == {"4", "8"}
        assert all(values["ttft_ms"] > 0 for values in timed["prompt_lengths"].values())
    fp32 = json.loads(first.artifact("lm/verify-xnnpack-litert.json").read_text())
    assert fp32["metrics"]["sqnr_db"] > 60
    int8 = json.loads(first.artifact("lm/verify-litert-int8.json").read_text())
    assert 15 < int8["metrics"]["sqnr_db"] < fp32["metrics"]["sqnr_db"]
    fp32_bytes = first.artifact("lm/lm-xnnpack-litert.tflite").stat().st_size
    assert first.artifact("lm/lm-litert-int8.tflite").stat().st_size < fp32_bytes
    second.doit("lm_litert")
    for name in ("lm-xnnpack-litert.tflite", "lm-litert-int8.tflite"):
        assert first.artifact(f"lm/{name}").read_bytes() == second.artifact(f"lm/{name}").read_bytes(), name
