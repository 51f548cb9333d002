"""Quantized language model targets: quantize.exclude keeps linear layers float (ExecuTorch through torchao's
filter, ONNX through onnxruntime's nodes_to_exclude, LiteRT through ai-edge-quantizer's recipe, whole parts of
litert-torch's decoder), the per-layer ranking (lm_layers: each layer quantized alone)
and `mobilebuild tune` choosing the layers to keep float. On the tiny Llama of test_generation and a Qwen2 from a
small transformers config (a model we did not write)."""

import copy
import json
from types import SimpleNamespace

import pytest
import torch
import yaml
from test_generation import LLAMA, LM, _plan_problems, keys, random_lm
from test_recipe import write

import mobilebuild.routes  # noqa: F401  (the route families register their stages)
from mobilebuild.plan import graph, recipe, routes
from mobilebuild.tune import command

QWEN2 = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def with_targets(*targets):
    found = copy.deepcopy(LM)
    found["targets"] = list(targets)
    return found


ET_8DA4W = {"backend": "xnnpack", "runtime": "executorch", "precision": "8da4w", "name": "et-8da4w"}
ONNX_INT8 = {"backend": "onnx", "precision": "int8", "name": "onnx-int8"}
LITERT_INT8 = {"backend": "xnnpack", "runtime": "litert", "precision": "int8", "name": "lt-int8"}


# --- the plan ------------------------------------------------------------------------------------------------------

def test_exclude_reaches_the_artifact_and_the_ranking_and_keys_only_where_set(tmp_path):
    before = keys(tmp_path, with_targets(ET_8DA4W, ONNX_INT8))
    excluded = with_targets({**ET_8DA4W, "quantize": {"exclude": ["lm_head"]}}, ONNX_INT8)
    write(tmp_path, excluded)
    (loaded,) = recipe.load_all(tmp_path)
    nodes = {node.task_name: node for node in graph.recipe_nodes(loaded, str(tmp_path))}
    assert nodes["lm_lower:lm-et-8da4w"].settings.exclude == ["lm_head"]
    assert nodes["lm_layers:lm-et-8da4w"].settings.exclude == ["lm_head"]  # its ranking leaves them out
    assert "exclude" not in nodes["lm_onnx:lm-onnx-int8"].config  # unset: not in the key
    after = keys(tmp_path, excluded)
    changed = {name for name in before if before[name] != after[name] and not name.startswith(("manifest", "plot"))}
    assert changed == {"lm_lower:lm-et-8da4w", "lm_layers:lm-et-8da4w"}  # verify and bench: on the artifact's bytes


def test_a_litert_lm_target_keeps_parts_float_and_gets_a_ranking(tmp_path):
    before = keys(tmp_path, with_targets(LITERT_INT8))
    assert "lm_layers:lm-lt-int8" in before
    excluded = with_targets({**LITERT_INT8, "quantize": {"exclude": ["model.layers.0.mlp"]}})
    write(tmp_path, excluded)
    (loaded,) = recipe.load_all(tmp_path)
    nodes = {node.task_name: node for node in graph.recipe_nodes(loaded, str(tmp_path))}
    assert nodes["lm_litert:lm-lt-int8"].settings.exclude == ["model.layers.0.mlp"]
    assert nodes["lm_layers:lm-lt-int8"].settings.method == "mobilebuild.routes.litert.worker.lm_layers"
    after = keys(tmp_path, excluded)
    assert {name for name in before if before[name] != after[name] and not name.startswith(("manifest", "plot"))
            } == {"lm_litert:lm-lt-int8", "lm_layers:lm-lt-int8"}


def test_only_quantized_targets_get_a_ranking_and_verify_layers_turns_it_off(tmp_path):
    write(tmp_path, LM)
    (loaded,) = recipe.load_all(tmp_path)
    nodes = graph.recipe_nodes(loaded, str(tmp_path))
    ranked = {node.name for node in nodes if node.stage == "lm_layers"}
    assert ranked == {"lm-et-8da4w", "lm-onnx-int8", "lm-onnx-int4"}
    (manifest,) = [node for node in nodes if node.stage == "manifest"]
    assert set(manifest.settings.layers) == {"et-8da4w", "onnx-int8", "onnx-int4"}  # the report's worst layers
    write(tmp_path, {**copy.deepcopy(LM), "verify": {"layers": False}})
    (loaded,) = recipe.load_all(tmp_path)
    assert not [node for node in graph.recipe_nodes(loaded, str(tmp_path)) if node.stage == "lm_layers"]


