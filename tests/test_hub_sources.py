"""The timm and transformers model sources: the recipe grammar, the inputs' defaults the model gives, outputs named
after the model's output class, inputs bound to forward's parameters by name, caches off, a local save_pretrained
folder as a source; each route on them. Tiny configurations, random weights, nothing downloaded."""

import inspect
import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import onnx
import pytest
import torch
from torch import nn
from torch.jit.mobile import _load_for_lite_interpreter

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import graph, hub, recipe
from mobilebuild.plan.chain import model_source
from mobilebuild.routes.executorch.worker import lower
from mobilebuild.routes.executorch.worker import runtime as et_runtime
from mobilebuild.routes.onnx.worker import export
from mobilebuild.routes.onnx.worker import runtime as ort_runtime
from mobilebuild.routes.torchscript.worker import optimize, script
from mobilebuild.worker import named_inputs, outputs
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import checkpoint, modeling

BERT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 64}
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64, "vocab_size": 100}


def load(tmp_path, text, file="m.yaml"):
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes" / file).write_text(textwrap.dedent(text))
    return recipe.load(f"recipes/{file}", tmp_path)


def problems(tmp_path, text):
    with pytest.raises(RecipeErrors) as caught:
        load(tmp_path, text)
    return [str(error) for error in caught.value.errors]


def built(loaded):
    """The recipe's eager model as the checkpoint stage builds it."""
    return modeling.build_model(model_source(loaded.model, loaded.inputs), seed=0)


def text_recipe(model, inputs=("input_ids", "attention_mask"), extra=""):
    listed = "\n".join(f"  - {{name: {name}, shape: [1, seq], dtype: int64}}" for name in inputs)
    return f"""
        name: m
        model:
          {model}
        inputs:
        {listed}
        dims: {{seq: {{min: 2, max: 32, example: 8}}}}
        {extra}
        targets: [{{backend: xnnpack}}, {{backend: onnx}}]
    """.replace("\n  - ", "\n          - ")


def flat(output):
    return [value for _, value in outputs.leaves(output)]


# --- timm -----------------------------------------------------------------------------------------------------------

def test_a_timm_model_plans_and_builds_with_random_weights(tmp_path):
    loaded = load(tmp_path, """
        name: lc
        model: {timm: lcnet_050, kwargs: {num_classes: 7}}
        input: {shape: [1, 3, 64, 64]}
        targets: [{backend: xnnpack}, {backend: onnx}]
    """)
    source = model_source(loaded.model, loaded.inputs)
    assert source["timm"] == "lcnet_050" and source["library"] == "timm"
    nodes = {node.stage: node for node in graph.recipe_nodes(loaded, tmp_path)}
    assert nodes["checkpoint"].config["model"] == source
    model = built(loaded)
    assert type(model).__module__.startswith("timm.") and not model.training
    with torch.no_grad():
        assert model(*modeling.example_inputs(loaded.inputs)).shape == (1, 7)
    with pytest.raises(MobileBuildError, match=r"timm has no model 'lcnet_05' \(closest: .*lcnet_050"):
        modeling.build_model({"timm": "lcnet_05"}, seed=0)


