"""ncnn int8 (routes/ncnn/worker/int8.py): pnnx's fp32 model calibrated on the recipe's data as ncnn2table does and
rewritten as ncnn2int8 does, run by ncnn's own int8 kernels on its CPU and Vulkan paths."""

import struct
import zipfile

import pytest
import torch
from test_ncnn import IMAGE, conv_net, mlp, reference, run, spec, to_ncnn
from torch import nn
from torch.ao import quantization
from torch.ao.quantization import quantize_fx

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.ncnn import plan as ncnn_route
from mobilebuild.routes.ncnn.plan import ConvertConfig
from mobilebuild.routes.ncnn.worker import guest, int8, layers, runtime
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import checkpoint, modeling
from mobilebuild.worker.stages.calibration import batches as calibration_batches

ncnn = pytest.importorskip("ncnn")

RANDOM = {"source": "random", "batches": 8, "seed": 0}
INT8_DB = 20.0


def files_of(path):
    return guest.read(path)[0]


def layers_of(path):
    files = files_of(path)
    layers = int8.parse(files[guest.PARAM].decode())
    int8.spans(layers, files[guest.BIN])
    return {layer.name: layer for layer in layers}


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ncnn-int8")
    path, model = to_ncnn(conv_net, [IMAGE], folder, name="int8", precision="int8", calibration=RANDOM)
    fp32, _ = to_ncnn(conv_net, [IMAGE], folder, name="fp32")
    return path, model, fp32


def test_the_loader_measures_each_layers_bytes_whatever_their_layout(quantized):
    """ncnn's own loader, one layer at a time, says where each layer's weights end: their sum is the .bin."""
    _, _, fp32 = quantized
    files = files_of(fp32)
    layers = int8.parse(files[guest.PARAM].decode())
    int8.spans(layers, files[guest.BIN])
    assert b"".join(layer.data for layer in layers) == files[guest.BIN]
    convolution = next(layer for layer in layers if layer.type == "Convolution")
    bias = 4 * convolution.int(0) if convolution.int(5) else 0
    assert len(convolution.data) == 4 + 4 * convolution.int(6) + bias
    with pytest.raises(MobileBuildError, match=r"read \d+ of the .bin's \d+ bytes"):
        int8.spans(int8.parse(files[guest.PARAM].decode()), files[guest.BIN] + b"\0" * 8)


def test_a_conv_net_runs_in_int8_close_to_eager_with_int8_weights(quantized):
    path, model, fp32 = quantized
    x = modeling.example_inputs([IMAGE], seed=5, batch=4)[0]
    assert sqnr_db(reference(model, x), run(path, x)) > INT8_DB
    layers = layers_of(path)
    terms = {name: layer.int(8) for name, layer in layers.items() if layer.type in int8.QUANTIZED}
    # the first convolution feeds the second directly: it requantizes to it (ncnn2int8's fuse_requantize)
    assert sorted(terms.values()) == [2, 2, 102], terms
    for layer in layers.values():
        if layer.type in int8.QUANTIZED:
            assert struct.unpack_from("<I", layer.data)[0] == int8.INT8_TAG
    facts = runtime.inspect(path, None)
    assert facts["precision"] == "int8" and facts["int8_layers"] == facts["weighted_layers"] == 3
    assert ncnn_route.structure(facts).endswith("; 3 of 3 layers with weights int8, the rest fp32")
    assert facts["bin_bytes"] < 0.4 * runtime.inspect(fp32, None)["bin_bytes"]
    with zipfile.ZipFile(path) as archive:
        assert archive.comment == b"precision=int8"


def test_3x3_stride_1_convolutions_get_6_bit_weight_scales_as_ncnn2table_gives_them(quantized):
    path, _, _ = quantized
    convolution = next(layer for layer in layers_of(path).values() if layer.type == "Convolution")
    assert int8._six_bit(convolution)
    size = convolution.int(6)
    weights = torch.frombuffer(bytearray(convolution.data[4:4 + size]), dtype=torch.int8)
    assert weights.abs().max() == 31


def test_the_vulkan_path_runs_the_int8_model(quantized):
    path, model, _ = quantized
    if runtime.gpu()[0] == 0:
        pytest.skip("no Vulkan device on this host")
    x = modeling.example_inputs([IMAGE], seed=5, batch=2)[0]
    assert sqnr_db(reference(model, x), run(path, x, vulkan=True)) > INT8_DB


