"""The NNAPI stage and runtime: the NNAPI post's three modes on a tiny model, inspected on the host (it cannot run
here: no libneuralnetworks.so), and the one-line errors for what the converter cannot take."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from tiny_models import stored_fused
from torch import nn
from torch.jit.mobile import _load_for_lite_interpreter

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan.stages import NnapiConfig
from mobilebuild.worker.runtimes import nnapi as runtime
from mobilebuild.worker.stages import calibration, fuse, modeling, nnapi, quantize

INPUTS = [{"name": "input", "shape": [1, 3, 12, 12], "dtype": "float32", "memory_format": "contiguous"}]
STATIC = {"mode": "static", "weights": None}


class TinyMobile(nn.Module):
    """MobileNet's layout in miniature: Conv-BN-ReLU, a depthwise convolution, pooling, dropout, a linear head."""

    def __init__(self, activation=nn.ReLU):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), activation(),
                                      nn.Conv2d(8, 8, 3, groups=8), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(8, 5))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class FlattensImages(nn.Module):
    """Flattens an NHWC feature map: the converter knows aten::flatten but refuses this use of it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 10 * 10, 5))

    def forward(self, x):
        return self.head(self.conv(x))


def relu6_in_place():
    return TinyMobile(activation=lambda: nn.ReLU6(inplace=True))


def tiny(activation=nn.ReLU):
    torch.manual_seed(0)
    model = TinyMobile(activation).eval()
    generator = torch.Generator().manual_seed(1)
    batch_norm = model.features[1]  # non-trivial statistics
    batch_norm.running_mean.copy_(torch.randn(8, generator=generator))
    batch_norm.running_var.copy_(torch.rand(8, generator=generator) + 0.5)
    return fuse.fuse(model, "auto")[0]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The fused float model and its qnnpack-quantized state, as the fuse and quantize stages leave them."""
    folder = tmp_path_factory.mktemp("nnapi")
    stored_fused(tiny(), folder / "fused.pt")
    batches = calibration.batches({"source": "random", "seed": 0, "batches": 2}, INPUTS)
    quantized = quantize.static(tiny(), "qnnpack", batches)
    modeling.save(quantized.state_dict(), folder / "quantized.pt")
    return folder


def stage_config(mode, bundled_inputs=True, factory="test_nnapi:TinyMobile"):
    return NnapiConfig(precision="fp32" if mode == "none" else "int8", mode=mode, engine="qnnpack",
                       quantization=None if mode == "none" else STATIC, inputs=INPUTS,
                       options={"bundled_inputs": bundled_inputs}, model={"factory": factory}, fuse="auto")


def build(artifacts, mode, output, **options):
    inputs = {"model": artifacts / "fused.pt"}
    if mode != "none":
        inputs["quantized"] = artifacts / "quantized.pt"
    assert nnapi.run(inputs, stage_config(mode, **options), output) is None
    return output


@pytest.mark.parametrize("mode", ["none", "core", "full"])
def test_each_mode_converts_reproducibly_and_inspects(artifacts, mode, tmp_path):
    first = build(artifacts, mode, tmp_path / "first.ptl")
    # a second conversion in the same process: TorchScript would name its classes ___torch_mangle_<n> otherwise
    second = build(artifacts, mode, tmp_path / "second.ptl")
    assert first.read_bytes() == second.read_bytes()

    facts = runtime.inspect(first, stage_config(mode))
    assert facts["loads"] == {"lite_interpreter": True, "torch.jit.load": True}
    assert facts["bundled_inputs"] == 1
    assert facts["nnapi_model_present"] and facts["mode"] == mode
    model = facts["nnapi_model"]
    assert model["operands"] > 0 and model["operations"] > 0
    assert (model["inputs"], model["outputs"]) == (1, 1)
    assert model["operation_types"]["DEPTHWISE_CONV_2D"] == 1 and "CONV_2D" in model["operation_types"]
    (image,) = model["input_operands"]
    assert image["dims"] == [1, 12, 12, 3]  # NHWC, as the post traces it
    assert image["type"] == ("TENSOR_FLOAT32" if mode == "none" else "TENSOR_QUANT8_ASYMM")


