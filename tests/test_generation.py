"""Decoder-only language models (a recipe with `generate:`): the recipe's grammar and one-line errors, the plan's
nodes and what keys them, the worker's token-by-token comparison on a tiny Llama, and (slow) a tiny LM built
through every LM route by real doit."""

import copy
import hashlib
import json

import pytest
import torch
from test_recipe import problems, write

import mobilebuild.routes  # noqa: F401  (the route families register their stages)
from mobilebuild.plan import generation, graph, recipe

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}
LM = {
    "name": "lm",
    "model": {"transformers": "AutoModelForCausalLM", "config": LLAMA},
    # random weights give nearly flat logits, whose greedy tokens any rounding flips (8da4w agreed on none of
    # them): the quantized targets' agreement is not judged here, and is marked relaxed
    "generate": {"max_context": 32, "prompt_lengths": [4, 8], "new_tokens": 4, "prompts": 2,
                 "thresholds": {name: {"agreement": 0.0} for name in ("8da4w", "int8", "int4")}},
    "benchmark": {"warmup": 1, "iters": 8},
    "targets": [{"backend": "xnnpack", "runtime": "executorch"},
                {"backend": "xnnpack", "runtime": "executorch", "precision": "8da4w", "name": "et-8da4w"},
                {"backend": "onnx"}, {"backend": "onnx", "precision": "int8", "name": "onnx-int8"},
                {"backend": "onnx", "precision": "int4", "name": "onnx-int4"}],
}


def lm_recipe(**generate):
    found = copy.deepcopy(LM)
    found["generate"].update(generate)
    return found


def keys(root, data):
    write(root, data)
    (loaded,) = recipe.load_all(root)
    return {node.task_name: node.key() for node in graph.recipe_nodes(loaded, str(root))}


def test_a_language_model_plans_its_own_stages_and_input(tmp_path):
    write(tmp_path, LM)
    (loaded,) = recipe.load_all(tmp_path)
    assert loaded.inputs == [{"name": "input_ids", "shape": [1, 1], "dtype": "int64", "memory_format": "contiguous",
                              "range": [0, 64]}]  # its range from the configuration's vocabulary
    names = {node.task_name for node in graph.recipe_nodes(loaded, str(tmp_path))}
    assert {"checkpoint:lm", "lm_lower:lm-xnnpack-executorch", "lm_lower:lm-et-8da4w", "lm_onnx:lm-onnx",
            "lm_onnx:lm-onnx-int8", "lm_verify:lm-et-8da4w", "lm_bench:lm-onnx", "lm_bench:lm-eager",
            "manifest:lm"} <= names
    assert not any(name.startswith(("fuse:", "verify:", "bench:")) for name in names)


@pytest.mark.parametrize("change, changed", [
    ({"max_context": 48}, {"lm_lower", "lm_onnx", "lm_verify", "lm_bench", "lm_layers"}),
    ({"prompt_lengths": [4]}, {"lm_verify", "lm_bench", "lm_layers"}),
    ({"new_tokens": 2}, {"lm_verify", "lm_bench", "lm_layers"}),  # random held-out ids: their count
    ({"prompts": 3}, {"lm_verify", "lm_layers"}),
    ({"group_size": 16}, {"lm_lower", "lm_onnx", "lm_layers"}),  # the grouped targets' only
])
def test_a_generate_setting_rekeys_only_the_nodes_that_read_it(tmp_path, change, changed):
    before = keys(tmp_path, LM)
    after = keys(tmp_path, lm_recipe(**change))
    assert before.keys() == after.keys()
    differ = {name for name in before if before[name] != after[name] and not name.startswith(("manifest", "plot"))}
    assert {name.split(":")[0] for name in differ} == changed
    if "group_size" in change:
        assert differ == {"lm_lower:lm-et-8da4w", "lm_onnx:lm-onnx-int4", "lm_layers:lm-et-8da4w",
                          "lm_layers:lm-onnx-int4"}


def test_an_executorch_lm_is_timed_on_the_selected_device_by_the_llm_runner(tmp_path, monkeypatch):
    monkeypatch.setenv("MOBILEBUILD_ADB_SERIAL", "R58M")
    write(tmp_path, LM)
    (loaded,) = recipe.load_all(tmp_path)
    settings = {node.task_name: node.settings for node in graph.recipe_nodes(loaded, str(tmp_path))}
    assert settings["lm_bench:lm-xnnpack-executorch"].device == {"serial": "R58M",
                                                                 "binary": "/data/local/tmp/llama_main"}
    assert settings["lm_bench:lm-onnx"].device is None and settings["lm_bench:lm-eager"].device is None


