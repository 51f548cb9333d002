"""The NNAPI stage and runtime: the NNAPI post's three modes on a tiny model, inspected on the host (it cannot run
here: no libneuralnetworks.so), and the one-line errors for what the converter cannot take."""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from tiny_models import stored_fused
from torch import nn
from torch.jit.mobile import _load_for_lite_interpreter

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.nnapi.plan import NnapiConfig
from mobilebuild.routes.nnapi.worker import nnapi, runtime
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import calibration, fuse, modeling, quantize

INPUTS = [{"name": "input", "shape": [1, 3, 12, 12], "dtype": "float32", "memory_format": "contiguous"}]
STATIC = {"mode": "static", "weights": "per_tensor"}  # as the plan gives NNAPI (routes.nnapi)


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


# --- several inputs ---------------------------------------------------------------------------------------------

IMAGE = {"name": "image", "shape": [1, 3, 12, 12], "dtype": "float32", "memory_format": "channels_last"}
SIDE = {"name": "side", "shape": [1, 4], "dtype": "float32", "memory_format": "contiguous"}
TWO = [IMAGE, SIDE]


class ImageAndSide(nn.Module):
    """An image and a metadata vector: TinyMobile's features pooled, plus the vector through a linear layer."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 8, 3, groups=8), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.side = nn.Linear(4, 8)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(8, 5))

    def forward(self, image, side):
        return self.classifier(torch.relu(torch.flatten(self.pool(self.features(image)), 1) + self.side(side)))


class TwoImages(nn.Module):
    """Two images, each pooled to a vector before they meet: they may reach NNAPI in different layouts."""

    def __init__(self):
        super().__init__()
        self.left = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.right = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 5)

    def forward(self, left, right):
        return self.head(self.left(left) + self.right(right))


class MixesImages(TwoImages):
    """Adds two feature maps: the converter cannot add an NHWC one to an NCHW one."""

    def forward(self, left, right):
        return self.left[1](self.left[0](left) + self.right[0](right))


def image_and_side():
    torch.manual_seed(0)
    model = ImageAndSide().eval()
    batch_norm = model.features[1]
    generator = torch.Generator().manual_seed(1)
    batch_norm.running_mean.copy_(torch.randn(8, generator=generator))
    batch_norm.running_var.copy_(torch.rand(8, generator=generator) + 0.5)
    return model


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    """ImageAndSide fused, and quantized by the quantize stage's route for it (FX graph mode: eager mode's stubs take
    one input), stored as that stage stores it."""
    folder = tmp_path_factory.mktemp("nnapi-two")
    fused = fuse.fuse(image_and_side(), "auto")[0]
    stored_fused(fused, folder / "fused.pt")
    batches = lambda: calibration.batches({"source": "random", "seed": 0, "batches": 16}, TWO)  # noqa: E731
    quantized, note = quantize.static_any(copy.deepcopy(fused), "qnnpack", batches, "per_tensor",
                                          "quantize.calibration", TWO)
    assert "FX graph mode" in note
    modeling.save({quantize.GRAPH_MODE: "fx", "state_dict": quantized.state_dict()}, folder / "quantized.pt")
    return folder, fused, quantized


def two_config(mode, specs=TWO, factory="test_nnapi:image_and_side"):
    return dataclasses.replace(stage_config(mode, factory=factory), inputs=specs)


def build_two(folder, mode, output, specs=TWO, factory="test_nnapi:image_and_side"):
    inputs = {"model": folder / "fused.pt"}
    if mode != "none":
        inputs["quantized"] = folder / "quantized.pt"
    nnapi.run(inputs, two_config(mode, specs, factory), output)
    return output


@pytest.mark.parametrize("mode", ["none", "core", "full"])
def test_a_model_of_two_inputs_converts_in_each_mode_and_inspects(two_inputs, mode, tmp_path):
    folder, _, quantized = two_inputs
    first = build_two(folder, mode, tmp_path / "first.ptl")
    assert first.read_bytes() == build_two(folder, mode, tmp_path / "second.ptl").read_bytes()

    facts = runtime.inspect(first, two_config(mode))
    assert facts["loads"] == {"lite_interpreter": True, "torch.jit.load": True}
    assert facts["bundled_inputs"] == 1 and facts["mode"] == mode
    model = facts["nnapi_model"]
    assert (model["inputs"], model["outputs"]) == (2, 1)
    assert {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD"} <= set(model["operation_types"])
    image, side = model["input_operands"]
    assert (image["dims"], side["dims"]) == ([1, 12, 12, 3], [1, 4])  # the image NHWC (channels_last), side as is
    if mode == "none":
        assert image["type"] == side["type"] == "TENSOR_FLOAT32"
    else:  # each input quantized by its own quantizer, at the scale FX graph mode calibrated for it
        assert image["type"] == side["type"] == "TENSOR_QUANT8_ASYMM"
        scales = {node.args[0].target: getattr(quantized, node.args[1].target).item()
                  for node in quantized.graph.nodes if node.target is torch.quantize_per_tensor}
        assert image["scale"] == pytest.approx(scales["image"], rel=1e-6)
        assert side["scale"] == pytest.approx(scales["side"], rel=1e-6)

    lite = _load_for_lite_interpreter(str(first))
    bundled = lite.run_method("get_all_bundled_inputs")[0]
    assert [tuple(x.shape) for x in bundled] == [(1, 3, 12, 12), (1, 4)]
    assert bundled[0].is_contiguous(memory_format=torch.channels_last)
    assert [x.dtype for x in bundled] == [torch.quint8 if mode == "full" else torch.float32] * 2
    if mode == "full":
        assert [(x.q_scale(), x.q_zero_point()) for x in bundled] == \
            [(pytest.approx(op["scale"], rel=1e-6), op["zero_point"]) for op in (image, side)]


def test_the_int8_core_and_its_input_quantizers_compute_what_the_quantized_model_does(two_inputs):
    """The host cannot run NNAPI; what it converts can be run: the FX model split into one quantizer per input and its
    quantized core gives the quantized model's numbers exactly, close to the float model's."""
    _, fused, quantized = two_inputs
    quantizers, core, dequantized = nnapi.split_inputs(copy.deepcopy(quantized), TWO)
    assert sorted(quantizers) == [0, 1] and dequantized == [True]
    assert not any(node.target is torch.quantize_per_tensor for node in core.graph.nodes)
    inputs = modeling.example_inputs(TWO, seed=7, batch=16)
    with torch.no_grad():
        expected = quantized(*inputs)
        produced = core(*(quantizers[index](x) for index, x in enumerate(inputs))).dequantize()
        assert torch.equal(expected, produced)
        assert sqnr_db(fused(*inputs), produced) > 20.0  # 25.5 dB


def test_each_image_gets_its_own_layout(tmp_path):
    specs = [{**IMAGE, "name": "left"}, {**IMAGE, "name": "right", "memory_format": "contiguous"}]
    torch.manual_seed(0)
    stored_fused(fuse.fuse(TwoImages().eval(), "auto")[0], tmp_path / "fused.pt")
    path = build_two(tmp_path, "none", tmp_path / "two.ptl", specs, factory="test_nnapi:TwoImages")
    left, right = runtime.inspect(path, {})["nnapi_model"]["input_operands"]
    assert (left["dims"], right["dims"]) == ([1, 12, 12, 3], [1, 3, 12, 12])  # NHWC, and NCHW as contiguous asks
    bundled = _load_for_lite_interpreter(str(path)).run_method("get_all_bundled_inputs")[0]
    assert bundled[0].is_contiguous(memory_format=torch.channels_last) and bundled[1].is_contiguous()

    stored_fused(fuse.fuse(MixesImages().eval(), "auto")[0], tmp_path / "fused.pt")
    with pytest.raises(MobileBuildError) as raised:
        build_two(tmp_path, "none", tmp_path / "mixed.ptl", specs, factory="test_nnapi:MixesImages")
    assert "the 4-D inputs' memory formats differ" in raised.value.message and "\n" not in str(raised.value)


@pytest.mark.parametrize("dtype", ["int64", "float16", "bool", "uint8"])
def test_an_input_type_the_converter_cannot_take_is_one_line_naming_its_dtype(dtype, tmp_path):
    specs = [IMAGE, {**SIDE, "dtype": dtype, **({"range": [0, 4]} if "int" in dtype else {})}]
    with pytest.raises(MobileBuildError) as raised:
        nnapi.run({"model": tmp_path / "unused.pt"}, two_config("none", specs), tmp_path / "out.ptl")
    assert raised.value.field == "inputs[1].dtype"
    assert raised.value.message.startswith(f"the NNAPI target cannot take input side as {dtype}: ")
    assert "\n" not in str(raised.value)


class CountsAsInts(nn.Module):
    """An int32 input kept to integer arithmetic: NNAPI takes it (TENSOR_INT32)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, image, counts):
        return self.features(image), counts + counts