def test_full_mode_bundles_an_input_quantized_like_the_model_expects(artifacts, tmp_path):
    path = build(artifacts, "full", tmp_path / "full.ptl")
    (bundled,), = _load_for_lite_interpreter(str(path)).run_method("get_all_bundled_inputs")
    (image,) = runtime.inspect(path, {})["nnapi_model"]["input_operands"]
    assert bundled.dtype == torch.quint8 and bundled.is_contiguous(memory_format=torch.channels_last)
    assert bundled.q_scale() == pytest.approx(image["scale"], rel=1e-6)
    assert bundled.q_zero_point() == image["zero_point"]


def test_bundled_inputs_can_be_left_out(artifacts, tmp_path):
    path = build(artifacts, "none", tmp_path / "plain.ptl", bundled_inputs=False)
    assert runtime.inspect(path, {})["bundled_inputs"] == 0


def test_an_in_place_relu6_is_named_with_its_module_in_one_line(tmp_path):
    model = tiny(activation=lambda: nn.ReLU6(inplace=True))
    (problem,) = nnapi.unsupported_ops(model, INPUTS)
    assert problem.startswith("aten::hardtanh_ (features.2, a ReLU6)")
    stored_fused(model, tmp_path / "fused.pt")
    with pytest.raises(MobileBuildError) as raised:
        nnapi.run({"model": tmp_path / "fused.pt"}, stage_config("none", factory="test_nnapi:relu6_in_place"),
                  tmp_path / "out.ptl")
    assert raised.value.field == "targets"
    assert "aten::hardtanh_ (features.2, a ReLU6)" in raised.value.message
    assert "\n" not in str(raised.value)


def test_unsupported_ops_takes_a_traced_model_too():
    example = nnapi.nhwc_input(INPUTS)
    assert nnapi.unsupported_ops(nnapi.trace(tiny(), example), INPUTS) == []
    traced = nnapi.trace(tiny(activation=nn.ReLU6).eval(), example)  # out of place: aten::hardtanh converts
    assert nnapi.unsupported_ops(traced, INPUTS) == []


def test_unsupported_ops_checks_a_quantized_model_through_its_core(artifacts):
    quantized = quantize.load_quantized({"model": artifacts / "fused.pt", "quantized": artifacts / "quantized.pt"},
                                        stage_config("core"))
    assert nnapi.unsupported_ops(quantized, INPUTS) == []
    assert isinstance(quantized.quant, torch.ao.nn.quantized.Quantize)  # the caller's model is left whole


def test_a_node_the_converter_refuses_is_located(tmp_path):
    stored_fused(FlattensImages().eval(), tmp_path / "fused.pt")
    with pytest.raises(MobileBuildError, match=r"at aten::flatten \(head\.0, a Flatten\): .*NHWC"):
        nnapi.run({"model": tmp_path / "fused.pt"}, stage_config("none", factory="test_nnapi:FlattensImages"),
                  tmp_path / "out.ptl")


def test_quantized_modes_need_a_quantized_model(artifacts, tmp_path):
    with pytest.raises(MobileBuildError, match="add a quantize step"):
        nnapi.run({"model": artifacts / "fused.pt"}, dataclasses.replace(stage_config("core"), quantization=None),
                  tmp_path / "out.ptl")


@pytest.mark.skipif(runtime.has_nnapi(), reason="this host has NNAPI")
def test_loading_on_the_host_says_where_it_runs(artifacts, tmp_path):
    path = build(artifacts, "none", tmp_path / "none.ptl", bundled_inputs=False)
    with pytest.raises(MobileBuildError, match="Android device with NNAPI") as raised:
        runtime.load(path, SimpleNamespace())
    assert raised.value.field == "targets"
    assert runtime.inspect(path, {})["runs_on_host"] is False


def test_an_unknown_serialization_version_is_refused():
    with pytest.raises(ValueError, match="version 2"):
        runtime.parse_model([2, 0, 0, 0, 0, 0])