@pytest.mark.parametrize("change, expected", [
    ({"generate": {"max_context": 8, "prompt_lengths": [8]}},
     "generate.max_context: the longest prompt (8) and new_tokens (16) exceed max_context (8)"),
    ({"generate": {"max_context": 128, "group_size": 24}}, "generate.group_size: expected a power of two, got 24"),
    ({"generate": {"max_context": 1}}, "generate.max_context: 1 is less than the minimum of 2"),
    ({"generate": {"max_context": 128, "prompt_lengths": []}}, "generate.prompt_lengths: [] should be non-empty"),
    ({"generate": {"max_context": 128, "tokens": 3}}, "generate: unknown key 'tokens'"),
    ({"targets": [{"backend": "xnnpack", "runtime": "executorch", "precision": "int8"}]},
     "targets[0].precision: precision 'int8' is not available for a language model on xnnpack (executorch); "
     "expected one of fp32, 8da4w, 8da8w"),
    ({"targets": [{"backend": "xnnpack"}]},
     "targets[0].backend: xnnpack (pytorch-mobile): generative path not wired yet"),
])
def test_bad_generate_values_are_one_line_each(tmp_path, change, expected):
    data = {**copy.deepcopy(LM), **change}
    if "targets" not in change:
        data["targets"] = LM["targets"][:1]
    found = problems(tmp_path, data) if "targets" not in change else _plan_problems(tmp_path, data)
    assert any(expected in line for line in found), found
    assert all("\n" not in line for line in found)


def _plan_problems(root, data):
    write(root, data)
    (loaded,) = recipe.load_all(root)
    with pytest.raises(Exception) as caught:
        graph.recipe_nodes(loaded, str(root))
    return [str(error) for error in caught.value.errors]


BPE_VOCAB = 320  # the 256 bytes, an end-of-text token and 63 merges


@pytest.fixture
def bpe(tmp_path):
    """A byte-level BPE tokenizer.json of BPE_VOCAB tokens trained with Hugging Face tokenizers on Python's help
    texts, and a held-out text file, beside the recipe (recipes/)."""
    from mobilebuild.examples import pydoc_lm

    (tmp_path / "recipes").mkdir()
    pydoc_lm.bpe_tokenizer(tmp_path / "recipes" / "tokenizer.json", vocab_size=BPE_VOCAB)
    (tmp_path / "recipes" / "heldout.txt").write_text(pydoc_lm.heldout_text())
    return tmp_path


def test_a_tokenizer_ships_once_per_recipe_and_is_read_by_what_reads_held_out_text(bpe):
    data = lm_recipe(tokenizer="tokenizer.json", text="heldout.txt")
    write(bpe, data)
    (loaded,) = recipe.load_all(bpe)
    assert loaded.generate["tokenizer"] == "recipes/tokenizer.json"
    nodes = {node.task_name: node for node in graph.recipe_nodes(loaded, str(bpe))}
    assert nodes["tokenizer:lm"].inputs == {"source": "recipes/tokenizer.json"}
    assert nodes["tokenizer:lm"].output.endswith("lm/tokenizer.json")
    for name in ("lm_verify:lm-onnx", "lm_bench:lm-onnx", "lm_layers:lm-et-8da4w"):
        assert nodes[name].inputs["tokenizer"] == nodes["tokenizer:lm"].output
    assert "recipes/heldout.txt" in nodes["lm_verify:lm-onnx"].files
    entries = {entry["target"]: entry for entry in nodes["manifest:lm"].config["targets"]}
    assert {entry["tokenizer"] for entry in entries.values()} == {nodes["tokenizer:lm"].output}



@pytest.mark.parametrize("generate, expected", [
    ({"tokenizer": "missing.json"}, "generate.tokenizer: 'missing.json' does not exist"),
    ({"tokenizer": "heldout.txt"}, "generate.tokenizer: expected a tokenizers tokenizer.json or a SentencePiece "
                                   ".model, got 'recipes/heldout.txt'"),
    ({"text": "heldout.txt"}, "generate.text: a text file needs a tokenizer to encode it"),
    ({"text": "../../outside.txt"}, "generate.text: path '../../outside.txt' leaves the repository"),
])
def test_bad_tokenizer_and_text_files_are_one_line_each(bpe, generate, expected):
    found = problems(bpe, lm_recipe(**generate))
    assert any(expected in line for line in found), found
    assert all("\n" not in line for line in found)


def test_a_tokenizer_of_another_vocabulary_or_no_tokenizer_at_all_is_one_line(bpe):
    from mobilebuild.errors import MobileBuildError
    from mobilebuild.worker import tokenizer

    with pytest.raises(MobileBuildError, match=f"tokenizer.json has {BPE_VOCAB} tokens, the model's vocabulary 64"):
        tokenizer.Tokenizer(bpe / "recipes" / "tokenizer.json").check(64)
    (bpe / "recipes" / "broken.json").write_text("{}")
    with pytest.raises(MobileBuildError, match="broken.json is not a tokenizers tokenizer it can read") as caught:
        tokenizer.Tokenizer(bpe / "recipes" / "broken.json")
    assert caught.value.field == "generate.tokenizer" and "\n" not in str(caught.value)


