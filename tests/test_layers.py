"""The per-layer comparison's stage (worker/stages/layers.py): it runs the method module LayersConfig.method names,
and writes its ranking; the methods themselves: test_layers_eager.py, _fx, _pt2e, _onnx. On each route the
deliberately broken convolution of tiny_models.BrokenConv is ranked first, not the layers after it."""

import json
import textwrap
from types import SimpleNamespace

import pytest
from layers_support import BROKEN, CALIBRATION, INPUTS, fused_model, layers_config, method, run_layers

from mobilebuild.plan import stages
from mobilebuild.worker.layers import common
from mobilebuild.worker.stages import calibration, fuse, layers, modeling, quantize


def test_the_stage_calls_the_compare_hook_of_the_module_config_method_names(tmp_path, monkeypatch, capsys):
    """A new route's method is one module with compare(inputs, config, chunks) -> (errors, method, detail), named by
    its dotted path; it need not live in the package."""
    (tmp_path / "toy_layers.py").write_text(textwrap.dedent('''\
        from mobilebuild.worker.layers.common import Errors


        def compare(inputs, config, chunks):
            errors = Errors()
            for (x,) in chunks:
                errors.add("stem", "Conv2d", x, x + 0.01)
                errors.add("head", "Linear", x, x)  # exact: not ranked
            return errors, "toy", f"toy comparison of {sorted(inputs)}"
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = stages.LayersConfig(method="toy_layers", precision="int8", inputs=INPUTS, model={}, fuse="auto",
                                 samples=4, seed=0, top=5)

    result = run_layers(tmp_path, config, {})

    assert result["method"] == "toy" and result["method_detail"] == "toy comparison of ['model']"
    assert [row["name"] for row in result["layers"]] == ["stem"] and result["compared"] == 2
    assert result["samples"] == 4 and result["data"] == "random"
    assert "worst layers: stem (Conv2d)" in capsys.readouterr().out


def test_a_method_module_that_cannot_be_imported_is_a_failed_comparison_not_a_failed_build(tmp_path):
    config = stages.LayersConfig(method="mobilebuild.worker.layers.no_such_method", precision="int8", inputs=INPUTS,
                                 model={}, fuse="auto", samples=4, seed=0, top=5)
    output = tmp_path / "layers.json"

    layers.run({"model": str(tmp_path / "fused.pt")}, config, str(output))

    assert json.loads(output.read_text())["error"].startswith(
        "the per-layer comparison failed: ModuleNotFoundError: No module named 'mobilebuild.worker.layers.no_such")


@pytest.mark.slow
def test_the_build_writes_each_int8_targets_worst_layers_to_the_manifest_and_the_report(project):
    from conftest import tiny_recipe

    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "qnnpack"},
                                              {"backend": "onnx", "precision": "int8"}]))
    built = project.run()

    assert built.returncode == 0, built.stdout + built.stderr
    said = [line for line in built.stdout.splitlines() if line.startswith("   worst layers: ")
            or line.startswith("   artifacts/tiny/layers-") and line.endswith("(from the cache)")]
    assert len(said) == 2  # the int8 targets only: a line each, unless an earlier test's build cached it
    assert sorted(path.name for path in project.artifact("tiny").glob("layers-*")) == ["layers-onnx.json",
                                                                                       "layers-qnnpack.json"]
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    assert sorted(manifest["layers"]) == ["onnx", "qnnpack"]
    for result in manifest["layers"].values():
        assert 0 < len(result["layers"]) <= 5 and result["seconds"] > 0
        assert [row["sqnr_db"] for row in result["layers"]] == sorted(row["sqnr_db"] for row in result["layers"])
    assert "**Worst layers of the int8 artifacts" in project.artifact("report.md").read_text()

    project.write_recipe(tiny_recipe(targets=[{"backend": "qnnpack"}], verify={"layers": False}))
    listed = project.run("list", "--all")
    assert listed.returncode == 0 and "layers:" not in listed.stdout and "verify:tiny-qnnpack" in listed.stdout


# pt2e: a static quantization by ExecuTorch's XNNPACK quantizer, which traces its patterns again on every call
@pytest.mark.parametrize("route", ["eager", pytest.param("pt2e", marks=pytest.mark.slow)])
def test_a_layer_kept_float_by_quantize_exclude_is_no_longer_to_blame(tmp_path, route):
    source = fused_model(tmp_path)
    if route == "eager":
        fused = fuse.load(str(tmp_path / "fused.pt"), SimpleNamespace(**source))
        quantized = quantize.static(fused, "qnnpack", calibration.batches(CALIBRATION, INPUTS), specs=INPUTS,
                                    exclude=[BROKEN])
        modeling.save(quantized.state_dict(), tmp_path / "quantized.pt")
        quantization = {"mode": "static", "weights": None, "exclude": [BROKEN]}
        result = run_layers(tmp_path, layers_config("eager", source, engine="qnnpack", quantization=quantization),
                            {"quantized": str(tmp_path / "quantized.pt")})
    else:
        result = run_layers(tmp_path, layers_config("pt2e", source, options={}, exclude=[BROKEN]), {})

    assert result["layers"][0]["sqnr_db"] > 25, result["layers"]


@pytest.mark.parametrize("route", ["pt2e", "onnx"])
def test_dynamic_int8_layers_are_compared_on_executorch_and_onnx(tmp_path, transformer_dynamic_onnx, route):
    """quantize.mode: dynamic: no calibration; ExecuTorch's graph is quantized again dynamically, and ONNX Runtime's
    integer units (DynamicQuantizeLinear, MatMulInteger, the rescaling after it) are cut out of the shipped model;
    each is named by its module, on a model with a dynamic dim. ONNX's also has its int8 embedding (tokens)."""
    tokens = [{"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100], "memory_format": "contiguous",
               "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}]
    # the export stage's dynamic int8 of tiny_models.tiny_transformer on these tokens (conftest's, shared)
    exported = transformer_dynamic_onnx
    source = exported.rebuild
    model = {"model": str(exported.folder / "fused.pt")}
    linears = {"qkv", "proj", "mlp.0", "mlp.2", "head"}
    shipped = {**model, "artifact": str(exported.path)}
    extra, artifact = {"pt2e": (set(), model), "onnx": ({"tokens"}, shipped)}[route]
    config = stages.LayersConfig(method=method(route), precision="int8", inputs=tokens, samples=4, seed=0, top=10,
                                 options={}, mode="dynamic", **source)
    result = run_layers(tmp_path, config, artifact)
    assert result["method"] == route
    assert {row["name"] for row in result["layers"]} == linears | extra, result["layers"]
    assert all(35 < row["sqnr_db"] < 60 for row in result["layers"]), result["layers"]  # int8, and fine


def test_a_layer_without_a_real_sqnr_is_said_not_given_a_sentinel_number():
    """Values the float model has -inf (an attention mask) are left out; int8 NaN where float is finite, or an
    all-zero float output, leave the layer without an SQNR, with why."""
    import torch

    errors = common.Errors()
    mask = torch.tensor([0.0, float("-inf"), 0.0, float("-inf")])
    errors.add("encoder", "masked_fill", mask, mask.clone())  # the same mask: exact, not listed
    scores = torch.tensor([1.0, float("-inf"), 2.0, 3.0])
    errors.add("attention", "add", scores, torch.tensor([1.01, -50.0, 2.0, 3.0]))  # the masked value left out
    errors.add("broken", "add", torch.ones(4), torch.tensor([1.0, float("nan"), 1.0, 1.0]), part="Add node_Add_1")
    errors.add("silent", "relu", torch.zeros(4), torch.full((4,), 0.1))
    errors.add("partial", "Linear", torch.ones(4), torch.full((4,), 1.1))  # one part ran, the other could not
    errors.skip("partial", "Linear", "its MatMul node_MatMul_2 cannot run alone: InvalidGraph: ...")
    ranked, uncompared = errors.results()

    assert [(row["name"], row["float_inf_or_nan_values"]) for row in ranked] == [("attention", 1)]
    assert ranked[0]["sqnr_db"] == 51.46  # 10 log10(14 / 0.0001), not -300
    assert {row["name"]: row["reason"] for row in uncompared} == {
        "broken": "int8 gives inf or NaN for 1 of its 4 values where float's are finite (in Add node_Add_1)",
        "silent": "the float model's output is all zeros: no signal to measure the error against",
        "partial": "its MatMul node_MatMul_2 cannot run alone: InvalidGraph: ..."}
    line = layers.summary({"layers": ranked, "not_compared": uncompared, "method": "pt2e", "seconds": 1.0})
    assert "no SQNR: broken (add): int8 gives inf or NaN" in line and "-300" not in line
