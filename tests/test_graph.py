"""Recipes -> nodes: merged where identical, keyed on what they use, and clear about unbuildable targets."""

import dataclasses
import re

import pytest
import test_generation
import yaml
from conftest import tiny_recipe

from mobilebuild import probe
from mobilebuild.errors import RecipeErrors
from mobilebuild.plan import graph, recipe, stages, toolchain


def nodes_for(root, data):
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    (root / "recipes" / "r.yaml").write_text(yaml.safe_dump(data))
    return {n.task_name: n for n in graph.build(recipe.load_all(root), root)}


def test_a_targets_own_quantization_never_takes_the_engines_shared_node(tmp_path):
    """qnnpack with its own quantize settings beside NNAPI on the recipe's: once both named after the engine, one
    used to replace the other, and the qnnpack target was scripted from NNAPI's stored state. NNAPI's node is its
    own too: its converter takes per-tensor weights only, where FX graph mode's default is per channel."""
    nodes = nodes_for(tmp_path, tiny_recipe(targets=[{"backend": "qnnpack", "quantize": {"observer": "minmax"}},
                                                     {"backend": "nnapi", "nnapi": {"mode": "full"}}]))
    own, nnapi = nodes["quantize:tiny-qnnpack-own"], nodes["quantize:tiny-nnapi"]
    assert own.config["observer"] == "minmax" and "observer" not in nnapi.config
    assert own.config["weights"] is None and nnapi.config["weights"] == "per_tensor"
    assert nodes["script:tiny-qnnpack"].inputs["quantized"] == own.output != nnapi.output
    assert nodes["nnapi:tiny-nnapi"].inputs["quantized"] == nnapi.output


def test_two_different_nodes_under_one_name_are_a_bug_not_a_merge(tmp_path):
    node = nodes_for(tmp_path, tiny_recipe())["quantize:tiny-qnnpack"]
    other = dataclasses.replace(node, settings=dataclasses.replace(node.settings, observer="minmax"))
    assert graph._merged([node, node]) == {node.task_name: node}
    with pytest.raises(AssertionError, match="two different nodes are both quantize:tiny-qnnpack"):
        graph._merged([node, other])


def test_fused_model_is_shared_and_each_target_gets_its_chain(tmp_path):
    nodes = nodes_for(tmp_path, tiny_recipe())
    assert sorted(nodes) == sorted([
        "checkpoint:tiny", "fuse:tiny", "quantize:tiny-qnnpack", "script:tiny-fp32", "script:tiny-int8-qnnpack",
        "optimize:tiny-xnnpack", "optimize:tiny-qnnpack", "verify:tiny-xnnpack", "verify:tiny-qnnpack",
        "bench:tiny-eager", "bench:tiny-xnnpack", "bench:tiny-qnnpack", "layers:tiny-qnnpack", "manifest:tiny",
        "plot:tiny"])
    assert nodes["script:tiny-fp32"].inputs == {"model": "artifacts/tiny/fused.pt"}
    assert nodes["quantize:tiny-qnnpack"].inputs == {"model": "artifacts/tiny/fused.pt"}
    assert nodes["optimize:tiny-xnnpack"].output == "artifacts/tiny/tiny-xnnpack.ptl"


def test_the_manifest_waits_for_every_verification_and_benchmark(tmp_path):
    nodes = nodes_for(tmp_path, tiny_recipe())
    results = {f"artifacts/tiny/{name}.json" for name in
               ("verify-xnnpack", "verify-qnnpack", "bench-eager", "bench-xnnpack", "bench-qnnpack")}
    assert results <= set(nodes["manifest:tiny"].dependencies())
    assert nodes["verify:tiny-qnnpack"].config["thresholds"]["sqnr_db"] == 15
    assert nodes["verify:tiny-xnnpack"].config["thresholds"]["sqnr_db"] == 40


def test_targets_of_one_precision_share_the_scripted_model(tmp_path):
    targets = [{"backend": "xnnpack"}, {"backend": "xnnpack", "name": "nofold",
                                        "optimize": {"blocklist": ["CONV_BN_FUSION"]}}]
    nodes = nodes_for(tmp_path, tiny_recipe(targets=targets))
    assert [n for n in nodes if n.startswith("script:")] == ["script:tiny-fp32"]
    assert nodes["optimize:tiny-nofold"].inputs == nodes["optimize:tiny-xnnpack"].inputs