def test_onnxruntime_genai_packages_language_models_only_with_the_tokenizer_inside(bpe):
    data = lm_recipe(tokenizer="tokenizer.json")
    data["targets"] = [{"backend": "onnx", "runtime": "onnxruntime-genai", "precision": "int4"}]
    write(bpe, data)
    (loaded,) = recipe.load_all(bpe)
    nodes = {node.task_name: node for node in graph.recipe_nodes(loaded, str(bpe))}
    packaged = nodes["lm_genai:lm-onnx-onnxruntime-genai"]
    assert packaged.output.endswith(".zip") and packaged.settings.group_size == 32
    assert packaged.inputs["tokenizer"] == nodes["tokenizer:lm"].output
    assert not any(name.startswith("lm_layers:") for name in nodes)  # the builder quantizes every MatMul

    data["targets"][0]["quantize"] = {"exclude": ["lm_head"]}
    (line,) = _plan_problems(bpe, data)
    assert "quantize.exclude: onnxruntime-genai's model builder quantizes every MatMul" in line
    del data["targets"][0]["quantize"], data["generate"]["tokenizer"]
    (line,) = _plan_problems(bpe, data)
    assert "generate.tokenizer: onnxruntime-genai's model folder carries the model's tokenizer.json" in line
    other = {"name": "m", "model": {"torchvision": "mobilenet_v2"}, "input": {"shape": [1, 3, 8, 8]},
             "targets": [{"backend": "onnx", "runtime": "onnxruntime-genai"}]}
    (line,) = _plan_problems(bpe, other)
    assert "targets[0].runtime: onnx (onnxruntime-genai) builds language models only" in line


def test_onnxruntime_genais_builder_takes_the_lm_head_and_no_projection_as_large_as_the_vocabulary(bpe):
    """Its builder alone takes every linear layer with as many outputs as the vocabulary for the LM head (3 to 7 dB
    against eager, measured): genai_builder gives it the model's lm_head, and the folder's logits are eager's."""
    from types import SimpleNamespace

    from mobilebuild.routes.onnx.worker import genai_runtime, lm_genai
    from mobilebuild.worker import archive, metrics

    model = random_lm({**LLAMA, "vocab_size": BPE_VOCAB, "intermediate_size": BPE_VOCAB})  # the MLP's projections
    source, folder, packaged = bpe / "transformers", bpe / "genai", bpe / "model.zip"
    model.save_pretrained(source)
    lm_genai._save_tokenizer(bpe / "recipes" / "tokenizer.json", source)
    lm_genai._build(source, folder, SimpleNamespace(precision="fp32", group_size=32), bpe / "cache")
    archive.write_folder(folder, packaged)
    prompt = torch.arange(1, 9).view(1, -1)
    with torch.no_grad():
        expected = model(prompt).logits
    assert metrics.sqnr_db(expected, genai_runtime.Generator(packaged, 16).forward(prompt, 0)) > 100


@pytest.mark.slow
def test_onnxruntime_genais_model_folder_is_its_builders_own_where_no_projection_is_as_large_as_the_vocabulary(bpe):
    """The peer, side by side: the builder's command line as its README runs it makes the same files from the same
    folder as the stage's run of it (genai_builder changes only which layer is the LM head)."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from mobilebuild.routes.onnx.worker import lm_genai

    source = bpe / "transformers"
    random_lm({**LLAMA, "vocab_size": BPE_VOCAB}).save_pretrained(source)
    lm_genai._save_tokenizer(bpe / "recipes" / "tokenizer.json", source)
    lm_genai._build(source, bpe / "ours", SimpleNamespace(precision="int4", group_size=32), bpe / "cache")
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o",
                    str(bpe / "builder"), "-p", "int4", "-e", "cpu", "-c", str(bpe / "cache"), "--extra_options",
                    "int4_block_size=32"], check=True, capture_output=True)
    ours = {path.name: path.read_bytes() for path in (bpe / "ours").iterdir()}
    assert ours == {path.name: path.read_bytes() for path in (bpe / "builder").iterdir()} and "model.onnx" in ours


def test_a_litert_lm_bundle_needs_the_tokenizer_it_carries(bpe):
    data = lm_recipe(tokenizer="tokenizer.json")
    data["targets"] = [{"backend": "xnnpack", "runtime": "litert-lm", "precision": "int8"}]
    write(bpe, data)
    (loaded,) = recipe.load_all(bpe)
    nodes = {node.task_name: node for node in graph.recipe_nodes(loaded, str(bpe))}
    bundled = nodes["lm_litertlm:lm-xnnpack-litert-lm"]
    assert bundled.output.endswith(".litertlm") and bundled.inputs["tokenizer"] == nodes["tokenizer:lm"].output
    del data["generate"]["tokenizer"]
    (line,) = _plan_problems(bpe, data)
    assert "generate.tokenizer: a LiteRT-LM bundle carries the model's tokenizer: name it" in line


def test_a_factory_language_model_must_name_its_input(tmp_path):
    data = {**copy.deepcopy(LM), "model": {"factory": "tinynet:build"}}
    (line,) = problems(tmp_path, data)
    assert "inputs: give the token ids' input" in line


# --- the worker: token by token on a tiny Llama ------------------------------------------------------------------

def random_lm(config):
    """A transformers causal LM of a recipe's `config:` (model_type and fields), seeded random weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    fields = {key: value for key, value in config.items() if key != "model_type"}
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields)).eval()