class CountsAsFloats(CountsAsInts):
    """The same input made float: the converter converts aten::to as an identity."""

    def forward(self, image, counts):
        return self.features(image) * counts.to(torch.float32)


COUNTS = [IMAGE, {"name": "counts", "shape": [1, 4], "dtype": "int32", "memory_format": "contiguous",
                  "range": [0, 5]}]


def test_an_int32_input_converts_where_the_model_keeps_it_integer(tmp_path):
    stored_fused(fuse.fuse(CountsAsInts().eval(), "auto")[0], tmp_path / "fused.pt")
    path = build_two(tmp_path, "none", tmp_path / "counts.ptl", COUNTS, factory="test_nnapi:CountsAsInts")
    model = runtime.inspect(path, {})["nnapi_model"]
    assert [op["type"] for op in model["input_operands"]] == ["TENSOR_FLOAT32", "TENSOR_INT32"]
    assert [op["type"] for op in model["output_operands"]] == ["TENSOR_FLOAT32", "TENSOR_INT32"]
    (_, counts), = _load_for_lite_interpreter(str(path)).run_method("get_all_bundled_inputs")
    assert counts.dtype == torch.int32 and 0 <= counts.min() and counts.max() < 5

    stored_fused(fuse.fuse(CountsAsFloats().eval(), "auto")[0], tmp_path / "fused.pt")
    with pytest.raises(MobileBuildError, match=r"converts aten::to as an identity, and the model turns Int into Float"):
        build_two(tmp_path, "none", tmp_path / "floats.ptl", COUNTS, factory="test_nnapi:CountsAsFloats")


