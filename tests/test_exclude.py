"""quantize.exclude and quantize.observer (issue 14, getting int8 accuracy back): a model with one deliberately
broken block (a convolution whose one output channel is 100 times the others, scaled back by the 1x1 convolution
after it) fails int8 verification on every int8 route, and passes with the block kept float; the observer is each
route's own choice; names that match nothing, and observers a route lacks, are one-line errors."""

import json
import textwrap
from types import SimpleNamespace

import onnx
import pytest
import torch
from conftest import tiny_recipe
from test_graph import nodes_for
from tiny_models import stored_fused

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan.stages import QuantizeConfig
from mobilebuild.routes.executorch.plan import LowerConfig
from mobilebuild.routes.executorch.worker import lower
from mobilebuild.routes.onnx.plan import ExportConfig
from mobilebuild.routes.onnx.worker import export
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import exclusion, fuse, modeling, quantize

OUTLIER = textwrap.dedent('''
    import torch
    from torch import nn


    class Outlier(nn.Module):
        """`broken`: a convolution with one output channel amplified, and a 1x1 convolution scaling it back: the
        block computes what it would without the gain, but the tensor between its two convolutions spans a range
        where int8 has no steps left for the other channels."""

        def __init__(self, gain=100.0):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.relu = nn.ReLU()
            self.broken = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.Conv2d(8, 8, 1, bias=False))
            self.act = nn.Hardswish()
            self.head = nn.Conv2d(8, 8, 3, padding=1, bias=False)
            self.fc = nn.Linear(8 * 8 * 8, 10, bias=False)
            with torch.no_grad():
                self.broken[0].weight[0] *= gain
                self.broken[1].weight[:, 0] /= gain

        def block(self, x):
            return self.act(self.broken(self.relu(self.stem(x))))

        def forward(self, x):
            return self.fc(torch.flatten(self.head(self.block(x)), 1))


    class Residual(Outlier):
        """`+` without FloatFunctional: eager mode cannot quantize it, FX graph mode does."""

        def forward(self, x):
            y = self.block(x)
            return self.fc(torch.flatten(self.head(y + y), 1))


    def make(gain=100.0):
        torch.manual_seed(0)
        return Outlier(gain)


    def residual(gain=100.0):
        torch.manual_seed(0)
        return Residual(gain)
''')

INPUTS = [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]
CALIBRATION = {"source": "random", "batches": 16, "seed": 0}
PASS_DB = 15  # verify.thresholds.int8.sqnr_db's default


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    """factory -> (the fused model, the stage settings that rebuild it, its stored path)."""
    folder = tmp_path_factory.mktemp("outlier")
    (folder / "outlier_net.py").write_text(OUTLIER)

    def make(factory="make"):
        import outlier_net

        model = fuse.fuse(getattr(outlier_net, factory)().eval(), "auto")[0].eval()
        path = folder / f"fused-{factory}.pt"
        return model, stored_fused(model, path, factory=f"outlier_net:{factory}"), path

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        yield make


def held_out():
    """Inputs verification would draw: another random stream than calibration's."""
    return [modeling.example_inputs(INPUTS, seed=2**31 + i)[0] for i in range(16)]


def sqnr(model, run):
    with torch.no_grad():
        reference = torch.cat([model(x) for x in held_out()])
        return sqnr_db(reference, torch.cat([run(x) for x in held_out()]))


# --- the grammar ----------------------------------------------------------------------------------------------

def test_entries_are_module_paths_or_classes_resolved_to_the_outermost_paths(outlier):
    model, _, _ = outlier()
    assert exclusion.resolve(model, ["broken"]) == ["broken"]
    assert exclusion.resolve(model, ["broken.0", "broken"]) == ["broken"]  # the outer one holds the inner
    assert exclusion.resolve(model, ["Hardswish", "head"]) == ["act", "head"]
    assert exclusion.resolve(model, ["torch.nn.Hardswish"]) == ["act"]
    assert exclusion.resolve(model, ["torch.nn.modules.activation.Hardswish"]) == ["act"]
    # stem and relu were fused: its Conv2d sits inside a ConvReLU2d, which stays float whole
    assert exclusion.resolve(model, ["Conv2d"]) == ["broken.0", "broken.1", "head", "stem"]
    assert exclusion.resolve(model, ["stem.0"]) == ["stem"]
    assert exclusion.resolve(model, None) == exclusion.resolve(model, []) == []