@pytest.fixture(scope="module")
def tiny_llama():
    return random_lm(LLAMA)


def test_the_eager_model_agrees_with_itself_and_noise_shows(tiny_llama):
    from mobilebuild.worker import lm
    from mobilebuild.worker.stages import lm_verify

    eager, same = lm.EagerGenerator(tiny_llama), lm.EagerGenerator(tiny_llama)
    prompt = torch.arange(6).view(1, -1)
    found = lm_verify.compare_prompt(same, eager, prompt, 5)
    assert found == {"sqnr_prefill_db": None, "sqnr_decode_db": None, "agreement": 1.0, "first_divergence": None}

    class Noisy(lm.EagerGenerator):
        def forward(self, tokens, position):
            logits = super().forward(tokens, position)
            noise = torch.randn(logits.shape, generator=torch.Generator().manual_seed(position))
            return logits + noise * logits.std() * 0.01  # about 40 dB

    noisy = lm_verify.compare_prompt(Noisy(tiny_llama), eager, prompt, 5)
    assert 30 < noisy["sqnr_prefill_db"] < 50 and 30 < noisy["sqnr_decode_db"] < 50
    ppl = lm_verify.perplexity(eager, torch.arange(40) % 64, window=16)
    assert ppl == pytest.approx(lm_verify.perplexity(same, torch.arange(40) % 64, window=16))
    assert 1 < ppl < 200  # about the vocabulary's size for random weights


def test_a_plain_llama_takes_export_llms_path_with_meta_names(tiny_llama):
    from mobilebuild.routes.executorch.worker import export_llm

    assert export_llm.fits(tiny_llama, "fp32") and export_llm.fits(tiny_llama, "8da4w")
    assert not export_llm.fits(tiny_llama, "8da8w")  # export_llm has no 8da8w: the transformers export makes it
    state = export_llm.meta_state(tiny_llama)
    assert {"tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.feed_forward.w2.weight",
            "output.weight", "norm.weight"} <= set(state)
    assert len(state) == len(tiny_llama.state_dict())
    assert export_llm.params(tiny_llama.config)["n_kv_heads"] == 1


QWEN = {key: value for key, value in LLAMA.items() if key != "model_type"}


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def tiny_qwen(request):
    """A tiny Qwen2 (biases on q, k, v) or Qwen3 (RMSNorm on queries and keys) with random weights, its norms and
    biases moved off their initial values so that a mapping that dropped them would show."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(request.param, **QWEN, head_dim=16)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


def test_qwen_takes_export_llms_path_with_its_own_names(tiny_qwen):
    from mobilebuild.routes.executorch.worker import export_llm

    assert export_llm.fits(tiny_qwen, "fp32") and export_llm.fits(tiny_qwen, "8da4w")
    state, settings = export_llm.meta_state(tiny_qwen), export_llm.params(tiny_qwen.config)
    assert len(state) == len(tiny_qwen.state_dict()) and settings["head_dim"] == 16
    if tiny_qwen.config.model_type == "qwen2":
        assert {"layers.0.attention.wq.bias", "layers.0.attention.wv.bias"} <= set(state)
        assert settings["attention_qkv_bias"] and not settings.get("use_qk_norm")
    else:
        assert {"layers.0.attention.q_norm_fn.weight", "layers.0.attention.k_norm_fn.weight"} <= set(state)
        assert settings["use_qk_norm"] and settings["qk_norm_before_rope"]


def test_a_model_export_llms_llama_would_build_wrongly_does_not_fit(tiny_qwen):
    from transformers import AutoConfig, AutoModelForCausalLM

    from mobilebuild.routes.executorch.worker import export_llm

    sliding = AutoConfig.for_model(tiny_qwen.config.model_type, **QWEN, use_sliding_window=True, sliding_window=8,
                                   max_window_layers=0)
    assert not export_llm.fits(AutoModelForCausalLM.from_config(sliding), "fp32")
    biased = AutoConfig.for_model("llama", **QWEN, attention_bias=True)
    assert not export_llm.fits(AutoModelForCausalLM.from_config(biased), "fp32")


@pytest.mark.slow
def test_qwen_through_export_llm_agrees_with_transformers(tiny_qwen, tmp_path):
    """ExecuTorch's Llama definition with Qwen's settings and the mapped weights: the prefill's and a decode step's
    logits as the transformers model's."""
    from mobilebuild.routes.executorch.worker import export_llm
    from mobilebuild.routes.executorch.worker import runtime as et_runtime
    from mobilebuild.routes.executorch.worker.setup import ensure_flatc
    from mobilebuild.worker.stages.lm_verify import sqnr_db

    ensure_flatc()
    program = et_runtime.Generator(export_llm.program_bytes(tiny_qwen, "fp32", 32, 32, str(tmp_path)))
    prompt = torch.arange(1, 9).view(1, -1)
    with torch.no_grad():
        assert sqnr_db(tiny_qwen(prompt).logits[0, -1], program.forward(prompt, 0)[0, -1]) > 100
        longer = torch.cat([prompt, torch.tensor([[5]])], dim=1)
        assert sqnr_db(tiny_qwen(longer).logits[0, -1], program.forward(longer[:, -1:], 8)[0, -1]) > 100