def test_keys_hold_only_what_a_node_uses(tmp_path):
    nodes = nodes_for(tmp_path, tiny_recipe())
    assert "calibration" not in str(nodes["fuse:tiny"].key())
    assert "blocklist" not in str(nodes["script:tiny-fp32"].key())
    assert set(nodes["fuse:tiny"].key()["toolchain"]) >= {"python", "torch", "torchvision", "mobilebuild"}


def test_a_node_is_keyed_on_its_own_routes_packages_only(tmp_path):
    """Registering or upgrading one route family (LiteRT's converter, say) rebuilds none of another's nodes."""
    nodes = nodes_for(tmp_path, tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "onnx"},
                                                     {"backend": "xnnpack", "runtime": "executorch", "name": "et"}]))
    toolchains = {name: set(node.key()["toolchain"]) for name, node in nodes.items()}
    executorch, onnx, litert = {"executorch", "torchao"}, {"onnx", "onnxruntime"}, {"litert-torch", "ai-edge-litert"}
    for name in ("fuse:tiny", "optimize:tiny-xnnpack", "verify:tiny-xnnpack"):
        assert {"python", "torch", "torchvision", "mobilebuild", "stages_sha256"} <= toolchains[name]
        assert not (executorch | onnx | litert) & toolchains[name], name
    for name in ("lower:tiny-et", "verify:tiny-et", "bench:tiny-et"):
        assert executorch <= toolchains[name] and not (onnx | litert) & toolchains[name], name
    for name in ("onnx:tiny-onnx", "verify:tiny-onnx"):
        assert onnx <= toolchains[name] and not (executorch | litert) & toolchains[name], name


@pytest.fixture
def upgraded(monkeypatch):
    """upgraded(distribution): the plan sees another version of it installed (package metadata, as it reads it)."""
    read = probe.facts

    def upgrade(distribution):
        monkeypatch.setattr(probe, "facts", lambda names, *rest: {**read(names, *rest), distribution: "99.0"})
        toolchain.installed.cache_clear()
        toolchain.versions.cache_clear()

    yield upgrade
    toolchain.installed.cache_clear()
    toolchain.versions.cache_clear()


LIBRARY_RECIPES = {
    "tiny": tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "onnx"}]),
    "lc": {"name": "lc", "model": {"timm": "lcnet_050"}, "input": {"shape": [1, 3, 32, 32]},
           "targets": [{"backend": "xnnpack"}, {"backend": "xnnpack", "runtime": "executorch"}]},
    "lm": test_generation.LM,
    # a factory's language model: the LM stages run it as a transformers model all the same
    "lmf": {**test_generation.LM, "name": "lmf", "model": {"factory": "tinylm:make"},
            "inputs": [{"name": "input_ids", "shape": [1, 1], "dtype": "int64", "range": [0, 64]}]},
}


@pytest.mark.parametrize("library, rebuilt", [("transformers", {"lm", "lmf"}), ("timm", {"lc"})])
def test_upgrading_a_library_of_models_rekeys_the_nodes_that_build_its_models_only(tmp_path, upgraded, library,
                                                                                    rebuilt):
    for data in LIBRARY_RECIPES.values():
        (tmp_path / "recipes").mkdir(exist_ok=True)
        (tmp_path / "recipes" / f"{data['name']}.yaml").write_text(yaml.safe_dump(data))
    before = {node.task_name: node.key() for node in graph.build(recipe.load_all(tmp_path), tmp_path)}
    upgraded(library)
    after = {node.task_name: node.key() for node in graph.build(recipe.load_all(tmp_path), tmp_path)}
    assert before.keys() == after.keys()
    changed = {name for name in before if before[name] != after[name]}
    for name in before:
        recipe_name = name.split(":")[1].split("-")[0]
        # every node that builds the model from its source, on every route; not those that read only an artifact
        builds = bool(before[name]["config"].get("model"))
        assert (name in changed) == (recipe_name in rebuilt and builds), name
    assert {name.split(":")[0] for name in changed} >= (
        {"checkpoint", "lm_lower", "lm_onnx", "lm_verify", "lm_bench", "lm_layers"} if library == "transformers"
        else {"checkpoint", "fuse", "script", "lower", "verify"})