def test_excluded_modules_keep_their_layers_float(tmp_path):
    path, model = to_ncnn(mlp, [spec("x", [1, 16])], tmp_path, precision="int8", calibration=RANDOM,
                          exclude=["2"])
    terms = [layer.int(8) for layer in layers_of(path).values() if layer.type == "InnerProduct"]
    assert terms == [2, 0]
    x = modeling.example_inputs([spec("x", [1, 16])], seed=3, batch=4)[0]
    assert sqnr_db(reference(model, x), run(path, x)) > INT8_DB


def test_layers_are_named_by_their_modules_and_unmatched_ones_refuse_exclude():
    model = mlp()
    param = ("7767517\n4 4\nInput in0 0 1 in0\nInnerProduct linear_0 1 1 in0 1 0=32 1=1 2=512\n"
             "ReLU relu_1 1 1 1 2\nInnerProduct linear_2 1 1 2 out0 0=4 1=1 2=128\n")
    layers = int8.parse(param)
    named = int8.layer_modules(model, lambda: model(torch.zeros(1, 16)), layers)
    assert named == {"linear_0": "0", "linear_2": "2"}
    assert int8.kept_float(["2"], named) == {"linear_2"}
    wrong = int8.parse(param.replace("2=128", "2=64"))
    assert int8.layer_modules(model, lambda: model(torch.zeros(1, 16)), wrong) == {}
    with pytest.raises(MobileBuildError, match="leave exclude out for ncnn") as raised:
        int8.kept_float(["2"], {})
    assert raised.value.field == "quantize.exclude" and "\n" not in raised.value.message


def test_the_observer_and_per_tensor_weights_change_the_scales(tmp_path):
    histogram, _ = to_ncnn(conv_net, [IMAGE], tmp_path, name="histogram", precision="int8", calibration=RANDOM)
    minmax, _ = to_ncnn(conv_net, [IMAGE], tmp_path, name="minmax", precision="int8", calibration=RANDOM,
                        observer="minmax")
    tensor, _ = to_ncnn(conv_net, [IMAGE], tmp_path, name="tensor", precision="int8", calibration=RANDOM,
                        weights="per_tensor")

    def scales(path):
        layer = next(layer for layer in layers_of(path).values() if layer.type == "Convolution")
        bias = 4 * layer.int(0) if layer.int(5) else 0
        start = 4 + layer.int(6) + (-layer.int(6) % 4) + bias
        return struct.unpack_from(f"<{layer.int(0) + 1}f", layer.data, start)

    weight_h, input_h = scales(histogram)[:-1], scales(histogram)[-1]
    weight_m, input_m = scales(minmax)[:-1], scales(minmax)[-1]
    assert weight_h == weight_m and input_h != input_m
    assert len(set(scales(tensor)[:-1])) == 1 and len(set(weight_h)) > 1


def test_a_model_without_layers_to_quantize_is_one_line(tmp_path):
    with pytest.raises(MobileBuildError, match="no Convolution, ConvolutionDepthWise or InnerProduct") as raised:
        to_ncnn(mlp, [spec("x", [1, 16])], tmp_path, precision="int8", calibration=RANDOM, exclude=["0", "2"])
    assert raised.value.field == "quantize.exclude"


@pytest.mark.slow
def test_torchvisions_mobilenet_v2_in_int8_is_as_close_as_torchs_own_int8(tmp_path):
    """An outside model: torchvision's MobileNetV2 (random weights, batch-norm statistics of the data), its
    classifier kept float by module path, each of its 52 convolutions int8. On random data such a model is far
    from eager in any int8 (7.8 dB here); the bar is torch's own int8 (FX graph mode, x86, per-channel weights,
    histogram observer) calibrated on the same batches, measured beside it: 5.7 dB."""
    specs = [spec("input", [1, 3, 96, 96])]
    calibration = {**RANDOM, "batches": 8}
    path, model = to_ncnn(mobilenet, specs, tmp_path, precision="int8", exclude=["classifier.1"],
                          calibration=calibration)
    layers = layers_of(path)
    assert sum(1 for layer in layers.values() if int8.is_int8(layer)) == 52
    assert [layer.int(8) for layer in layers.values() if layer.type == "InnerProduct"] == [0]
    x = modeling.example_inputs(specs, seed=7, batch=4)[0]
    torch.backends.quantized.engine = "x86"
    mapping = quantization.get_default_qconfig_mapping("x86").set_module_name("classifier.1", None)
    prepared = quantize_fx.prepare_fx(mobilenet(), mapping, (x,))
    with torch.no_grad():
        for batch in calibration_batches(calibration, specs):
            prepared(*batch)
        torchs = sqnr_db(reference(model, x), quantize_fx.convert_fx(prepared)(x))
    assert sqnr_db(reference(model, x), run(path, x)) > torchs