def test_a_folded_batch_norm_keeps_the_convolution_it_was_folded_into_float():
    """A folded batch norm's own path holds an identity (timm's norm-activation layers: their activation), so keeping
    it float kept nothing of the batch norm's computation: timm's mnasnet_small on qnnpack was 12.4 dB with
    blocks.0.0.bn1 excluded and without; its convolution float, 27.0 dB. The same for torchvision's Conv-BN-ReLU6."""
    import timm
    import torchvision

    mnasnet = fuse.fuse(timm.create_model("mnasnet_small", pretrained=False, num_classes=10).eval(), "auto")[0]
    assert exclusion.resolve(mnasnet, ["blocks.0.0.bn1", "conv_stem"]) == ["blocks.0.0.conv_dw", "conv_stem"]
    mobilenet = fuse.fuse(torchvision.models.mobilenet_v2().eval(), "auto")[0]
    assert exclusion.resolve(mobilenet, ["features.0.1", "features.0.2"]) == ["features.0.0", "features.0.2"]


def test_entries_that_match_nothing_are_one_line_naming_the_models_modules(outlier):
    model, _, _ = outlier()
    with pytest.raises(MobileBuildError) as caught:
        exclusion.resolve(model, ["brokn", "broken"])
    assert caught.value.field == "quantize.exclude"
    assert caught.value.message == ("no module named 'brokn' in the model (its modules: broken, broken.1, broken.0 "
                                    "and 7 more)")
    with pytest.raises(MobileBuildError) as caught:
        exclusion.resolve(model, ["Sigmoid", "torch.nn.GELU"])
    assert caught.value.message == ("no module of class 'Sigmoid', 'torch.nn.GELU' in the model (its classes: "
                                    "ConvReLU2d, Conv2d, ReLU, Identity, Sequential and 2 more)")


# --- each route: the broken block fails int8, kept float it passes ----------------------------------------------

def quantize_stage(tmp_path, rebuild, path, exclude=None, observer=None, mode="static"):
    config = QuantizeConfig(engine="qnnpack", mode=mode, weights=None, inputs=INPUTS,
                            calibration=CALIBRATION if mode == "static" else None, exclude=exclude, observer=observer,
                            **rebuild)
    output = tmp_path / f"quantized-{'-'.join(exclude or ['none'])}-{observer}.pt"
    quantize.run({"model": path}, config, output)
    stage = SimpleNamespace(engine="qnnpack", inputs=INPUTS, **rebuild,
                            quantization={"mode": mode, "weights": None, **({"exclude": exclude} if exclude else {})})
    return quantize.load_quantized({"model": path, "quantized": output}, stage), output


@pytest.mark.parametrize("factory", ["make", "residual"])
def test_qnnpack_fails_with_the_block_quantized_and_passes_with_it_float(tmp_path, outlier, factory):
    """Eager mode (the block between a DeQuantStub and a QuantStub) and FX graph mode (a model eager mode cannot
    quantize): measured on the model the later stages rebuild from the stored state."""
    model, rebuild, path = outlier(factory)
    default, _ = quantize_stage(tmp_path, rebuild, path)
    kept, stored = quantize_stage(tmp_path, rebuild, path, exclude=["broken"])
    assert sqnr(model, default) < 6
    assert sqnr(model, kept) > PASS_DB + 10
    graph_mode = isinstance(kept, torch.fx.GraphModule)
    assert graph_mode == (factory == "residual")
    if graph_mode:
        assert type(kept.get_submodule("broken.0")) is torch.nn.Conv2d  # left float
    else:
        inner = kept.module  # in a QuantWrapper: the float model's interface
        assert isinstance(inner.broken, exclusion.FloatIsland) and isinstance(inner.broken.module[0], torch.nn.Conv2d)
        assert type(inner.head).__module__.startswith("torch.ao.nn.quantized")
    # what the later stages script: the float island survives TorchScript
    scripted = torch.jit.script(kept) if not graph_mode else torch.jit.trace(kept, held_out()[0])
    assert sqnr(model, scripted) > PASS_DB + 10
    assert stored.stat().st_size > 0


def test_an_unknown_module_fails_before_calibration_and_writes_nothing(tmp_path, outlier):
    model, rebuild, path = outlier()
    with pytest.raises(MobileBuildError, match="no module named 'brokn' in the model"):
        quantize_stage(tmp_path, rebuild, path, exclude=["brokn"])
    assert not list(tmp_path.glob("quantized-*"))