@pytest.mark.slow
def test_a_timm_models_input_defaults_to_its_pretrained_image_size_read_once(tmp_path, monkeypatch):
    """The plan's process imports neither torch nor timm: the probe runs in a subprocess of its own, once (slow: two
    fresh Pythons, the probe's importing torch and timm, about 4.5 s on an idle machine)."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/lc.yaml").write_text("name: lc\nmodel: {timm: mobilenetv3_small_050}\n"
                                              "targets: [{backend: xnnpack}]\n")
    planned = subprocess.run(
        [sys.executable, "-c", "import json, sys; import mobilebuild.routes; from mobilebuild.plan import recipe; "
                               "print(json.dumps(recipe.load('recipes/lc.yaml', '.').inputs)); "
                               "assert not {'torch', 'timm'} & set(sys.modules), 'imported'"],
        cwd=tmp_path, capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    inputs = [{"name": "input", "dtype": "float32", "memory_format": "contiguous", "shape": [1, 3, 224, 224]}]
    assert json.loads(planned.stdout) == inputs
    assert (tmp_path / hub.CACHE_FILE).is_file()

    def no_probe(*args, **kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr(subprocess, "run", no_probe)
    assert recipe.load("recipes/lc.yaml", tmp_path).inputs == inputs  # cached by content


def test_nothing_is_downloaded_and_a_model_gives_no_shape_it_does_not_have(tmp_path):
    assert problems(tmp_path, """
        name: lc
        model: {timm: lcnet_050, kwargs: {pretrained: true}}
        targets: [{backend: xnnpack}]
    """) == ["recipes/m.yaml: model.kwargs.pretrained: nothing is downloaded at build time: leave pretrained out "
             "(random weights), or give the weights as model.checkpoint"]
    assert problems(tmp_path, """
        name: m
        model: {factory: "m:make"}
        targets: [{backend: xnnpack}]
    """) == [f"recipes/m.yaml: (top level): {recipe.ONE_OF_INPUTS}"]
    assert problems(tmp_path, f"""
        name: m
        model: {{transformers: AutoModel, config: {json.dumps(BERT)}}}
        inputs: [{{name: input_ids, dtype: int64}}]
        targets: [{{backend: xnnpack}}]
    """) == ["recipes/m.yaml: inputs[0]: missing required key 'shape'"]


# --- transformers ---------------------------------------------------------------------------------------------------

def test_a_transformers_model_from_an_inline_config_with_outputs_named_by_its_output_class(tmp_path):
    loaded = load(tmp_path, text_recipe(f"transformers: AutoModelForSequenceClassification\n"
                                        f"          config: {json.dumps({**BERT, 'num_labels': 3})}"))
    ids, mask = loaded.inputs
    assert ids["range"] == [0, 100] and mask["range"] == [1, 2]  # from the config's JSON, no probe; no padding
    assert not (tmp_path / hub.CACHE_FILE).exists()
    model = built(loaded)
    assert type(model).__name__ == "BertForSequenceClassification" and not model.config.use_cache
    with torch.no_grad():
        output = model(*modeling.example_inputs(loaded.inputs))
    assert type(output) is dict and [name for name, _ in outputs.leaves(output)] == ["logits"]
    assert outputs.describe(output) == [{"name": "logits", "shape": [1, 3], "dtype": "float32"}]
    assert list(model.state_dict()) == list(type(model).__mro__[1](model.config).state_dict())  # paths unchanged

    base = load(tmp_path, text_recipe(f"transformers: AutoModel\n          config: {json.dumps(BERT)}"), "base.yaml")
    with torch.no_grad():
        names = [name for name, _ in outputs.leaves(built(base)(*modeling.example_inputs(base.inputs)))]
    assert names == ["last_hidden_state", "pooler_output"]


@pytest.mark.slow
def test_token_ids_range_defaults_to_the_model_types_vocabulary(tmp_path):
    """Slow: the probe is a fresh Python importing torch and transformers (about 3 s on an idle machine)."""
    config = {key: value for key, value in BERT.items() if key != "vocab_size"}
    loaded = load(tmp_path, text_recipe(f"transformers: AutoModel\n          config: {json.dumps(config)}",
                                        inputs=("input_ids", "token_type_ids")))
    assert [spec["range"] for spec in loaded.inputs] == [[0, 30522], [0, 2]]  # BertConfig's defaults, probed


def test_a_task_names_its_model_class_and_mistakes_are_one_line(tmp_path):
    loaded = load(tmp_path, text_recipe(f"transformers: text-classification\n"
                                        f"          config: {json.dumps({**BERT, 'num_labels': 2})}"))
    assert type(built(loaded)).__name__ == "BertForSequenceClassification"
    with pytest.raises(MobileBuildError, match=r"no model class or task 'AutoModelForSequenceClasification' "
                                               r"\(closest: AutoModelForSequenceClassification"):
        modeling.build_model({"transformers": "AutoModelForSequenceClasification", "config": BERT}, seed=0)
    with pytest.raises(MobileBuildError, match=r"no model_type 'brt' \(closest: bert") as caught:
        modeling.build_model({"transformers": "AutoModel", "config": {**BERT, "model_type": "brt"}}, seed=0)
    assert caught.value.field == "model.config.model_type"
    assert problems(tmp_path, "name: m\nmodel: {transformers: AutoModel, config: {hidden_size: 8}}\n"
                              "input: {shape: [1, 4], dtype: int64, range: [0, 4]}\ntargets: [{backend: onnx}]\n"
                    ) == ["recipes/m.yaml: model.config.model_type: a transformers model is built from its "
                          "configuration: give its model_type (bert, gpt2, vit...) and fields, or a save_pretrained "
                          "folder as model.pretrained"]
    assert problems(tmp_path, "name: m\nmodel: {factory: 'a:b', config: {}}\ninput: {shape: [1]}\n"
                              "targets: [{backend: onnx}]\n") == [
        "recipes/m.yaml: model: 'config': a setting of a transformers model (model.transformers), not of this "
        "source"]


def gpt2_recipe(tmp_path, extra_config=None):
    return load(tmp_path, text_recipe(f"transformers: AutoModelForCausalLM\n"
                                      f"          config: {json.dumps({**GPT2, **(extra_config or {})})}"))


RIGHT_PADDED = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])  # 5 tokens, 3 of padding


def test_gpt2_takes_its_attention_mask_by_name_and_no_cache(tmp_path):
    """GPT-2's forward takes its cache between input_ids and attention_mask: the mask reaches it by name."""
    loaded = gpt2_recipe(tmp_path)
    model = built(loaded)
    parameters = list(inspect.signature(type(model).__mro__[1].forward).parameters)
    assert parameters.index("attention_mask") > 1  # by position, the mask would be taken as the cache
    ids, mask = modeling.example_inputs(loaded.inputs)
    assert mask.eq(1).all()  # nothing padded by default
    with torch.no_grad():
        output = model(ids, RIGHT_PADDED)
        reference = model.forward_by_name(input_ids=ids, attention_mask=RIGHT_PADDED, use_cache=False)
        unpadded = model(ids, mask)
    assert list(output) == ["logits"]  # no cache object: caches are off
    assert torch.equal(output["logits"], reference.logits)
    assert torch.equal(output["logits"][0, :5], unpadded["logits"][0, :5])  # causal: padding after changes nothing
    assert not torch.allclose(output["logits"][0, 5:], unpadded["logits"][0, 5:])
    with torch.no_grad():
        cached = built(gpt2_recipe(tmp_path, {"use_cache": True}))(ids, mask)
    assert set(cached) > {"logits"}  # the recipe asked for the cache