def mobilenet():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2()
    return checkpoint.reestimate_batchnorm(model, [spec("input", [1, 3, 96, 96])], 2, seed=0)


def test_each_int8_layer_is_compared_alone_and_named_by_its_module(quantized):
    """The comparison hook (routes/ncnn/worker/layers.py) on the conv net: its two fused Conv-BN-ReLU and its
    classifier, by module; the first requantizes to the second, its int8 output read back at the second's scale."""
    path, _, _ = quantized
    folder = path.parent
    config = ConvertConfig(precision="int8", inputs=[IMAGE], model={"factory": "test_ncnn:conv_net"}, fuse="auto")
    chunks = [modeling.example_inputs([IMAGE], seed=seed) for seed in range(3)]
    errors, method, _ = layers.compare({"model": folder / "int8-fused.pt", "artifact": path}, config, chunks)
    ranked, uncompared = errors.results()
    assert method == "ncnn" and not uncompared
    assert sorted((row["name"], row["op"]) for row in ranked) == [
        ("features.0", "ConvReLU2d"), ("features.3", "ConvReLU2d"), ("head", "Linear")]
    assert all(row["sqnr_db"] > INT8_DB for row in ranked), ranked


def test_a_model_with_a_dynamic_dim_calibrates_at_the_example_sizes_pnnx_converts_at(tmp_path):
    """Random calibration cycles a dynamic dim through its example, smallest and largest sizes; pnnx converted at the
    example's, so only those batches calibrate."""
    image = {**IMAGE, "shape": [1, 3, 16, 16], "dynamic": [{"axis": 2, "name": "height", "min": 12, "max": 24},
                                                           {"axis": 3, "name": "width", "min": 12, "max": 24}]}
    path, model = to_ncnn(conv_net, [image], tmp_path, precision="int8", calibration=RANDOM)
    x = modeling.example_inputs([image], seed=5, batch=2)[0]
    assert sqnr_db(reference(model, x), run(path, x)) > INT8_DB


class DynamicWeight(nn.Module):
    """A convolution whose weights the model computes (pnnx: a Convolution with dynamic_weight, 19=1), after two
    modules' convolutions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3)
        self.kernel = nn.Conv2d(3, 8 * 3 * 9, 16)

    def forward(self, x):
        kernel = self.kernel(x).mean(0).reshape(8, 3, 3, 3)
        return nn.functional.conv2d(self.conv(x)[:, :3], kernel)


def dynamic_weight():
    return DynamicWeight().eval()


def test_a_convolution_of_computed_weights_stays_float_and_the_modules_still_pair(tmp_path):
    path, model = to_ncnn(dynamic_weight, [IMAGE], tmp_path, precision="int8", calibration=RANDOM,
                          exclude=["kernel"])
    terms = {layer.name: layer.int(8) for layer in layers_of(path).values() if layer.type == "Convolution"}
    assert sorted(terms.values()) == [0, 0, 2], terms  # the computed-weight one and the excluded one float
    x = modeling.example_inputs([IMAGE], seed=3)[0]  # one sample: the kernel is a mean over the batch
    assert sqnr_db(reference(model, x), run(path, x)) > INT8_DB


def test_int8_conversions_are_byte_identical(quantized, tmp_path):
    path, _, _ = quantized
    again, _ = to_ncnn(conv_net, [IMAGE], tmp_path, name="again", precision="int8", calibration=RANDOM)
    assert again.read_bytes() == path.read_bytes()


class Attention(nn.Module):
    """A convolution, then self-attention: pnnx writes the attention as MultiHeadAttention and a matmul as Gemm,
    whose param 8 is no int8 scale term (Gemm's is its constantN)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 16, 3)
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
        self.projection = nn.Parameter(torch.randn(16, 12) / 4)

    def forward(self, x):
        tokens = self.conv(x).flatten(2).transpose(1, 2)
        return self.attention(tokens, tokens, tokens, need_weights=False)[0] @ self.projection


def attention():
    return Attention().eval()


def test_only_the_layers_ncnn_quantizes_count_as_int8(tmp_path):
    path, model = to_ncnn(attention, [IMAGE], tmp_path, precision="int8", calibration=RANDOM)
    facts = runtime.inspect(path, None)
    assert facts["int8_layers"] == 1 and facts["weighted_layers"] > 1, facts
    x = modeling.example_inputs([IMAGE], seed=3)[0]
    assert sqnr_db(reference(model, x), run(path, x)) > INT8_DB