def test_dynamic_quantization_keeps_the_excluded_linear_float(tmp_path, outlier):
    model, rebuild, path = outlier()
    kept, _ = quantize_stage(tmp_path, rebuild, path, exclude=["fc"], mode="dynamic")
    assert type(kept.fc) is torch.nn.Linear
    default, _ = quantize_stage(tmp_path, rebuild, path, mode="dynamic")
    assert type(default.fc).__module__.startswith("torch.ao.nn.quantized.dynamic")


def lower_stage(tmp_path, rebuild, path, exclude=None, observer=None):
    from mobilebuild.routes.executorch.worker import pte
    from mobilebuild.routes.executorch.worker import runtime as et_runtime

    config = LowerConfig(precision="int8", inputs=INPUTS, delegate="xnnpack", options={}, calibration=CALIBRATION,
                         exclude=exclude, observer=observer, **rebuild)
    output = tmp_path / f"lowered-{'-'.join(exclude or ['none'])}-{observer}.pte"
    lower.run({"model": path}, config, output)
    return et_runtime.load(output, SimpleNamespace(inputs=INPUTS, timing={"threads": 1})), pte.read(output).delegation


@pytest.mark.slow  # two int8 lowerings: ExecuTorch's quantizer and partitioner take seconds each on any model
def test_executorch_xnnpack_int8_fails_with_the_block_quantized_and_passes_with_it_float(tmp_path, outlier):
    model, rebuild, path = outlier()
    default, _ = lower_stage(tmp_path, rebuild, path)
    kept, delegation = lower_stage(tmp_path, rebuild, path, exclude=["broken"])
    assert sqnr(model, default) < 6
    assert sqnr(model, kept) > PASS_DB + 10
    # the float convolutions go to XNNPACK too: nothing runs on the portable kernels
    assert delegation["delegates"] == {"XnnpackBackend": 1} and delegation["fallback_calls"] == 0


def export_stage(tmp_path, rebuild, path, exclude=None, observer=None):
    import onnxruntime

    config = ExportConfig(precision="int8", inputs=INPUTS, options={}, calibration=CALIBRATION, exclude=exclude,
                          observer=observer, **rebuild)
    output = tmp_path / f"exported-{'-'.join(exclude or ['none'])}-{observer}.onnx"
    export.run({"model": path}, config, output)
    session = onnxruntime.InferenceSession(str(output))
    return (lambda x: torch.from_numpy(session.run(None, {"input": x.numpy()})[0])), onnx.load(output)


@pytest.fixture(scope="module")
def onnx_int8(outlier, tmp_path_factory):
    """The outlier model, and (exclude, observer) -> its int8 ONNX export through the stage, each made once for the
    tests that read it (exporting takes about a second, whatever the model's size)."""
    model, rebuild, path = outlier()
    folder, made = tmp_path_factory.mktemp("onnx"), {}

    def exported(exclude=None, observer=None):
        key = (tuple(exclude or ()), observer)
        if key not in made:
            made[key] = export_stage(folder, rebuild, path, exclude, observer)
        return made[key]

    return model, exported


@pytest.fixture(scope="module")
def onnx_int8_default(onnx_int8):
    """The outlier model's int8 ONNX export with nothing excluded and no observer named, made in a setup (once)."""
    return onnx_int8[1]()


def test_onnx_int8_fails_with_the_block_quantized_and_passes_with_it_float(onnx_int8, onnx_int8_default):
    model, exported = onnx_int8
    default, _ = onnx_int8_default
    kept, proto = exported(exclude=["broken"])
    assert sqnr(model, default) < 6
    assert sqnr(model, kept) > PASS_DB + 10
    # the block's two convolutions read float weights; the others read dequantized int8 ones
    produced = {output: node for node in proto.graph.node for output in node.output}
    weight_sources = [produced.get(node.input[1]) for node in proto.graph.node if node.op_type == "Conv"]
    assert [source is not None and source.op_type == "DequantizeLinear" for source in weight_sources] == \
        [True, False, False, True]


def test_onnx_node_names_come_from_the_module_paths_the_exporter_records(outlier):
    model, _, _ = outlier()
    proto = export.export_float(model, INPUTS)
    assert export.excluded_nodes(proto, ["broken"]) == [node.name for node in proto.graph.node
                                                       if node.op_type == "Conv"][1:3]
    assert [node.op_type for node in proto.graph.node if node.name in export.excluded_nodes(proto, ["act"])] == \
        ["HardSwish"]


