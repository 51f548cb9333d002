"""Pruning, dynamic quantization, quantization-aware training and weight granularity, on tiny models and through
the real graph."""

import json

import pytest
import tiny_models
import torch
from conftest import tiny_recipe
from torch import nn
from torch.jit.mobile import _load_for_lite_interpreter

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.torchscript.worker import optimize, script
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import calibration, prune, quantize

OPTIONS = {"blocklist": [], "preserved_methods": [], "bundled_inputs": False}


def weights_of(model):
    return {name: m.weight for name, m in model.named_modules() if isinstance(m, prune.PRUNABLE)}


@pytest.mark.parametrize("method", ["l1_unstructured", "random_unstructured"])
def test_unstructured_pruning_zeroes_the_asked_fraction_and_stays_a_plain_state_dict(method):
    model = tiny_models.conv_bn()
    pruned = prune.apply(model, {"method": method, "amount": 0.3, "seed": 0, "n": 2, "dim": 0})
    assert pruned == ["0", "3"]
    for name, weight in weights_of(model).items():
        assert (weight == 0).sum().item() == round(0.3 * weight.numel())
    state = model.state_dict()
    assert not [key for key in state if key.endswith("_orig") or key.endswith("_mask")]
    found = prune.sparsity(state)
    assert found["overall"] == pytest.approx((round(0.3 * 216) + round(0.3 * 576)) / (216 + 576))
    assert set(found["modules"]) == {"0", "3"}


def test_l1_pruning_removes_the_smallest_weights():
    model = nn.Sequential(nn.Linear(4, 1, bias=False))
    model[0].weight.data = torch.tensor([[0.1, -3.0, 0.2, 4.0]])
    prune.apply(model, {"method": "l1_unstructured", "amount": 0.5, "seed": 0})
    assert model[0].weight.tolist() == [[0.0, -3.0, 0.0, 4.0]]


def test_structured_pruning_zeroes_whole_output_channels():
    model = tiny_models.conv_bn()
    prune.apply(model, {"method": "ln_structured", "amount": 0.5, "n": 2, "dim": 0, "seed": 0, "modules": ["3"]})
    channel_norms = model[3].weight.flatten(1).norm(dim=1)
    assert (channel_norms == 0).sum().item() == 4
    assert (model[0].weight != 0).all()  # only the named module


def test_unknown_modules_are_named():
    with pytest.raises(MobileBuildError, match=r"no module with a weight named 'head'") as caught:
        prune.apply(tiny_models.conv_bn(), {"method": "l1_unstructured", "amount": 0.3, "seed": 0, "modules": ["head"]})
    assert caught.value.field == "prune.modules"


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.layers(x)


def test_dynamic_quantization_of_a_linear_model_matches_fp32(tmp_path):
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        reference = model(x)
    torch.ao.quantization.fuse_modules(model, [["layers.0", "layers.1"]], inplace=True)  # as the fuse stage does
    quantized = quantize.dynamic(model, "qnnpack")
    assert [type(m).__module__ for m in (quantized.layers[0], quantized.layers[2], quantized.layers[4])] == [
        "torch.ao.nn.intrinsic.quantized.dynamic.modules.linear_relu", "torch.ao.nn.quantized.dynamic.modules.linear",
        "torch.ao.nn.quantized.dynamic.modules.linear"]
    path = tmp_path / "dynamic.ptl"
    scripted = script.to_torchscript(quantized, "script", (x,))
    optimize.optimize(scripted, OPTIONS, "script", [{"name": "input", "shape": [8, 32], "dtype": "float32"}]) \
        ._save_for_lite_interpreter(str(path))
    assert sqnr_db(reference, _load_for_lite_interpreter(str(path))(x)) > 30.0


@pytest.mark.parametrize("weights, scheme", [("per_channel", torch.per_channel_affine),
                                             ("per_tensor", torch.per_tensor_affine)])
def test_weight_granularity_is_selectable(weights, scheme):
    batches = calibration.batches({"source": "random", "batches": 2, "seed": 0},
                                  [{"name": "input", "shape": [1, 3, 16, 16], "dtype": "float32",
                                    "memory_format": "contiguous"}])
    quantized = quantize.static(tiny_models.conv_bn(), "qnnpack", batches, weights)
    assert quantized.module[0].weight().qscheme() == scheme


def test_the_engines_own_default_granularity_by_default():
    # observer factories are fresh functools.partial objects each call: compare what they build
    assert repr(quantize.qconfig_for("qnnpack")) == repr(torch.ao.quantization.get_default_qconfig("qnnpack"))
    assert repr(quantize.qconfig_for("qnnpack", qat=True)) == \
        repr(torch.ao.quantization.get_default_qat_qconfig("qnnpack"))


