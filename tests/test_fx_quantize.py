"""int8 for models not written for eager-mode quantization: where eager mode has no kernel for an operation (`+`,
SiLU, `*`), the quantize stage quantizes in FX graph mode, says so and which operations stay float; the stored
model is rebuilt exactly by the stages after it."""

import json
import textwrap
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_recipe
from tiny_models import stored_fused
from torch import nn
from torch.nn import functional as F

from mobilebuild.engine import fetched
from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import calibration, exclusion, fuse, fx_quantize, modeling, quantize

INPUTS = [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]
CALIBRATION = {"source": "random", "batches": 8, "seed": 0}

RESIDUAL = textwrap.dedent('''
    import torch
    from torch import nn


    class Residual(nn.Module):
        """`+` and Hardswish without FloatFunctional or stubs: what most models look like."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.act = nn.Hardswish()
            self.skip = nn.Conv2d(3, 8, 1)
            self.head = nn.Linear(8 * 8 * 8, 4)

        def forward(self, x):
            return self.head(torch.flatten(self.act(self.bn(self.conv(x))) + self.skip(x), 1))


    def make():
        return Residual()
''')


@pytest.fixture
def residual(tmp_path, monkeypatch):
    """The fused model, from a module of its own: the stages after fuse rebuild it from its factory."""
    (tmp_path / "residual_model.py").write_text(RESIDUAL)
    monkeypatch.syspath_prepend(str(tmp_path))

    def make():
        import residual_model

        torch.manual_seed(0)
        return fuse.fuse(residual_model.make().eval(), "auto")[0]

    return make


def batches():
    return calibration.batches(CALIBRATION, INPUTS)


def test_eager_mode_failing_falls_back_to_fx_graph_mode_and_the_stored_model_is_rebuilt(tmp_path, residual):
    model = residual()
    stored_fused(model, tmp_path / "fused.pt", factory="residual_model:make")
    quantized, note = quantize.static_any(model, "qnnpack", batches, None, "quantize.calibration", INPUTS)
    assert isinstance(quantized, torch.fx.GraphModule)
    assert note.startswith("eager mode cannot quantize it (fails on the qnnpack engine in Tensor.add")
    assert note.endswith("quantized in FX graph mode, weights per-channel; operations kept float: none")
    modeling.save({quantize.GRAPH_MODE: "fx", "state_dict": quantized.state_dict()}, tmp_path / "quantized.pt")
    stage = SimpleNamespace(engine="qnnpack", quantization={"mode": "static", "weights": None}, inputs=INPUTS,
                            model={"factory": "residual_model:make"}, fuse="auto")
    rebuilt = quantize.load_quantized({"model": tmp_path / "fused.pt", "quantized": tmp_path / "quantized.pt"}, stage)
    example = modeling.example_inputs(INPUTS, seed=5)[0]
    with torch.no_grad():
        assert torch.equal(quantized(example), rebuilt(example))
        reference = residual()(example)
    assert 10 * torch.log10(reference.pow(2).mean() / (reference - rebuilt(example)).pow(2).mean()) > 15