@pytest.mark.parametrize("target, expected", [
    ({"backend": "onnx"}, "targets[0].quantize.exclude: an fp32 target quantizes nothing: leave exclude out"),
    ({"backend": "xnnpack", "runtime": "litert"},
     "targets[0].quantize.exclude: an fp32 target quantizes nothing: leave exclude out"),
])
def test_a_target_that_cannot_keep_layers_float_refuses_exclude_in_one_line(tmp_path, target, expected):
    (line,) = _plan_problems(tmp_path, with_targets({**target, "quantize": {"exclude": ["lm_head"]}}))
    assert line.endswith(expected), line


# --- the worker: exclusion and the ranking's hook, on a Qwen2 -------------------------------------------------------

@pytest.fixture(scope="module")
def qwen2():
    return random_lm(QWEN2)


def test_exclude_entries_resolve_to_the_linear_layers_they_hold(qwen2):
    from mobilebuild.errors import MobileBuildError
    from mobilebuild.routes.executorch.worker import torchao_linears

    assert torchao_linears.kept_float(qwen2, ["model.layers.1.mlp", "lm_head"], "8da4w") == (
        "lm_head", "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj", "model.layers.1.mlp.down_proj")
    with pytest.raises(MobileBuildError, match="model.norm holds no linear layer, and 8da4w quantizes linear "
                                               "layers only"):
        torchao_linears.kept_float(qwen2, ["model.norm"], "8da4w")
    with pytest.raises(MobileBuildError, match="no module named 'model.layers.7'"):
        torchao_linears.kept_float(qwen2, ["model.layers.7"], "8da4w")


def test_litert_keeps_whole_parts_of_its_decoder_float_and_refuses_the_rest_in_one_line(qwen2):
    from mobilebuild.errors import MobileBuildError
    from mobilebuild.routes.litert.worker import lm_litert

    attention, feed_forward = lm_litert.ATTENTION.format(1), lm_litert.FEED_FORWARD.format(1)
    assert lm_litert.kept_float(qwen2, ["model.layers.1", "lm_head"]) == [lm_litert.LOGITS, attention, feed_forward]
    assert lm_litert.kept_float(qwen2, ["Qwen2MLP"]) == [lm_litert.FEED_FORWARD.format(0), feed_forward]
    for entry in ("model.layers.0.self_attn.q_proj", "model.norm"):  # inside a part (q, k, v fused), outside all
        with pytest.raises(MobileBuildError, match=f"{entry}: LiteRT keeps whole parts of litert-torch's decoder "
                                                   "float") as caught:
            lm_litert.kept_float(qwen2, [entry])
        assert caught.value.field == "quantize.exclude" and "\n" not in str(caught.value)
    tied = copy.deepcopy(qwen2)
    tied.config.tie_word_embeddings = True
    assert lm_litert.kept_float(tied, ["lm_head"]) == [lm_litert.EMBEDDING, lm_litert.LOGITS]  # one weight


def test_torchao_keeps_the_excluded_linears_float_and_the_ranking_puts_them_back(qwen2):
    from mobilebuild.routes.executorch.worker import lm_layers as lm_torchao
    from mobilebuild.routes.executorch.worker import torchao_linears

    model = copy.deepcopy(qwen2)
    torchao_linears.quantize_linears(model, "8da4w", 32, keep_float=("lm_head", "model.layers.0.self_attn.q_proj"))
    plain = {name for name in torchao_linears.linear_layers(model)
             if type(model.get_submodule(name).weight) is torch.nn.Parameter}
    assert plain == {"lm_head", "model.layers.0.self_attn.q_proj"}  # the others hold torchao's quantized weights

    config = SimpleNamespace(precision="8da4w", group_size=32, exclude=["lm_head"])
    quantizer = lm_torchao.Quantizer(copy.deepcopy(qwen2), config, None)
    assert ("lm_head", "Linear") not in quantizer.layers and len(quantizer.layers) == 14
    batch = [torch.arange(16).view(2, 8)]
    (reference,) = quantizer.logits(batch, ())
    (one,) = quantizer.logits(batch, ("model.layers.0.self_attn.v_proj",))
    assert not torch.equal(reference, one) and torch.allclose(reference, one, atol=0.5)
    assert torch.equal(quantizer.logits(batch, ())[0], reference)  # the float layer is back