def test_prompts_spread_over_the_held_out_text():
    from mobilebuild.worker import lm

    found = lm.prompts(torch.arange(100), 10, 3)
    assert [prompt[0, 0].item() for prompt in found] == [0, 45, 90]
    assert all(prompt.shape == (1, 10) for prompt in found)


# --- end to end ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_tiny_language_model_builds_verifies_and_times_through_every_lm_route(project):
    project.write_recipe(LM)
    ran = project.doit()
    assert {"lm_lower:lm-xnnpack-executorch", "lm_lower:lm-et-8da4w", "lm_onnx:lm-onnx", "lm_onnx:lm-onnx-int8",
            "lm_onnx:lm-onnx-int4"} <= set(ran)
    manifest = json.loads(project.artifact("lm/manifest.json").read_text())
    for target in manifest["targets"]:
        verified = json.loads(project.artifact(f"lm/verify-{target['target']}.json").read_text())
        assert verified["status"] == "passed", verified
        assert set(verified["prompt_lengths"]) == {"4", "8"}
        assert verified["untrained_reference"]  # random weights: perplexity near the vocabulary's 64
        assert 0 <= verified["metrics"]["agreement"] <= 1
        timed = json.loads(project.artifact(f"lm/bench-{target['target']}.json").read_text())
        assert timed["decode_tokens_per_s"] > 0 and timed["peak_rss_mb"] > 0
        assert all(values["ttft_ms"] > 0 for values in timed["prompt_lengths"].values())
    built = _sha256s(project)
    quantized = json.loads(project.artifact("lm/verify-et-8da4w.json").read_text())
    assert quantized["relaxed"] == {"agreement": {"used": 0.0, "default": 0.25}}
    fp32 = json.loads(project.artifact("lm/verify-xnnpack-executorch.json").read_text())
    assert fp32["metrics"]["sqnr_db"] is None or fp32["metrics"]["sqnr_db"] > 60
    assert project.doit() == []
    assert _sha256s(project) == built  # nothing rewritten
    changed = lm_recipe(prompt_lengths=[4])
    project.write_recipe(changed)
    rebuilt = project.doit()
    assert rebuilt and {name.split(":")[0] for name in rebuilt} <= {"lm_verify", "lm_bench", "lm_layers", "verified",
                                                                   "manifest", "plot"}, rebuilt


@pytest.mark.slow
def test_a_language_model_with_its_tokenizer_is_verified_on_text_and_timed_by_the_runner_with_it(project):
    """A tiny Llama whose vocabulary is a BPE tokenizer's, trained with Hugging Face tokenizers: verified on held-out
    text that tokenizer encodes, timed by ExecuTorch's LLM runner with it (its greedy tokens the generator's), the
    tokenizer shipped beside each artifact and in the release; an edited tokenizer rebuilds what reads it only."""
    from mobilebuild.examples import pydoc_lm
    from mobilebuild.results import release

    pydoc_lm.bpe_tokenizer(project.root / "recipes" / "tokenizer.json", vocab_size=BPE_VOCAB)
    (project.root / "recipes" / "heldout.txt").write_text(pydoc_lm.heldout_text())
    data = lm_recipe(tokenizer="tokenizer.json", text="heldout.txt")
    data["model"]["config"] = {**LLAMA, "vocab_size": BPE_VOCAB}
    data["targets"] = [LM["targets"][0], LM["targets"][2]]  # ExecuTorch (export_llm's program) and ONNX, fp32
    project.write_recipe(data)
    project.doit()
    shipped = project.artifact("lm/tokenizer.json")
    assert shipped.read_bytes() == (project.root / "recipes" / "tokenizer.json").read_bytes()
    manifest = json.loads(project.artifact("lm/manifest.json").read_text())
    assert {target["tokenizer"] for target in manifest["targets"]} == {"lm/tokenizer.json"}
    for target in ("xnnpack-executorch", "onnx"):
        verified = json.loads(project.artifact(f"lm/verify-{target}.json").read_text())
        assert verified["status"] == "passed" and verified["data"] == "held-out text", verified
    timed = json.loads(project.artifact("lm/bench-xnnpack-executorch.json").read_text())
    assert timed["runner_refused"] is None and timed["harness"] != timed["generator"]["harness"]
    assert timed["decode_tokens_per_s"] > 0 and all(values["tokens"] for values in timed["prompt_lengths"].values())

    document = release.collect(project.root, project.root / "release")
    assert document["files"]["lm/tokenizer.json"]["ships_with"] == ["onnx", "xnnpack-executorch"]
    assert document["files"]["lm/lm-onnx.onnx"]["tokenizer"] == "lm/tokenizer.json"
    assert (project.root / "release" / "lm" / "tokenizer.json").read_bytes() == shipped.read_bytes()

    pydoc_lm.bpe_tokenizer(project.root / "recipes" / "tokenizer.json", vocab_size=BPE_VOCAB - 1)
    rebuilt = {name.split(":")[0] for name in project.doit()}
    assert rebuilt <= {"tokenizer", "lm_verify", "lm_bench", "verified", "manifest", "plot"} and "tokenizer" in rebuilt