@pytest.mark.slow  # four routes' artifacts of one GPT-2, ExecuTorch's lowering alone 15 s on 2 cores
def test_every_route_takes_gpt2s_named_inputs(tmp_path):
    """Each artifact takes the recipe's inputs in order, the mask a real input: padding changes its outputs as it
    changes the eager model's."""
    loaded = gpt2_recipe(tmp_path)
    specs, model = loaded.inputs, built(loaded)
    examples = modeling.example_inputs(specs)
    padded = (examples[0], RIGHT_PADDED)

    def agrees(artifact, inputs=(examples, padded)):
        for sample in inputs:
            with torch.no_grad():
                assert sqnr_db(model(*sample)["logits"], flat(artifact(*sample))[0]) > 60

    traced = script.to_torchscript(model, "trace", examples)  # PyTorch Mobile: traced, the mask an input
    optimized = optimize.optimize(traced, {"blocklist": [], "preserved_methods": [], "bundled_inputs": False},
                                  "trace", specs)
    optimized._save_for_lite_interpreter(str(tmp_path / "m.ptl"))
    agrees(_load_for_lite_interpreter(str(tmp_path / "m.ptl")))

    proto = export.export_float(model, specs)  # ONNX: named inputs and outputs, the dims dynamic
    assert [value.name for value in proto.graph.input] == ["input_ids", "attention_mask"]
    assert [value.name for value in proto.graph.output] == ["logits"]
    onnx.save(proto, tmp_path / "m.onnx")
    agrees(ort_runtime.load(tmp_path / "m.onnx", SimpleNamespace()),
           (padded, modeling.example_inputs(specs, seed=3, size="min"), modeling.example_inputs(specs, size="max")))

    (tmp_path / "m.pte").write_bytes(lower.lower_to_bytes(model, specs, "xnnpack", "fp32"))  # ExecuTorch
    agrees(et_runtime.load(tmp_path / "m.pte", SimpleNamespace(timing={"threads": 1})))

    with pytest.raises(MobileBuildError, match="torch.jit.script cannot compile the model"):
        script.to_torchscript(model, "script", examples)  # transformers' forward is not TorchScript