def test_a_factory_in_the_repository_is_a_dependency(tmp_path):
    (tmp_path / "tinynet.py").write_text("")
    nodes = nodes_for(tmp_path, tiny_recipe())
    assert "tinynet.py" in nodes["checkpoint:tiny"].dependencies()


def test_calibration_images_are_dependencies(tmp_path):
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "a.png").write_bytes(b"x")
    data = tiny_recipe(quantize={"calibration": {"source": "images", "path": "../calib"}})
    nodes = nodes_for(tmp_path, data)
    assert "calib/a.png" in nodes["quantize:tiny-qnnpack"].dependencies()


def test_an_empty_calibration_folder_is_reported(tmp_path):
    (tmp_path / "calib").mkdir()
    with pytest.raises(RecipeErrors, match=r"recipes/r.yaml: quantize.calibration.path: calibration folder "
                                           r"'calib' holds no files"):
        nodes_for(tmp_path, tiny_recipe(quantize={"calibration": {"source": "images", "path": "../calib"}}))


@pytest.mark.parametrize("target", [{"backend": "qnnpack", "runtime": "executorch"},
                                    {"backend": "onnx", "runtime": "pytorch-mobile"},
                                    {"backend": "nnapi", "runtime": "onnxruntime"}])
def test_targets_this_version_cannot_build_fail_clearly(tmp_path, target):
    with pytest.raises(RecipeErrors, match=r"recipes/r.yaml: targets\[1\]: backend .* is not buildable by this "
                                           r"version of mobilebuild \(buildable: xnnpack \(pytorch-mobile\)"):
        nodes_for(tmp_path, tiny_recipe(targets=[{"backend": "xnnpack"}, target]))


@pytest.mark.parametrize(("target", "field", "message"), [
    ({"backend": "qnnpack", "precision": "fp32"}, "targets[1].precision", "expected one of int8"),
    ({"backend": "nnapi", "precision": "int8"}, "targets[1].precision", "NNAPI takes its precision from nnapi.mode"),
    ({"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "executorch": {"delegate": "coreml"},
      "quantize": {"mode": "dynamic"}}, "targets[1].quantize.mode",
     "the coreml delegate's int8 recipe is static \\(calibrated\\): mode 'dynamic' is xnnpack's"),
])
def test_precision_a_route_cannot_give_is_reported(tmp_path, target, field, message):
    with pytest.raises(RecipeErrors, match=rf"recipes/r.yaml: {re.escape(field)}: .*{message}"):
        nodes_for(tmp_path, tiny_recipe(targets=[{"backend": "xnnpack"}, target]))