def test_a_model_written_for_eager_mode_keeps_its_error():
    """A model with stubs of its own chose eager mode: its missing FloatFunctional is its author's to fix."""
    class Stubbed(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = torch.ao.quantization.QuantStub(), torch.ao.quantization.DeQuantStub()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            x = self.quant(x)
            return self.dequant(self.conv(x) + x)

    with pytest.raises(MobileBuildError, match="in Tensor.add .*use torch.ao.nn.quantized.FloatFunctional"):
        quantize.static_any(Stubbed().eval(), "qnnpack", batches, None, "quantize.calibration", INPUTS)


class ReadsItsWeightsDevice(nn.Module):
    """As timm's EdgeNeXt does in its positional encoding: FX records the read of `weight.device`, and convert_fx
    swaps the convolution for a quantized one whose `weight` is a method."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        mask = torch.zeros(x.shape).to(device=self.conv.weight.device, dtype=torch.bool)
        return self.conv(x) + x.masked_fill(mask, 0.0)


def test_a_graph_module_that_fails_on_the_engine_is_one_line_naming_the_model_source(capfd):
    """torch.fx prints the failing GraphModule's traceback before it raises again: none of it reaches the console."""
    with pytest.raises(MobileBuildError, match="fails on the qnnpack engine: 'function' object has no attribute "
                                               "'device'") as caught:
        quantize.static_any(ReadsItsWeightsDevice().eval(), "qnnpack", batches, None, "quantize.calibration",
                            INPUTS, source_field="model.timm")
    assert caught.value.field == "model.timm"
    assert "Traceback" not in capfd.readouterr().err
    # the quantize stage names the recipe's own source field
    assert [modeling.source_field(source) for source in ({"timm": "edgenext_xx_small"}, {"transformers": "AutoModel"},
                                                          {"factory": "m:f"}, {"torchvision": "mobilenet_v2"})] == [
        "model.timm", "model.transformers", "model.factory", "model.torchvision"]


def test_what_stays_float_is_named():
    class WithSilu(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.act = nn.SiLU()

        def forward(self, x):
            return self.act(self.conv(x))

    _, note = quantize.static_any(WithSilu().eval(), "qnnpack", batches, None, "quantize.calibration", INPUTS)
    assert note.endswith("operations kept float: SiLU x1")


class Functional(nn.Module):
    """Weights used through torch.nn.functional, as timm's Linear does: FX graph mode packs them into script objects
    held as attributes of the converted model, which torch.load(weights_only=True) refuses."""

    def __init__(self):
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.matrix = nn.Parameter(torch.randn(2, 4 * 8 * 8) * 0.1)
        self.offset = nn.Parameter(torch.randn(2))

    def forward(self, x):
        x = F.relu(F.conv2d(x, self.kernel, None, (1, 1), (1, 1), (1, 1), 1))
        return F.linear(torch.flatten(x, 1), self.matrix, self.offset)


def test_packed_weights_are_stored_as_tensors_and_put_back_into_the_rebuilt_model(tmp_path):
    quantize.use_engine("qnnpack")
    torch.manual_seed(0)
    quantized = fx_quantize.static(Functional().eval(), "qnnpack", batches(), INPUTS)
    state = quantized.state_dict()
    assert sorted(value._type().name() for value in state.values() if isinstance(value, torch.ScriptObject)) == [
        "Conv2dPackedParamsBase", "LinearPackedParamsBase"]
    stored = {quantize.GRAPH_MODE: "fx", **fx_quantize.storable(state)}
    modeling.save(stored, tmp_path / "quantized.pt")
    assert fetched.problem(tmp_path / "quantized.pt", "weights") is None
    saved = modeling.load_weights_only(tmp_path / "quantized.pt", field=None)

    torch.manual_seed(1)  # other weights: the rebuilt structure's own packed weights differ from the stored ones
    rebuilt = fx_quantize.rebuild(Functional().eval(), "qnnpack", INPUTS)
    example = modeling.example_inputs(INPUTS, seed=5)[0]
    with torch.no_grad():
        assert not torch.equal(rebuilt(example), quantized(example))
        fx_quantize.load_state(rebuilt, saved, tmp_path / "quantized.pt")
        assert torch.equal(rebuilt(example), quantized(example))

    del saved["packed"][sorted(saved["packed"])[0]]
    with pytest.raises(MobileBuildError, match=r"quantized.pt does not match the model rebuilt from the recipe "
                                               r"\(packed weights _packed_weight_0\)"):
        fx_quantize.load_state(rebuilt, saved, tmp_path / "quantized.pt")


@pytest.mark.slow
def test_a_model_without_stubs_builds_and_verifies_int8_on_qnnpack(project):
    (project.root / "residual.py").write_text(RESIDUAL)
    # 32 batches: on 8, held-out inputs gave 12.2 dB (a pass at 15 dB only when verified on the calibration batches)
    project.write_recipe(tiny_recipe(model={"factory": "residual:make", "seed": 0, "batchnorm_stats": 2},
                                     quantize={"calibration": {**CALIBRATION, "batches": 32}},
                                     targets=[{"backend": "qnnpack"}]))
    result = project.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "quantized in FX graph mode" in result.stdout
    verification = json.loads(project.artifact("tiny/verify-qnnpack.json").read_text())
    assert verification["status"] == "passed" and verification["metrics"]["sqnr_db"] > 15


def test_an_engine_refusing_a_modules_operation_names_the_module_and_what_to_keep_float():
    """timm's EfficientFormerV2 downsamples its attention's query with a 1x1 average pooling, which QNNPACK refuses;
    keeping the pooling float fails the same (FX still feeds it its quantized input), the query float runs."""
    from timm.models.efficientformer_v2 import Attention2dDownsample

    torch.manual_seed(0)
    # in a Sequential: the attention's own train() returns None, which timm's models never meet at the top
    model = nn.Sequential(Attention2dDownsample(dim=16, key_dim=8, num_heads=2, attn_ratio=2, resolution=8,
                                                out_dim=16)).eval()
    specs = [{"name": "x", "shape": [1, 16, 8, 8], "dtype": "float32", "memory_format": "contiguous",
              "distribution": {"uniform": {"low": 0, "high": 1}}}]

    def images():
        return ((torch.rand(1, 16, 8, 8),) for _ in range(2))

    with pytest.raises(MobileBuildError) as caught:
        quantize.static_any(model, "qnnpack", images, None, "quantize.calibration", specs, "model.timm")
    assert caught.value.message.endswith(
        "1x1 pooling is meaningless (at 0.q.pool (AvgPool2d)); keep the module holding it float (quantize.exclude: "
        "[0.q]) or use another target"), caught.value.message
    quantized, _ = quantize.static_any(model, "qnnpack", images, None, "quantize.calibration", specs, "model.timm",
                                       exclusion.resolve(model, ["0.q"]))
    assert quantized(torch.rand(1, 16, 8, 8)).shape == (1, 16, 4, 4)