# --- observers --------------------------------------------------------------------------------------------------

def test_qnnpack_observers_each_measure_their_own_ranges(tmp_path, outlier):
    """On this model no observer rescues the block (the outlier channel is dense: every observer keeps its range);
    the engine's default is the histogram observer, and each choice gives its own result."""
    model, rebuild, path = outlier()
    found = {observer: sqnr(model, quantize_stage(tmp_path, rebuild, path, observer=observer)[0])
             for observer in (None, "histogram", "minmax", "moving_average")}
    assert found[None] == found["histogram"]
    assert len({found["histogram"], found["minmax"], found["moving_average"]}) == 3
    assert max(found.values()) < PASS_DB
    kept = quantize_stage(tmp_path, rebuild, path, exclude=["broken"], observer="minmax")[0]
    assert sqnr(model, kept) > PASS_DB + 10


@pytest.mark.parametrize("observer", ["minmax", "moving_average", "percentile"])
def test_onnx_observers_are_onnxruntimes_calibration_methods(onnx_int8, onnx_int8_default, observer):
    """minmax is onnxruntime's default (the same model); the others calibrate otherwise. None rescues the outlier."""
    model, exported = onnx_int8
    found, default = sqnr(model, exported(observer=observer)[0]), sqnr(model, onnx_int8_default[0])
    assert (found == default) == (observer == "minmax"), (found, default)
    assert found < PASS_DB


@pytest.mark.slow
def test_executorch_observers_replace_the_xnnpack_quantizers_own(tmp_path, outlier):
    model, rebuild, path = outlier()
    found = {observer: sqnr(model, lower_stage(tmp_path, rebuild, path, observer=observer)[0])
             for observer in (None, "histogram", "minmax", "moving_average")}
    assert found[None] == found["histogram"]
    assert len({found["histogram"], found["minmax"], found["moving_average"]}) == 3
    assert max(found.values()) < PASS_DB


# --- the recipe: per-route choices, and keys --------------------------------------------------------------------

INT8_TARGETS = [{"backend": "xnnpack"}, {"backend": "qnnpack"},
                {"backend": "xnnpack", "runtime": "executorch", "precision": "int8"},
                {"backend": "onnx", "precision": "int8"}]


def test_the_new_settings_stay_out_of_the_keys_of_recipes_without_them(tmp_path):
    nodes = nodes_for(tmp_path, tiny_recipe(targets=INT8_TARGETS))
    for node in nodes.values():
        assert "exclude" not in node.config and "observer" not in node.config
        assert "exclude" not in (node.config.get("quantization") or {})
    assert set(nodes["quantize:tiny-qnnpack"].config) == {"engine", "mode", "weights", "inputs", "model", "fuse",
                                                          "calibration"}


def test_exclude_and_observer_key_only_the_int8_chains(tmp_path):
    plain = nodes_for(tmp_path / "a", tiny_recipe(targets=INT8_TARGETS))
    changed = nodes_for(tmp_path / "b", tiny_recipe(
        targets=INT8_TARGETS, quantize={"calibration": {"source": "random", "batches": 16, "seed": 0},
                                        "exclude": ["conv2"], "observer": "minmax"}))
    differ = sorted(name for name in plain if plain[name].key() != changed[name].key())
    # the script stage rebuilds the quantized model (with its float islands), as the per-layer comparison does, and
    # ExecuTorch's quantizes again; optimize, verify and ONNX's per-layer comparison read files only
    assert differ == ["layers:tiny-qnnpack", "layers:tiny-xnnpack-executorch", "lower:tiny-xnnpack-executorch",
                      "manifest:tiny", "onnx:tiny-onnx", "quantize:tiny-qnnpack", "script:tiny-int8-qnnpack"]
    assert changed["quantize:tiny-qnnpack"].config["exclude"] == ["conv2"]
    assert changed["script:tiny-int8-qnnpack"].config["quantization"]["exclude"] == ["conv2"]


def planning_errors(tmp_path, targets, **quantize):
    data = tiny_recipe(targets=targets)
    data["quantize"] = {**data["quantize"], **quantize}
    with pytest.raises(RecipeErrors) as caught:
        nodes_for(tmp_path, data)
    return [str(error) for error in caught.value.errors]