def test_meta_names_of_module_paths():
    from mobilebuild.routes.executorch.worker import export_llm

    assert export_llm.meta_name("model.layers.3.self_attn.q_proj") == "layers.3.attention.wq"
    assert export_llm.meta_name("model.layers.0.mlp.down_proj") == "layers.0.feed_forward.w2"
    assert export_llm.meta_name("lm_head") == "output"


# --- tune: a quantized language model target ------------------------------------------------------------------------

@pytest.fixture
def lm_project(tmp_path, monkeypatch):
    data = with_targets({"backend": "onnx"}, ONNX_INT8, LITERT_INT8)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "lm.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("args, line", [
    (["--target", "onnx"], "recipes/lm.yaml: targets[0]: onnx is fp32: tune chooses the layers a quantized language "
                           "model keeps float (quantize.exclude); its targets it can tune: onnx-int8, lt-int8"),
    (["--target", "onnx-int8", "--goal", "top1_agreement=0.9"],
     "mobilebuild tune: --goal: no threshold 'top1_agreement' (expected recipe, defaults or NAME=VALUE with NAME one "
     "of sqnr_db, agreement, perplexity_ratio)"),
])
def test_tune_of_a_language_model_refuses_in_one_line(lm_project, capsys, args, line):
    assert command.tune_command(["recipes/lm.yaml", *args]) == 2
    assert capsys.readouterr().err.strip() == line


def test_tune_of_a_language_model_plans_its_candidates_with_their_ranking(lm_project):
    from mobilebuild.tune import search

    options = command.parser().parse_args(["recipes/lm.yaml", "--target", "onnx-int8"])
    session = command.Session(lm_project, options)
    assert session.goal == {"sqnr_db": 15.0, "agreement": 0.0, "perplexity_ratio": 1.1} and session.from_recipe
    candidates = [search.Candidate((), None, 0), search.Candidate(("model.layers.0.self_attn",), None, 2)]
    nodes = session.write(candidates)
    base, other = (session.cid(candidate) for candidate in candidates)
    assert {f"lm_verify:lm.tune-{base}", f"lm_bench:lm.tune-{other}", f"lm_layers:lm.tune-{base}"} <= set(nodes)
    assert nodes[f"lm_onnx:lm.tune-{other}"].settings.exclude == ["model.layers.0.self_attn"]
    assert session.tasks_of(candidates[0]) == (f"lm_verify:lm.tune-{base}", f"lm_bench:lm.tune-{base}")
    options = command.parser().parse_args(["recipes/lm.yaml", "--target", "lt-int8"])  # LiteRT's, as ONNX's
    session = command.Session(lm_project, options)
    nodes = session.write(candidates)
    base, other = (session.cid(candidate) for candidate in candidates)
    assert nodes[f"lm_litert:lm.tune-{other}"].settings.exclude == ["model.layers.0.self_attn"]
    assert f"lm_layers:lm.tune-{base}" in nodes


# --- slow: the ranking through each route's quantizer, and a build that keeps layers float ---------------------------

@pytest.mark.slow
@pytest.mark.parametrize("method, precision", [("mobilebuild.routes.executorch.worker.lm_layers", "8da4w"),
                                               ("mobilebuild.routes.onnx.worker.lm_layers", "int4")])