@pytest.mark.slow
def test_a_pruned_and_a_dynamic_target_build_beside_the_plain_ones(project):
    targets = [{"backend": "xnnpack"}, {"backend": "qnnpack"},
               {"backend": "xnnpack", "name": "sparse", "prune": {"method": "l1_unstructured", "amount": 0.5}},
               {"backend": "qnnpack", "name": "dyn", "quantize": {"mode": "dynamic"}}]
    project.write_recipe(tiny_recipe(targets=targets))
    executed = project.doit()
    assert {"prune:tiny-sparse", "fuse:tiny-sparse", "script:tiny-sparse", "quantize:tiny-dyn",
            "script:tiny-dyn", "fuse:tiny", "quantize:tiny-qnnpack"} <= set(executed)
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    assert {t["target"]: t["status"] for t in manifest["targets"]} == {
        "xnnpack": "passed", "qnnpack": "passed", "sparse": "passed", "dyn": "passed"}
    sparsity = manifest["verification"]["sparse"]["sparsity"]
    assert sparsity["overall"] == pytest.approx(0.5, abs=0.01)
    # judged against the pruned model, and measured against the unpruned one: half the weights gone shows there
    against = manifest["verification"]["sparse"]["against_unpruned"]
    assert against["sqnr_db"] < manifest["verification"]["sparse"]["metrics"]["sqnr_db"] - 20
    assert against["summary"].startswith("top-1 agreement ") and " SQNR " in against["summary"]
    assert "against_unpruned" not in manifest["verification"]["xnnpack"]
    assert "against the unpruned fp32 model (sparse): top-1 agreement" in project.artifact("report.md").read_text()
    benchmarks = manifest["benchmarks"]
    assert benchmarks["sparse"]["artifact_compressed_bytes"] < benchmarks["xnnpack"]["artifact_compressed_bytes"]

    targets[2]["prune"]["amount"] = 0.6  # one target's pruning: only its chain rebuilds
    project.write_recipe(tiny_recipe(targets=targets))
    assert project.doit() == ["bench:tiny-sparse", "fuse:tiny-sparse", "manifest:tiny", "optimize:tiny-sparse",
                              "plot:tiny", "prune:tiny-sparse", "script:tiny-sparse", "verified:tiny",
                              "verify:tiny-sparse"]


@pytest.mark.slow
def test_a_qat_checkpoint_trained_on_digits_converts_and_verifies(project):
    from mobilebuild.examples import digits

    torch.manual_seed(0)
    model = digits.train(digits.DigitsCNN(), epochs=3)
    torch.save(model.state_dict(), project.root / "float.pt")
    qat = quantize.prepare_qat_model(model, "qnnpack", "auto")
    images, labels = digits.load_split("train")
    optimizer = torch.optim.SGD(qat.parameters(), lr=0.01)
    for start in range(0, 320, 32):  # a few steps of quantization-aware fine-tuning
        optimizer.zero_grad()
        nn.functional.cross_entropy(qat(images[start:start + 32]), labels[start:start + 32]).backward()
        optimizer.step()
    torch.save(qat.state_dict(), project.root / "qat.pt")

    recipe = tiny_recipe(
        model={"factory": "mobilebuild.examples.digits:DigitsCNN", "checkpoint": "../float.pt"},
        input={"shape": [1, 1, 8, 8]},
        quantize={"mode": "qat", "checkpoint": "../qat.pt"},
        verify={"evaluation": {"function": "mobilebuild.examples.digits:evaluation_data"}},
        targets=[{"backend": "qnnpack"}])
    project.write_recipe(recipe)
    assert "quantize:tiny-qnnpack" in project.doit()
    verification = json.loads(project.artifact("tiny/manifest.json").read_text())["verification"]["qnnpack"]
    assert verification["status"] == "passed"
    assert verification["metrics"]["accuracy_artifact"] > 0.9


@pytest.mark.slow
def test_dynamic_int8_targets_on_executorch_and_onnx_build_and_say_so(project):
    """quantize.mode: dynamic on the routes whose final stage quantizes: built without calibration, verified at each
    size of the dynamic dim, and recorded as dynamic in the manifest and the report."""
    import inspect

    (project.root / "tinytext.py").write_text("import torch\nfrom torch import nn\n\n\n"
                                              + inspect.getsource(tiny_models.TinyTransformer)
                                              + "\n\ndef make():\n    return TinyTransformer()\n")
    dynamic = {"mode": "dynamic"}
    recipe = tiny_recipe(model={"factory": "tinytext:make", "seed": 0},
                         inputs=[{"name": "ids", "shape": [1, "seq"], "dtype": "int64", "range": [0, 100]}],
                         dims={"seq": {"min": 4, "max": 32, "example": 16}},
                         targets=[{"backend": "xnnpack", "runtime": "executorch", "precision": "int8",
                                   "name": "et-dyn", "quantize": dynamic},
                                  {"backend": "onnx", "precision": "int8", "name": "onnx-dyn", "quantize": dynamic}])
    del recipe["input"]
    project.write_recipe(recipe)
    executed = project.doit()
    assert {"lower:tiny-et-dyn", "onnx:tiny-onnx-dyn", "layers:tiny-et-dyn", "layers:tiny-onnx-dyn"} <= set(executed)
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    for target in manifest["targets"]:
        assert target["status"] == "passed", target
        assert target["quantization"] == {"mode": "dynamic", "weights": None} and target["fixed_shape"] is None
        result = manifest["verification"][target["target"]]
        assert not result.get("calibrated") and result["metrics"]["sqnr_db"] > 35
        assert set(result["sizes"]) == {"min", "example", "max"}, result  # its dims kept
        assert not manifest["layers"][target["target"]].get("error")
    report = project.artifact("report.md").read_text()
    assert "| et-dyn | dynamic |" in report and "| onnx-dyn | dynamic |" in report  # the compression column