def build_for_an_engine(project, targets, harness):
    """A tiny Llama of a BPE tokenizer's vocabulary (its tokenizer.json beside the recipe) built for `targets`, each
    verified and timed by the engine whose HARNESS starts with `harness`; {target: its bench result}, the tokenizer's
    path."""
    from mobilebuild.examples import pydoc_lm

    tokenizer = pydoc_lm.bpe_tokenizer(project.root / "recipes" / "tokenizer.json", vocab_size=BPE_VOCAB)
    data = lm_recipe(tokenizer="tokenizer.json", text="mobilebuild.examples.pydoc_lm:heldout_text")
    data["model"]["config"] = {**LLAMA, "vocab_size": BPE_VOCAB}
    data["targets"] = targets
    project.write_recipe(data)
    project.doit()
    timed = {}
    for target in (entry["name"] if "name" in entry else f"{entry['backend']}-{entry['runtime']}" for entry in targets):
        verified = json.loads(project.artifact(f"lm/verify-{target}.json").read_text())
        assert verified["status"] == "passed", verified
        timed[target] = json.loads(project.artifact(f"lm/bench-{target}.json").read_text())
        assert timed[target]["harness"].startswith(harness)  # ranked on the engine, the generator beside it
        assert timed[target]["decode_tokens_per_s"] > 0 and timed[target]["generator"]["decode_tokens_per_s"] > 0
    return timed, tokenizer


@pytest.mark.slow
def test_onnxruntime_genais_model_folder_generates_in_its_own_engine_as_eager_transformers_does(project):
    """fp32 and int4 model folders made by onnxruntime-genai's builder: verified, timed by the engine's own loop, and
    (unpacked as an app would) loaded by onnxruntime_genai with its tokenizer, whose greedy tokens for a prompt are
    eager transformers' (fp32); the same zip from a second build."""
    import zipfile

    import onnxruntime_genai as og

    from mobilebuild.examples import pydoc_lm
    from mobilebuild.worker.tokenizer import Tokenizer

    build_for_an_engine(project, [
        {"backend": "onnx", "runtime": "onnxruntime-genai"},
        {"backend": "onnx", "runtime": "onnxruntime-genai", "precision": "int4", "name": "genai-int4"}],
        "onnxruntime-genai")
    packaged = project.artifact("lm/lm-onnx-onnxruntime-genai.zip")
    folder = project.root / "unpacked"
    with zipfile.ZipFile(packaged) as archive:
        archive.extractall(folder)
    assert {"genai_config.json", "model.onnx", "tokenizer.json"} <= {path.name for path in folder.iterdir()}
    model = og.Model(str(folder))
    text = pydoc_lm.heldout_text()[:60]
    ids = og.Tokenizer(model).encode(text).tolist()
    assert ids == Tokenizer(project.root / "recipes" / "tokenizer.json").encode(text)
    settings = og.GeneratorParams(model)
    settings.set_search_options(do_sample=False, max_length=len(ids) + 6, batch_size=1)
    engine = og.Generator(model, settings)
    engine.append_tokens([ids])
    while not engine.is_done():
        engine.generate_next_token()
    eager = random_lm({**LLAMA, "vocab_size": BPE_VOCAB})
    eager.load_state_dict(torch.load(project.artifact("lm/checkpoint.pt")))
    with torch.no_grad():
        expected = eager.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0].tolist()
    assert list(engine.get_sequence(0)) == expected

    built = packaged.read_bytes()
    project.run("clean")
    assert project.run("lm_genai", env={"MOBILEBUILD_CACHE": "off"}).returncode == 0  # built again, not fetched
    assert packaged.read_bytes() == built