# --- binding by name, whatever the source -------------------------------------------------------------------------

class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x, scale: float = 1.0, mask: torch.Tensor | None = None):
        y = self.linear(x) * scale
        return y if mask is None else y * mask


def masked():
    torch.manual_seed(0)
    return Masked()


def test_a_factory_models_inputs_bind_by_name_and_still_script(tmp_path):
    model = named_inputs.bind(masked(), ["x", "mask"])
    x, mask = torch.randn(2, 4), torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    assert torch.equal(model(x, mask), masked()(x, mask=mask))
    assert list(model.state_dict()) == ["linear.weight", "linear.bias"] and type(model).__name__ == "Masked"
    scripted = torch.jit.script(model)
    assert torch.equal(scripted(x, mask), model(x, mask))
    assert torch.equal(torch.jit.trace(model, (x, mask))(x, mask), model(x, mask))

    plain = masked()
    assert named_inputs.bind(plain, ["x"]) is plain and type(plain) is Masked  # by position already: unchanged
    assert named_inputs.bind(plain, ["input"]) is plain  # a name forward lacks goes by position
    with pytest.raises(MobileBuildError, match=r"forward\(x, scale, mask\) cannot take the inputs mask, x") as caught:
        named_inputs.bind(masked(), ["mask", "x", "y", "z"])
    assert caught.value.field == "inputs"


def test_the_source_names_several_inputs_or_a_hub_models_and_its_library():
    """The library whose version keys the nodes (checked_node; tests/test_graph.py upgrades one)."""
    assert model_source({"torchvision": "mobilenet_v2"}, [{"name": "input"}]) == {"torchvision": "mobilenet_v2"}
    assert model_source({"factory": "a:b"}, [{"name": "x"}, {"name": "mask"}])["inputs"] == ["x", "mask"]
    assert model_source({"timm": "lcnet_050"}, [{"name": "input"}]) == {
        "timm": "lcnet_050", "library": "timm", "inputs": ["input"]}
    assert model_source({"factory": "a:b"}, [{"name": "input_ids"}], generative=True) == {
        "factory": "a:b", "library": "transformers"}  # a language model is a transformers model


# --- a local save_pretrained folder ---------------------------------------------------------------------------------

def save_tiny_bert(folder, seed=0):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(**BERT, num_labels=2))
    model.save_pretrained(folder)
    return model.eval()


FOLDER_RECIPE = """
    name: m
    model: {transformers: AutoModelForSequenceClassification, pretrained: ../models/tiny}
    inputs:
      - {name: input_ids, shape: [1, 8], dtype: int64}
    targets: [{backend: onnx}]
"""


def test_a_save_pretrained_folder_is_the_source_and_its_files_are_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the stages run
    saved = save_tiny_bert(tmp_path / "models/tiny")
    loaded = load(tmp_path, FOLDER_RECIPE)
    assert loaded.model["pretrained"] == "models/tiny" and loaded.inputs[0]["range"] == [0, 100]  # config.json's
    nodes = graph.recipe_nodes(loaded, tmp_path)
    files = {"models/tiny/config.json", "models/tiny/model.safetensors"}
    assert all(files <= set(node.files) for node in nodes if node.stage in ("checkpoint", "fuse", "onnx"))
    model = built(loaded)
    assert all(torch.equal(value, saved.state_dict()[key]) for key, value in model.state_dict().items())
    checkpoint.run({}, SimpleNamespace(model=model_source(loaded.model, loaded.inputs), seed=0, batchnorm_stats=0,
                                       inputs=loaded.inputs), tmp_path / "checkpoint.pt")
    restored = modeling.restore_model(model_source(loaded.model, loaded.inputs), tmp_path / "checkpoint.pt")
    example = modeling.example_inputs(loaded.inputs)
    with torch.no_grad():
        assert torch.equal(restored(*example)["logits"], saved(*example).logits)

    (tmp_path / "models/tiny/model.safetensors").rename(tmp_path / "models/tiny/weights.bin")
    assert problems(tmp_path, FOLDER_RECIPE)[0].startswith(
        "recipes/m.yaml: model.pretrained: models/tiny holds no .safetensors weights")