def test_the_ranking_quantizes_one_layer_at_a_time_with_the_routes_own_quantizer(qwen2, tmp_path, monkeypatch,
                                                                                method, precision):
    from mobilebuild.routes.executorch.worker import torchao_linears
    from mobilebuild.worker import lm
    from mobilebuild.worker.stages import lm_layers

    monkeypatch.setattr(lm, "causal_lm", lambda source, checkpoint: copy.deepcopy(qwen2))  # no checkpoint file
    config = SimpleNamespace(method=method, model=None, precision=precision,
                             max_context=32, group_size=32, exclude=["lm_head"], prompt_lengths=[4, 8], new_tokens=4,
                             prompts=2, text=None, seed=0, top=5)
    lm_layers.run({"checkpoint": None}, config, tmp_path / "layers.json")
    found = json.loads((tmp_path / "layers.json").read_text())
    assert "error" not in found, found
    assert found["method"] in routes.layer_methods()  # the name the report describes it by
    ranked = [row["sqnr_db"] for row in found["layers"]]
    assert len(ranked) == 5 and ranked == sorted(ranked) and found["samples"] == 4
    assert {row["name"] for row in found["layers"]} <= set(torchao_linears.linear_layers(qwen2)) - {"lm_head"}
    # every layer quantized costs more than the worst one alone
    assert found["all_quantized_sqnr_db"] < ranked[0] < 60


def test_a_deep_model_is_ranked_block_by_block_then_in_its_worst_blocks(tmp_path, monkeypatch):
    """Ten decoder blocks of a Llama (more than BLOCKS_FIRST): each block's seven linear layers quantized together
    first (torchao's 8da4w, as ExecuTorch's targets quantize), then the layers of the two worst blocks and lm_head
    one by one: 10 + 14 + 1 comparisons, not 71."""
    from mobilebuild.worker import lm
    from mobilebuild.worker.stages import lm_layers

    deep = random_lm({**LLAMA, "num_hidden_layers": 10, "hidden_size": 32, "intermediate_size": 64,
                      "num_attention_heads": 2, "num_key_value_heads": 1})
    monkeypatch.setattr(lm, "causal_lm", lambda source, checkpoint: copy.deepcopy(deep))  # no checkpoint file
    config = SimpleNamespace(method="mobilebuild.routes.executorch.worker.lm_layers", model=None, precision="8da4w",
                             max_context=32, group_size=32, exclude=None, prompt_lengths=[4], new_tokens=4,
                             prompts=2, text=None, seed=0, top=5)
    lm_layers.run({"checkpoint": None}, config, tmp_path / "layers.json")
    found = json.loads((tmp_path / "layers.json").read_text())
    assert "error" not in found, found
    blocks = [row["name"] for row in found["blocks"]]
    assert sorted(blocks) == sorted(f"model.layers.{index}" for index in range(10))
    assert found["compared"] == 2 * 7 + 1
    assert {lm_layers.block_of(row["name"]) for row in found["layers"]} <= {*blocks[:2], None}  # or lm_head


@pytest.mark.slow
def test_litert_ranks_the_parts_of_its_decoder_and_keeps_the_excluded_ones_float(qwen2, tmp_path, monkeypatch):
    """The float .tflite quantized by litert-torch's own recipe: with nothing excluded, the bytes of its converter's
    int8; every part excluded, the float model's logits; the ranking, each part quantized alone."""
    from mobilebuild.routes.litert.worker import lm_litert, runtime
    from mobilebuild.worker import lm
    from mobilebuild.worker.stages import lm_layers

    config = SimpleNamespace(method="mobilebuild.routes.litert.worker.lm_layers", model=None, precision="int8",
                             max_context=32, group_size=None, exclude=["lm_head"], prompt_lengths=[4, 8], new_tokens=4,
                             prompts=2, text=None, seed=0, top=5)
    data = lm_litert.float_tflite(qwen2, config, str(tmp_path))
    with lm_litert.litert.converting(), lm_litert._tflite_schema_for_tensorflow():
        from litert_torch.generative.utilities import converter
        from litert_torch.generative.utilities.export_config import ExportConfig

        converted = converter.convert_to_tflite(lm_litert.reauthored(qwen2, 32), str(tmp_path), "int8", [4, 8], 32,
                                                quantize="dynamic_int8",
                                                export_config=ExportConfig(output_logits_on_prefill=True))
    whole = lm_litert.quantized(data, config)
    assert whole == (tmp_path / converted.rsplit("/", 1)[-1]).read_bytes()

    def logits(model_bytes):
        return runtime.generator(model_bytes, config).forward(torch.arange(8).view(1, 8), 0)

    every = lm_litert.quantized(data, config, lm_litert.kept_float(qwen2, ["model", "lm_head"]))
    assert torch.equal(logits(every), logits(data))
    mlp = lm_litert.quantized(data, config, lm_litert.kept_float(qwen2, ["model.layers.0.mlp"]))
    assert len(whole) < len(mlp) < len(every) and not torch.equal(logits(mlp), logits(whole))

    monkeypatch.setattr(lm, "causal_lm", lambda source, checkpoint: copy.deepcopy(qwen2))  # no checkpoint file
    lm_layers.run({"checkpoint": None}, config, tmp_path / "layers.json")
    found = json.loads((tmp_path / "layers.json").read_text())
    assert "error" not in found, found
    ranked = [row["sqnr_db"] for row in found["layers"]]
    assert {row["name"] for row in found["layers"]} == {"model.embed_tokens", "model.layers.0.self_attn",
                                                        "model.layers.0.mlp", "model.layers.1.self_attn",
                                                        "model.layers.1.mlp"}  # lm_head kept float: not ranked
    assert ranked == sorted(ranked) and found["all_quantized_sqnr_db"] < ranked[0] < 80