@pytest.mark.slow
def test_a_litert_lm_bundle_generates_in_its_engine_as_eager_transformers_does(project):
    """fp32 and int8 .litertlm bundles: verified through their .tflite, timed by LiteRT-LM's engine, and loaded by
    the engine as an app would, whose greedy text for a prompt is eager transformers' after the start token; the same
    bytes from a second build (LiteRT-LM's builder stamps a random uuid and the time: made reproducible here)."""
    import litert_lm

    from mobilebuild.worker.tokenizer import Tokenizer

    timed, tokenizer = build_for_an_engine(project, [
        {"backend": "xnnpack", "runtime": "litert-lm"},
        {"backend": "xnnpack", "runtime": "litert-lm", "precision": "int8", "name": "litertlm-int8"}], "LiteRT-LM")
    for result in timed.values():
        assert {length: values["prompt_tokens"] for length, values in result["prompt_lengths"].items()} == \
            {"4": 5, "8": 9}  # the prompt's tokens and the start token
    bundle = project.artifact("lm/lm-xnnpack-litert-lm.litertlm")
    assert not list(project.artifact("lm").glob("*cache*"))  # the engine's XNNPACK cache went to a scratch folder
    engine = litert_lm.Engine(str(bundle), backend=litert_lm.Backend.CPU(), max_num_tokens=32)
    text = Tokenizer(tokenizer).prompt(12)  # its tokens' text (a cut inside a token may be tokenized otherwise)
    assert engine.tokenize(text) == Tokenizer(tokenizer).encode(text)
    session = engine.create_session(apply_prompt_template=False, max_output_tokens=6,
                                    sampler_config=litert_lm.SamplerConfig(top_k=1))
    session.run_prefill([text])
    answered, start = session.run_decode().texts[0], engine.bos_token_id
    session.close()
    engine.close()
    eager = random_lm({**LLAMA, "vocab_size": BPE_VOCAB})
    eager.load_state_dict(torch.load(project.artifact("lm/checkpoint.pt")))
    ids = [start, *Tokenizer(tokenizer).encode(text)]
    with torch.no_grad():
        expected = eager.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
    assert answered == Tokenizer(tokenizer).decode(expected)

    built = bundle.read_bytes()
    project.run("clean")
    assert project.run("lm_litertlm", env={"MOBILEBUILD_CACHE": "off"}).returncode == 0  # built again, not fetched
    assert bundle.read_bytes() == built


def test_the_report_has_a_generation_table_for_a_language_model():
    from mobilebuild.results import report_data, report_markdown

    timed = {"status": "ran", "generation": True, "median_ms": 0.25, "decode_tokens_per_s": 4000.0,
             "peak_rss_mb": 500.0, "prompt_lengths": {"16": {"ttft_ms": 0.5}, "64": {"ttft_ms": 1.5}}}
    # no harness recorded ("timed by": —), as results written before lm_bench named it
    manifest = {"recipe": "lm", "targets": [{"target": "et", "backend": "xnnpack", "runtime": "executorch",
                                             "precision": "8da4w", "bytes": 300000, "status": "passed"}],
                "verification": {"et": {"status": "passed", "generation": True, "metrics": {
                    "sqnr_db": 33.1, "agreement": 0.8125, "perplexity_artifact": 21.6, "perplexity_eager": 21.7}}},
                "benchmarks": {"eager": {**timed, "decode_tokens_per_s": 1000.0}, "et": timed}}
    (section,) = report_data.build([manifest]).sections
    assert section.generation.cells[1] == ["et", "8da4w", "passed", "0.300", "—", "16: 0.50, 64: 1.50", "4000", "500",
                                           "0.812", "33.1", "21.600", "21.700", "not measured on a device"]
    assert section.generation.cells[0][:3] == ["eager fp32", "fp32", "reference"]
    timed["device"] = {"status": "ran", "serial": "R58M", "prompt_lengths": {
        "16": {"ttft_ms": 12, "decode_ms_per_token": 2.25}, "64": {"ttft_ms": 31, "decode_ms_per_token": 2.5}}}
    (section,) = report_data.build([manifest]).sections
    assert section.generation.cells[1][-1] == "16: TTFT 12 ms, 2.2 ms/token, 64: TTFT 31 ms, 2.5 ms/token on R58M"
    assert report_data.GENERATION_TITLE in report_markdown.render(report_data.build([manifest]))
    for result in (manifest["verification"]["et"], *manifest["benchmarks"].values()):
        result["generation"] = False
    assert report_data.build([manifest]).sections[0].generation is None  # any other recipe: no such table


def test_check_refuses_a_language_model_in_one_line(tmp_path):
    from mobilebuild.errors import MobileBuildError
    from mobilebuild.preflight import whole_recipe

    path = write(tmp_path, LM)
    with pytest.raises(MobileBuildError, match="check does not cover language models yet"):
        whole_recipe._load(path, tmp_path, None)


def _sha256s(project):
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in project.artifact("lm").glob("lm-*") if path.suffix in (".pte", ".zip", ".onnx")}


GPT2 = {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 64}