def test_each_route_takes_its_own_chain(tmp_path):
    targets = [{"backend": "xnnpack", "runtime": "executorch", "name": "et-fp32"},
               {"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "name": "et-int8"},
               {"backend": "onnx", "precision": "int8"},
               {"backend": "nnapi", "nnapi": {"mode": "full"}},
               {"backend": "metal", "runtime": "executorch"},
               {"backend": "vulkan"}]
    nodes = nodes_for(tmp_path, tiny_recipe(targets=targets))
    assert nodes["lower:tiny-et-fp32"].inputs == {"model": "artifacts/tiny/fused.pt"}
    assert nodes["lower:tiny-et-int8"].config["calibration"]["source"] == "random"
    assert nodes["lower:tiny-metal-executorch"].config["delegate"] == "coreml"
    assert nodes["onnx:tiny-onnx"].output == "artifacts/tiny/tiny-onnx.onnx"
    # NNAPI's quantized modes start from the eager quantization of the QNNPACK engine, with per-tensor weights
    assert nodes["nnapi:tiny-nnapi"].inputs == {"model": "artifacts/tiny/fused.pt",
                                                "quantized": "artifacts/tiny/quantized-nnapi.pt"}
    assert nodes["optimize:tiny-vulkan"].config["backend"] == "vulkan"
    assert not nodes["verify:tiny-vulkan"].config["runs_on_host"]
    assert nodes["verify:tiny-et-int8"].config["runtime"] == "executorch"
    assert not any(name.startswith("quantize:") and "onnx" in name for name in nodes)


# --- quantize.mode: dynamic on the routes whose final stage quantizes (ExecuTorch XNNPACK, ONNX Runtime) -----------

FINAL_INT8 = [{"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "name": "et-int8"},
              {"backend": "onnx", "precision": "int8", "name": "onnx-int8"}]
TINY_INPUTS = [{"dtype": "float32", "memory_format": "contiguous", "name": "input", "shape": [1, 3, 8, 8]}]
TINY_SOURCE = {"factory": "tinynet:make", "kwargs": {}, "quantizable": False}
TINY_CALIBRATION = {"batches": 16, "kwargs": {}, "seed": 0, "source": "random"}


def test_static_int8_on_executorch_and_onnx_keeps_its_node_keys(tmp_path):
    """The settings JSON that keys the static lower and export nodes, as it was before dynamic mode came: unchanged,
    so static recipes keep their up-to-date state and their shared-cache entries (`mode` is keyed only where set)."""
    nodes = nodes_for(tmp_path, tiny_recipe(targets=FINAL_INT8))
    common = {"calibration": TINY_CALIBRATION, "fuse": "auto", "inputs": TINY_INPUTS, "model": TINY_SOURCE,
              "options": {}, "precision": "int8", "weights": None}
    assert nodes["lower:tiny-et-int8"].config == {**common, "delegate": "xnnpack"}
    assert nodes["onnx:tiny-onnx-int8"].config == {**common, "outputs": None}
    assert "mode" not in nodes["layers:tiny-et-int8"].config


def test_the_onnx_exporter_setting_keys_only_the_target_that_chooses_torchscript(tmp_path):
    """onnx.exporter absent, or `dynamo` (its default) written out: the same nodes and keys, byte for byte, so existing
    artifacts stay up to date; `torchscript` keys that target's export and what re-exports or records it."""
    def keys(folder, onnx):
        targets = [FINAL_INT8[0], {**FINAL_INT8[1], **({"onnx": onnx} if onnx is not None else {})}]
        nodes = nodes_for(tmp_path / folder, tiny_recipe(targets=targets))
        return nodes, {name: node.key() for name, node in nodes.items()}

    _, plain = keys("plain", None)
    _, written = keys("dynamo", {"exporter": "dynamo"})
    # the manifest records the recipe file's sha256, which any edit of the file changes
    assert sorted(name for name in plain if plain[name] != written[name]) == ["manifest:tiny"]
    nodes, traced = keys("traced", {"exporter": "torchscript"})
    assert sorted(name for name in plain if plain[name] != traced[name]) == [
        "layers:tiny-onnx-int8", "manifest:tiny", "onnx:tiny-onnx-int8"]
    assert nodes["onnx:tiny-onnx-int8"].config["options"] == {"exporter": "torchscript"}
    assert stages.recipe_field("onnx", "options.exporter", nodes["onnx:tiny-onnx-int8"].fields) == \
        "targets[1].onnx.exporter"


def test_dynamic_int8_on_executorch_and_onnx_reads_no_calibration(tmp_path):
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "a.png").write_bytes(b"x")
    dynamic = [{**target, "name": f"{target['name']}-dyn", "quantize": {"mode": "dynamic", "exclude": ["conv"]}}
               for target in FINAL_INT8]
    nodes = nodes_for(tmp_path, tiny_recipe(targets=FINAL_INT8 + dynamic,
                                            quantize={"calibration": {"source": "images", "path": "../calib"}}))
    for index, stage, target in ((2, "lower", "et-int8"), (3, "onnx", "onnx-int8")):
        static, own = nodes[f"{stage}:tiny-{target}"], nodes[f"{stage}:tiny-{target}-dyn"]
        assert "calib/a.png" in static.dependencies() and "calib/a.png" not in own.dependencies()
        assert own.config["mode"] == "dynamic" and own.config["calibration"] is None
        assert own.config["exclude"] == ["conv"] and "observer" not in own.config
        assert not nodes[f"verify:tiny-{target}-dyn"].config["calibrated"]
        assert nodes[f"verify:tiny-{target}-dyn"].config["calibration"] is None
        assert own.fields["quantize.mode"] == f"targets[{index}].quantize.mode"  # where its errors point
    layers = nodes["layers:tiny-et-int8-dyn"]  # it quantizes again as the lower stage does: dynamically
    assert layers.config["mode"] == "dynamic" and layers.config["calibration"] is None
    assert "calib/a.png" not in layers.dependencies()
    manifest = nodes["manifest:tiny"].settings.targets
    assert {t["target"]: t["quantization"]["mode"] for t in manifest if t["quantization"]} == {
        "et-int8": "static", "onnx-int8": "static", "et-int8-dyn": "dynamic", "onnx-int8-dyn": "dynamic"}


def test_dynamic_int8_on_executorch_keeps_the_dims_that_static_int8_fixes(tmp_path):
    data = tiny_recipe(targets=FINAL_INT8 + [{**FINAL_INT8[0], "name": "et-dyn", "quantize": {"mode": "dynamic"}}],
                       inputs=[{"name": "ids", "shape": [1, "seq"], "dtype": "int64", "range": [0, 100]}],
                       dims={"seq": {"min": 4, "max": 32, "example": 16}})
    del data["input"]
    nodes = nodes_for(tmp_path, data)
    assert "int8 export recipe captures the model at the example's sizes" in \
        nodes["verify:tiny-et-int8"].config["fixed_shape"]
    assert nodes["verify:tiny-et-dyn"].config["fixed_shape"] is None
    assert nodes["verify:tiny-onnx-int8"].config["fixed_shape"] is None
    assert {t["target"]: t["fixed_shape"] is None for t in nodes["manifest:tiny"].settings.targets} == {
        "et-int8": False, "onnx-int8": True, "et-dyn": True}


@pytest.mark.parametrize("target", FINAL_INT8, ids=["executorch", "onnx"])
@pytest.mark.parametrize(("quantize", "field", "message"), [
    ({"mode": "dynamic", "observer": "minmax"}, "quantize.observer",
     "an observer calibrates static quantization; mode 'dynamic' observes no activations: leave observer out"),
    ({"mode": "qat", "checkpoint": "qat.pt"}, "quantize.mode",
     "cannot build mode 'qat': it quantizes the float model in its final stage and takes no QAT checkpoint; "
     "expected mode 'static' or 'dynamic'"),
])
def test_settings_dynamic_and_qat_lack_on_these_routes_are_one_line_naming_the_field(tmp_path, target, quantize,
                                                                                    field, message):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "qat.pt").write_bytes(b"")
    with pytest.raises(RecipeErrors) as caught:
        nodes_for(tmp_path, tiny_recipe(targets=[{"backend": "xnnpack"}, {**target, "quantize": quantize}]))
    line = str(caught.value)
    assert line.startswith(f"recipes/r.yaml: targets[1].{field}: ") and line.endswith(message) and "\n" not in line


def test_recipe_fields_name_settings_their_stages_have():
    for stage in stages.all_stages():
        assert set(stage.recipe_fields) <= {setting.name for setting in dataclasses.fields(stage.config)}, stage.name


def test_a_setting_is_named_by_its_recipe_field_where_the_target_has_its_own(tmp_path):
    """What `doit info` says changed: the recipe's field, the target's own section where it has one."""
    nodes = nodes_for(tmp_path, tiny_recipe(targets=[{"backend": "qnnpack", "quantize": {"observer": "minmax"}},
                                                     {"backend": "nnapi", "nnapi": {"mode": "full"}}]))
    own, shared = nodes["quantize:tiny-qnnpack-own"], nodes["quantize:tiny-nnapi"]
    assert stages.recipe_field("quantize", "observer", own.fields) == "targets[0].quantize.observer"
    assert stages.recipe_field("quantize", "calibration.batches", shared.fields) == "quantize.calibration.batches"
    assert stages.recipe_field("nnapi", "mode", nodes["nnapi:tiny-nnapi"].fields) == "targets[1].nnapi.mode"
    assert stages.recipe_field("verify", "seed", {}) == "verify.seed"
    assert stages.recipe_field("quantize", "engine", own.fields) is None  # the route's, not the recipe's
