"""`mobilebuild check`: the compatibility pre-flight on tiny models, each asked of the real toolchains (the NNAPI
converter, ExecuTorch's lowering, torch.onnx.export, quantized kernels) in memory."""

import json
import textwrap

import pytest
import torch
import yaml

from mobilebuild import preflight

# Factories for the recipes below; a module name of its own, as recipe factories are imported by name.
MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        """Conv-BN-activation, Conv-ReLU, pooling, a linear head of 5 outputs."""

        def __init__(self, activation=nn.ReLU, width=8):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, width, 3, bias=False), nn.BatchNorm2d(width), activation(),
                                          nn.Conv2d(width, 16, 3), nn.ReLU())
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.head = nn.Linear(16, 5)

        def forward(self, x):
            return self.head(torch.flatten(self.pool(self.features(x)), 1))


    class ConvertsItsInput(Net):
        """The performance recipe's model converts its own input to channels_last."""

        def forward(self, x):
            return super().forward(x.contiguous(memory_format=torch.channels_last))


    class CumulativeHead(Net):
        """XNNPACK has no cumulative sum: it stays on ExecuTorch's portable kernels."""

        def forward(self, x):
            return super().forward(x).cumsum(1)


    class InverseErrorHead(Net):
        """No kernel library of ExecuTorch's runtime has erfinv: the program would not load."""

        def forward(self, x):
            return torch.erfinv(torch.tanh(super().forward(x)) * 0.5)


    class Branchy(nn.Module):
        """Control flow on tensor values: FX and torch.export cannot capture it, and no nn.Sequential shows the
        Conv-BN pair to eager fusion."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, bias=False)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            if x.mean() > 0:
                return self.bn(self.conv(x))
            return self.bn(self.conv(-x))


    class PlainAdd(nn.Module):
        """`+` on two quantized tensors has no quantized kernel (FloatFunctional has)."""

        def __init__(self):
            super().__init__()
            self.left = nn.Conv2d(3, 8, 1)
            self.right = nn.Conv2d(3, 8, 1)

        def forward(self, x):
            return self.left(x) + self.right(x)


    def clean():
        return Net()


    def relu6():
        return Net(nn.ReLU6)


    def relu6_inplace():
        return Net(lambda: nn.ReLU6(inplace=True))


    def hardswish():
        return Net(nn.Hardswish)


    def converts_its_input():
        return ConvertsItsInput(nn.Hardswish)


    def narrow():
        return Net(width=12)


    def cumulative():
        return CumulativeHead()


    def inverse_error():
        return InverseErrorHead()


    def branchy():
        return Branchy()


    def plain_add():
        return PlainAdd()
''')

NHWC = {"shape": [1, 3, 12, 12], "memory_format": "channels_last"}
NCHW = {"shape": [1, 3, 12, 12]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("preflight")
    (folder / "preflight_models.py").write_text(MODELS)
    (folder / "recipes").mkdir()
    return folder


def write_recipe(root, name, factory, targets, input_config=NHWC):
    recipe = {"name": name, "model": {"factory": f"preflight_models:{factory}"}, "input": input_config,
              "quantize": {"calibration": {"source": "random", "batches": 1, "seed": 0}}, "targets": targets}
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path.relative_to(root)


def by_target(report, target):
    return next(result for result in report["targets"] if result["target"] == target)


def kinds(findings):
    return sorted(item["kind"] for item in findings)


def test_relu6_is_flagged_for_nnapi_and_fuses_on_xnnpack(root):
    report = preflight.run(write_recipe(root, "relu6", "relu6", [{"backend": "nnapi"}, {"backend": "xnnpack"}]), root)
    (advice,) = by_target(report, "nnapi")["findings"]
    assert advice["kind"] == "advice" and advice["target"] == "nnapi"
    assert advice["detail"].startswith("ReLU6 does not fuse") and advice["where"] == "features.0"
    assert by_target(report, "xnnpack")["findings"] == []  # a clamp: optimize_for_mobile folds it
    assert report["exit_code"] == 0 and report["blocking"] == 0


def test_in_place_relu6_has_no_nnapi_conversion(root):
    report = preflight.run(write_recipe(root, "relu6_inplace", "relu6_inplace", [{"backend": "nnapi"}]), root)
    blocking = [item for item in by_target(report, "nnapi")["findings"] if item["kind"] == "unsupported-op"]
    assert len(blocking) == 1 and "aten::hardtanh_" in blocking[0]["detail"]
    assert blocking[0]["where"] == "features.2, a ReLU6"
    assert report["exit_code"] == 1


def test_widths_not_a_multiple_of_8_are_listed_by_layer(root):
    report = preflight.run(write_recipe(root, "narrow", "narrow", [{"backend": "xnnpack"}]), root)
    (width,) = report["model"]["findings"]  # the head's 5 outputs are the task's, not flagged
    assert width["target"] == preflight.ALL_TARGETS and width["kind"] == "advice"
    assert width["where"] == "features.0 (Conv2d)" and width["detail"].startswith("12 output channels")
    assert report["exit_code"] == 0


def test_executorch_xnnpack_delegation_and_its_fallback_ops(root):
    targets = [{"backend": "xnnpack", "runtime": "executorch"}]
    clean = preflight.run(write_recipe(root, "delegated", "clean", targets, NCHW), root)
    result = by_target(clean, "xnnpack-executorch")
    assert result["delegate"] == "xnnpack"
    assert result["delegation"]["delegated_calls"] == 1 and result["delegation"]["fallback_calls"] == 0
    assert result["findings"] == [] and clean["exit_code"] == 0

    # outside the delegate is a warning: the program builds, loads and runs on the portable kernels
    partly = preflight.run(write_recipe(root, "partly", "cumulative", targets, NCHW), root)
    (fallback,) = by_target(partly, "xnnpack-executorch")["findings"]
    assert fallback["kind"] == "fallback" and fallback["where"] == "aten::cumsum.out"
    assert partly["exit_code"] == 0 and partly["blocking"] == 0

    # an operator no kernel library has: the program cannot load, which blocks
    missing = preflight.run(write_recipe(root, "missing", "inverse_error", targets, NCHW), root)
    found = by_target(missing, "xnnpack-executorch")["findings"]
    (kernel,) = [item for item in found if item["kind"] == "cannot-run"]
    assert missing["exit_code"] == 1 and "aten::erfinv.out" not in [item["where"] for item in found]
    assert kernel["detail"].startswith("the program cannot load: ExecuTorch's runtime has no kernel for "
                                       "aten::erfinv.out")


@pytest.mark.skipif(hasattr(torch.ops.vulkan_prepack, "create_conv2d_context"), reason="this torch exports Vulkan")
def test_pytorch_mobile_vulkan_needs_a_vulkan_build(root, monkeypatch, capsys):
    path = write_recipe(root, "gpu", "clean", [{"backend": "vulkan"}, {"backend": "vulkan", "runtime": "executorch",
                                                                        "name": "et-vulkan"}], NCHW)
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path), "--json", "--target", "vulkan"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [result["target"] for result in report["targets"]] == ["vulkan"]  # --target: the one asked for
    (needs,) = report["targets"][0]["findings"]
    assert needs["kind"] == "needs-build" and "USE_VULKAN=1" in needs["detail"]


def test_a_clean_model_exits_0_with_a_table_per_target(root, monkeypatch, capsys):
    path = write_recipe(root, "clean", "clean", [{"backend": "xnnpack"}, {"backend": "qnnpack"},
                                                 {"backend": "nnapi"}, {"backend": "onnx"}])
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for target, route in (("xnnpack", "pytorch-mobile, fp32"), ("qnnpack", "pytorch-mobile, int8"),
                          ("nnapi", "pytorch-mobile, fp32"), ("onnx", "onnxruntime, fp32")):
        assert any(line.startswith(f"{target} (") and route in line and line.endswith(": ok") for line in lines)
    assert lines[-1] == "0 blocking, 0 advice: no blocking findings (exit 0)"


def test_advice_depends_on_what_the_target_fuses(root):
    targets = [{"backend": "xnnpack"}, {"backend": "onnx"}]
    report = preflight.run(write_recipe(root, "hardswish", "hardswish", targets, NCHW), root)
    wheres = {item["where"]: item["detail"] for item in by_target(report, "xnnpack")["findings"]}
    assert wheres["features.0"].startswith("Hardswish does not fuse")
    assert "channels_last" in wheres["input.memory_format"]  # NCHW input on XNNPACK through PyTorch Mobile
    assert by_target(report, "onnx")["findings"] == []  # no claim about ONNX Runtime's fusions
    assert report["exit_code"] == 0


def test_a_model_that_converts_its_own_input_needs_no_channels_last_advice(root):
    report = preflight.run(write_recipe(root, "converts", "converts_its_input", [{"backend": "xnnpack"}], NCHW), root)
    assert [item["where"] for item in by_target(report, "xnnpack")["findings"]] == ["features.0"]  # Hardswish only


def test_unseen_conv_bn_and_an_unexportable_model(root):
    report = preflight.run(write_recipe(root, "branchy", "branchy", [{"backend": "onnx"}]), root)
    (pair,) = report["model"]["findings"]
    assert pair["where"] == "bn after conv" and "[conv, bn]" in pair["detail"]
    (export,) = by_target(report, "onnx")["findings"]
    assert export["kind"] == "unsupported-op" and export["detail"].startswith("torch.export cannot capture")
    assert report["exit_code"] == 1


def test_int8_operations_without_a_quantized_kernel_go_to_fx_graph_mode(root):
    """Eager mode has no kernel for `+` on quantized tensors; the model has no stubs of its own, so the quantize
    stage (and the check with it) quantizes it in FX graph mode instead, and says so."""
    report = preflight.run(write_recipe(root, "plain_add", "plain_add", [{"backend": "qnnpack"}]), root)
    qnnpack = by_target(report, "qnnpack")
    assert qnnpack["findings"] == [] and report["exit_code"] == 0
    (note,) = qnnpack["notes"]
    assert "eager mode cannot quantize it (fails on the qnnpack engine in Tensor.add" in note
    assert "quantized in FX graph mode; operations kept float: none" in note


@pytest.mark.parametrize("factory, arguments, expected", [
    ("missing", [], "model.factory: module 'preflight_models' has no attribute 'missing'"),
    ("clean", ["--target", "nope"], "targets: no target 'nope' in the recipe (targets: xnnpack)"),
])
def test_a_bad_recipe_is_one_line_and_exit_2(root, monkeypatch, capsys, factory, arguments, expected):
    path = write_recipe(root, f"bad_{factory}", factory, [{"backend": "xnnpack"}])
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path), *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines() == [f"{path.as_posix()}: {expected}"]