@pytest.mark.slow
def test_a_model_export_llm_does_not_define_takes_the_transformers_export(project):
    """GPT-2 (transformers' static-cache export, on ExecuTorch and ONNX), 8da8w too."""
    project.write_recipe({**copy.deepcopy(LM), "name": "gpt",
                          "model": {"transformers": "AutoModelForCausalLM", "config": GPT2},
                          "targets": [{"backend": "xnnpack", "runtime": "executorch"},
                                      {"backend": "xnnpack", "runtime": "executorch", "precision": "8da8w",
                                       "name": "et-8da8w"}, {"backend": "onnx"}]})
    project.doit()
    for target, floor in (("xnnpack-executorch", 100), ("et-8da8w", 25), ("onnx", 100)):
        verified = json.loads(project.artifact(f"gpt/verify-{target}.json").read_text())
        assert verified["status"] == "passed" and verified["metrics"]["sqnr_db"] > floor, verified


@pytest.mark.slow
def test_a_qwen3_recipe_builds_through_export_llm_and_verifies(project):
    """A transformers Qwen3 config in a recipe: the build takes export_llm's path (its program has the LLM runner's
    metadata methods) and the artifact verifies against transformers."""
    from types import SimpleNamespace

    from mobilebuild.routes.executorch.worker import export_llm
    from mobilebuild.routes.executorch.worker import runtime as et_runtime

    project.write_recipe({**copy.deepcopy(LM), "name": "qwen",
                          "model": {"transformers": "AutoModelForCausalLM",
                                    "config": {**LLAMA, "model_type": "qwen3", "head_dim": 16}},
                          "targets": [{"backend": "xnnpack", "runtime": "executorch"}]})
    project.doit()
    verified = json.loads(project.artifact("qwen/verify-xnnpack-executorch.json").read_text())
    assert verified["status"] == "passed" and (verified["metrics"]["sqnr_db"] or 200) > 100, verified
    program = et_runtime.generator(project.artifact("qwen/qwen-xnnpack-executorch.zip"), SimpleNamespace())
    assert export_llm.METADATA_METHOD in program.method_names


def test_an_onnx_language_model_over_one_files_two_gigabytes_is_one_line(tmp_path, monkeypatch, tiny_llama):
    """Protobuf serializes no message over 2 GB: a Llama-3.2-1B of two layers in fp32 crashed the stage with its
    EncodeError. A smaller limit stands in for protobuf's here."""
    from mobilebuild.errors import MobileBuildError
    from mobilebuild.routes.onnx.worker import lm_onnx

    checkpoint = tmp_path / "checkpoint.pt"
    torch.save(tiny_llama.state_dict(), checkpoint)
    from mobilebuild.plan.chain import model_source

    source = model_source({"transformers": "AutoModelForCausalLM", "config": LLAMA}, [{"name": "input_ids"}],
                          generative=True)
    settings = generation.LMExportConfig(model=source, precision="fp32", max_context=16)
    monkeypatch.setattr(lm_onnx, "ONE_FILE_LIMIT", 10_000)
    with pytest.raises(MobileBuildError, match=r"its fp32 ONNX model holds 0\.0\d GB of weights, and one \.onnx file "
                                               r"holds under 2 GB \(protobuf's limit\)") as caught:
        lm_onnx.run({"checkpoint": checkpoint}, settings, tmp_path / "model.onnx")
    assert caught.value.field == "targets" and not (tmp_path / "model.onnx").exists()


def test_only_a_quantized_artifacts_failure_is_put_down_to_an_untrained_reference():
    from mobilebuild.worker.stages import lm_verify

    (line,) = lm_verify.untrained_note(["agreement 0 < 0.25"], True, "int4", 226947, 128256)
    assert "perplexity (226947) is about its vocabulary's size (128256): an untrained reference" in line
    assert lm_verify.untrained_note(["sqnr_db -2.2 < 30"], True, "fp32", 226947, 128256) == []
    assert lm_verify.untrained_note(["agreement 0 < 0.25"], False, "int4", 9.2, 256) == []
    assert lm_verify.untrained_note([], True, "int4", 226947, 128256) == []


@pytest.mark.slow
def test_export_llm_takes_a_float_checkpoint_in_a_folder_that_names_a_quantization(tmp_path):
    """export_llm's Llama takes a checkpoint whose path holds "8da4w" or "int8" for an already quantized one and
    swaps its linear layers (those of 256 inputs or a multiple: torchao's default groups): a float checkpoint in the
    scratch folder of a recipe named so failed to export."""
    from types import SimpleNamespace

    from mobilebuild.routes.executorch.worker import export_llm
    from mobilebuild.routes.executorch.worker import runtime as et_runtime
    from mobilebuild.routes.executorch.worker.setup import ensure_flatc
    from mobilebuild.worker import metrics

    ensure_flatc()
    model, scratch = random_lm({**LLAMA, "hidden_size": 256, "intermediate_size": 512}), tmp_path / "lm-8da4w"
    scratch.mkdir()
    program = export_llm.write_program(model, "fp32", 32, None, str(scratch))
    prompt = torch.arange(1, 9).view(1, 8)
    with torch.no_grad():
        expected = model(prompt).logits[:, -1]
    found = et_runtime.generator(open(program, "rb").read(), SimpleNamespace()).forward(prompt, 0)
    assert metrics.sqnr_db(expected, found.view(1, -1)) > 100