def test_an_eager_quantized_model_of_two_inputs_is_refused_in_one_line():
    model = nn.Module()
    model.quant, model.dequant = torch.ao.nn.quantized.Quantize(0.1, 0, torch.quint8), nnq_dequantize()
    with pytest.raises(MobileBuildError, match="stubs of its own") as raised:
        nnapi.split_inputs(model, TWO)
    assert raised.value.field == "targets" and "\n" not in str(raised.value)
    with pytest.raises(MobileBuildError, match="no input quantizers"):
        nnapi.split_inputs(image_and_side(), TWO)


def nnq_dequantize():
    return torch.ao.nn.quantized.DeQuantize()


class TwoOutputs(nn.Module):
    """Two heads; FX graph mode keeps the functional ReLU float (a dequantize and a quantize around it)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.side = nn.Linear(4, 8)
        self.scores = nn.Linear(8, 5)
        self.embedding = nn.Linear(8, 3)

    def forward(self, image, side):
        x = torch.flatten(self.pool(torch.relu(self.conv(image))), 1) + self.side(side)
        return self.scores(x), self.embedding(x)


def test_core_mode_dequantizes_each_output_and_converts_what_stayed_float(tmp_path):
    torch.manual_seed(0)
    model = TwoOutputs().eval()
    batches = lambda: (modeling.example_inputs(TWO, seed=seed) for seed in range(16))  # noqa: E731
    quantized, _ = quantize.static_any(copy.deepcopy(model), "qnnpack", batches, "per_tensor", "quantize.calibration",
                                        TWO)
    quantizers, core, dequantized = nnapi.split_inputs(copy.deepcopy(quantized), TWO)
    assert dequantized == [True, True]
    inputs = modeling.example_inputs(TWO, seed=7, batch=8)
    with torch.no_grad():
        for expected, produced in zip(quantized(*inputs), core(*(quantizers[i](x) for i, x in enumerate(inputs)))):
            assert torch.equal(expected, produced.dequantize())

    wrapped = nnapi.build_any(copy.deepcopy(quantized), "core", TWO)
    path = tmp_path / "core.ptl"
    path.write_bytes(wrapped._save_to_buffer_for_lite_interpreter())
    facts = runtime.inspect(path, {})
    assert facts["mode"] == "core" and facts["nnapi_model"]["outputs"] == 2
    assert {"DEQUANTIZE", "RELU", "QUANTIZE"} <= set(facts["nnapi_model"]["operation_types"])
    assert [str(kind) for kind in wrapped.forward.schema.returns[0].type.elements()] == ["Tensor", "Tensor"]


class Residual(nn.Module):
    """`x + conv(x)` on quantized tensors without FloatFunctional: eager mode cannot quantize it, FX graph mode can."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(3, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(x + self.conv(x)), 1))


def test_a_one_input_model_quantized_in_fx_graph_mode_converts_through_its_input_quantizer(tmp_path):
    torch.manual_seed(0)
    batches = lambda: (modeling.example_inputs(INPUTS, seed=seed) for seed in range(8))  # noqa: E731
    quantized, note = quantize.static_any(Residual().eval(), "qnnpack", batches, "per_tensor", "quantize.calibration",
                                           INPUTS)
    assert "FX graph mode" in note
    path = tmp_path / "full.ptl"
    path.write_bytes(nnapi.build_any(quantized, "full", INPUTS)._save_to_buffer_for_lite_interpreter())
    facts = runtime.inspect(path, {})
    (image,) = facts["nnapi_model"]["input_operands"]
    assert facts["mode"] == "full" and image["type"] == "TENSOR_QUANT8_ASYMM"
    assert image["dims"] == [1, 12, 12, 3]  # a lone image is NHWC, as the post has it, whatever its memory_format