@pytest.mark.slow
def test_a_build_keeps_the_excluded_layers_float_on_every_route(project):
    import onnx

    project.write_recipe(with_targets(ET_8DA4W, {**ET_8DA4W, "name": "et-head", "quantize": {"exclude": ["lm_head"]}},
                                      {**ONNX_INT8, "quantize": {"exclude": ["model.layers.0.mlp"]}},
                                      {**LITERT_INT8, "quantize": {"exclude": ["model.layers.0.mlp"]}}))
    project.doit()
    for target in ("et-8da4w", "et-head", "onnx-int8", "lt-int8"):
        verified = json.loads(project.artifact(f"lm/verify-{target}.json").read_text())
        assert verified["status"] == "passed", verified
        ranked = json.loads(project.artifact(f"lm/layers-{target}.json").read_text())
        assert ranked["layers"] and "error" not in ranked, ranked
    head = json.loads(project.artifact("lm/layers-et-head.json").read_text())
    assert "lm_head" not in {row["name"] for row in head["layers"]}  # kept float: not ranked
    litert = json.loads(project.artifact("lm/layers-lt-int8.json").read_text())
    assert {row["name"] for row in litert["layers"]} == {"model.embed_tokens", "model.layers.0.self_attn", "lm_head"}
    # export_llm's program and weights (zipped) with its output layer float: a float [vocab, hidden] matrix more
    assert project.artifact("lm/lm-et-head.zip").stat().st_size > project.artifact("lm/lm-et-8da4w.pte").stat().st_size
    graph_ = onnx.load(project.artifact("lm/lm-onnx-int8.onnx")).graph
    weights = {tensor.name for tensor in graph_.initializer}
    float_matmuls = [node for node in graph_.node if node.op_type == "MatMul" and node.input[1] in weights]
    assert len(float_matmuls) == 3  # the MLP's gate, up and down projections; the rest MatMulInteger
    assert any(node.op_type == "MatMulInteger" for node in graph_.node)


@pytest.mark.slow
def test_tune_keeps_the_worst_layer_of_a_qwen2_float_to_meet_the_goal(project):
    from test_tune import tune

    data = {**copy.deepcopy(LM), "name": "qwen", "model": {"transformers": "AutoModelForCausalLM", "config": QWEN2},
            "targets": [{"backend": "onnx", "precision": "int4", "name": "onnx-int4"}]}
    path = project.write_recipe(data)
    # all quantized about 14.6 dB, lm_head float about 18.3 (one run, int4 in blocks of 32)
    found, _ = tune(project, "recipes/qwen.yaml", "--target", "onnx-int4", "--goal", "sqnr_db=17")
    assert found.returncode == 0, found.stdout + found.stderr
    assert "ranking (lm_onnx, worst first): lm_head" in found.stdout
    winner = next(line for line in found.stdout.splitlines() if line.startswith("winner: "))
    assert "1 float layer (lm_head)" in winner, found.stdout
    patch = (project.root / ".mobilebuild" / "tune" / "qwen-onnx-int4.patch").read_text()
    assert "+  quantize: {exclude: [lm_head]}" in patch
    assert "lm_head" not in path.read_text()  # shown, not applied