def test_an_observer_a_route_lacks_is_one_line_with_its_choices(tmp_path):
    assert planning_errors(tmp_path, [{"backend": "onnx", "precision": "int8"}], observer="histogram") == [
        "recipes/r.yaml: quantize.observer: onnx (onnxruntime) has no observer 'histogram': expected one of minmax, "
        "moving_average, percentile"]
    assert planning_errors(tmp_path, [{"backend": "qnnpack"}], observer="percentile") == [
        "recipes/r.yaml: quantize.observer: qnnpack (pytorch-mobile) has no observer 'percentile': expected one of "
        "histogram, minmax, moving_average"]
    target = {"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "quantize": {"observer": "entropy"}}
    with pytest.raises(RecipeErrors, match=r"targets\[0\]\.quantize\.observer: expected one of"):
        nodes_for(tmp_path, tiny_recipe(targets=[target]))  # the schema's own choices
    target["quantize"]["observer"] = "percentile"
    with pytest.raises(RecipeErrors, match=r"^recipes/r.yaml: targets\[0\]\.quantize\.observer: xnnpack \(executorch\) "
                                           r"has no observer 'percentile': expected one of histogram, minmax"):
        nodes_for(tmp_path, tiny_recipe(targets=[target]))


def test_settings_a_mode_cannot_use_are_refused(tmp_path):
    assert planning_errors(tmp_path, [{"backend": "qnnpack"}], mode="dynamic", observer="minmax") == [
        "recipes/r.yaml: quantize.observer: an observer calibrates static quantization; mode 'dynamic' observes no "
        "activations: leave observer out"]
    (tmp_path / "qat.pt").write_bytes(b"")
    lines = planning_errors(tmp_path, [{"backend": "qnnpack"}], mode="qat", checkpoint="../qat.pt", exclude=["conv"])
    assert lines == ["recipes/r.yaml: quantize.exclude: a QAT checkpoint was trained with what it quantizes fixed: "
                     "keep modules in float when preparing it for training, and leave exclude out"]


# --- a real build ---------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_build_verifies_the_int8_targets_with_the_block_kept_float_and_fails_them_without(project):
    """Two recipes of the outlier model: without exclude every int8 target fails verification (and verified:), with
    `exclude: [broken]` every one passes."""
    (project.root / "outlier_net.py").write_text(OUTLIER)
    targets = [{"backend": "qnnpack"}, {"backend": "xnnpack", "runtime": "executorch", "precision": "int8"},
               {"backend": "onnx", "precision": "int8"}]
    base = {"model": {"factory": "outlier_net:make", "seed": 0}, "script": "script", "targets": targets,
            "benchmark": {"warmup": 1, "iters": 3}}
    project.write_recipe(tiny_recipe("plain", **base))
    kept = tiny_recipe("kept", **base)
    kept["quantize"] = {**kept["quantize"], "exclude": ["broken"]}
    project.write_recipe(kept)
    result = project.run()
    assert result.returncode != 0
    assert "verified:plain" in result.stderr and "verified:kept" not in result.stderr, result.stdout + result.stderr
    for target in ("qnnpack", "xnnpack-executorch", "onnx"):
        failed = json.loads(project.artifact(f"plain/verify-{target}.json").read_text())
        passed = json.loads(project.artifact(f"kept/verify-{target}.json").read_text())
        assert failed["status"] == "failed" and failed["metrics"]["sqnr_db"] < 6, target
        assert passed["status"] == "passed" and passed["metrics"]["sqnr_db"] > PASS_DB + 10, target


def test_a_module_that_ends_the_model_returns_float_and_one_inside_it_requantizes():
    """The DeQuantStub after a model's last layer would take the int8 step straight back: a float island there is
    not requantized (MobileNetV2's float classifier kept top-1 agreement at 0.06 on qnnpack until it was not)."""
    from torch.ao import quantization as tq

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 10)).eval()
    wrapped = tq.QuantWrapper(model)
    exclusion.islands(model, ["0", "3"], wrapped, (torch.randn(1, 3, 8, 8),))
    assert isinstance(model[0].quant, tq.QuantStub)  # the ReLU after it is quantized
    assert isinstance(model[3].quant, torch.nn.Identity)  # its output goes to the wrapper's DeQuantStub
    wrapped.qconfig = tq.get_default_qconfig("qnnpack")
    tq.prepare(wrapped, inplace=True)
    wrapped(torch.randn(4, 3, 8, 8))
    torch.backends.quantized.engine = "qnnpack"
    out = torch.jit.script(tq.convert(wrapped))(torch.randn(2, 3, 8, 8))
    assert out.dtype == torch.float32 and not out.is_quantized
