"""Models of several named, typed inputs with dynamic dims, and structured outputs, through every host route: the
recipe grammar, example data, user batches, and each stage and runtime at the dims' smallest and largest sizes."""

import copy
import json
import os
import textwrap
from types import SimpleNamespace

import onnx
import pytest
import torch
from tiny_models import stored_fused
from torch import nn
from torch.jit.mobile import _load_for_lite_interpreter

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import recipe, routes, stages
from mobilebuild.routes.executorch.worker import lower
from mobilebuild.routes.executorch.worker import runtime as et_runtime
from mobilebuild.routes.onnx.worker import export
from mobilebuild.routes.onnx.worker import runtime as ort_runtime
from mobilebuild.routes.torchscript import plan as torchscript
from mobilebuild.routes.torchscript.worker import optimize, script
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import calibration, checkpoint, modeling, quantize, verify

IDS = {"name": "ids", "shape": [2, 16], "dtype": "int64", "memory_format": "contiguous", "range": [0, 50],
       "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 40}]}
MASK = {"name": "mask", "shape": [2, 16], "dtype": "int64", "memory_format": "contiguous", "range": [0, 2],
        "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 40}]}
TEXT = [IDS, MASK]
IMAGE = {"name": "image", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}
SIDE = {"name": "side", "shape": [1, 4], "dtype": "float32", "memory_format": "contiguous",
        "distribution": {"uniform": {"low": 0.0, "high": 1.0}}}
TWO = [IMAGE, SIDE]


class MaskedText(nn.Module):
    """Token ids and a mask of the same dynamic length in; scores out."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, ids, mask):
        weights = mask.unsqueeze(-1).to(torch.float32)
        return self.head((self.embedding(ids) * weights).sum(1) / weights.sum(1).clamp(min=1.0))


class ImageAndSide(nn.Module):
    """An image and a side vector in; a dict of scores and an embedding out."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.side = nn.Linear(4, 8)
        self.scores = nn.Linear(8, 5)
        self.embedding = nn.Linear(8, 6)

    def forward(self, image, side):
        x = torch.relu(self.conv(image)).mean(dim=(2, 3)) + self.side(side)
        return {"scores": self.scores(x), "embedding": self.embedding(x)}


def text_model():
    torch.manual_seed(0)
    return MaskedText().eval()


def two_model():
    torch.manual_seed(0)
    return ImageAndSide().eval()


def leaves(output):
    return list(output.values()) if isinstance(output, dict) else list(output) if isinstance(output, tuple) \
        else [output]


def assert_matches(reference_model, artifact, specs, sizes=("min", "example", "max"), floor=60.0):
    for size in sizes:
        inputs = modeling.example_inputs(specs, seed=11, size=size)
        with torch.no_grad():
            expected = leaves(reference_model(*inputs))
            produced = leaves(artifact(*inputs))
        assert len(expected) == len(produced)
        for want, got in zip(expected, produced):
            assert sqnr_db(want, got) > floor, size


# --- the recipe grammar ----------------------------------------------------------------------------------------

def load(tmp_path, text):
    (tmp_path / "recipes").mkdir(exist_ok=True)
    (tmp_path / "recipes/m.yaml").write_text(textwrap.dedent(text))
    return recipe.load("recipes/m.yaml", tmp_path)


def test_inputs_with_shared_dims_become_self_contained_specs(tmp_path):
    loaded = load(tmp_path, """
        name: m
        model: {torchvision: mobilenet_v2}
        inputs:
          - {name: ids, shape: [1, seq], dtype: int64, range: [0, 100]}
          - {name: mask, shape: [1, seq], dtype: bool}
        dims: {seq: {min: 8, max: 512, example: 64}}
        outputs: [scores]
        targets: [{backend: xnnpack}]
    """)
    ids, mask = loaded.inputs
    assert ids["name"] == "ids" and ids["shape"] == [1, 64] and ids["range"] == [0, 100]
    assert ids["dynamic"] == mask["dynamic"] == [{"axis": 1, "dim": "seq", "min": 8, "max": 512}]
    assert mask["memory_format"] == "contiguous"  # the schema's defaults apply to each listed input
    assert loaded.outputs == ["scores"]


def test_the_one_input_shorthand_is_a_list_of_one_named_input(tmp_path):
    loaded = load(tmp_path, """
        name: m
        model: {torchvision: mobilenet_v2}
        input: {shape: [1, 3, 8, 8]}
        targets: [{backend: xnnpack}]
    """)
    assert loaded.inputs == [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32",
                              "memory_format": "contiguous"}]
    assert loaded.outputs is None


def test_a_dims_example_defaults_to_its_min_and_never_to_one(tmp_path):
    loaded = load(tmp_path, """
        name: m
        model: {torchvision: mobilenet_v2}
        inputs: [{name: audio, shape: [batch, 16000]}]
        dims: {batch: {min: 1, max: 8}}
        targets: [{backend: xnnpack}]
    """)
    assert loaded.inputs[0]["shape"] == [2, 16000]  # torch.export specialises an example size of 1


@pytest.mark.parametrize("text, expected", [
    ("inputs: [{name: a, shape: [1, seq]}]\ndims: {seq: {min: 9, max: 4}}",
     "dims.seq: expected min < max, got min 9 and max 4"),
    ("inputs: [{name: a, shape: [1, seq]}]\ndims: {seq: {min: 2, max: 4, example: 9}}",
     "dims.seq.example: example 9 lies outside [2, 4]"),
    ("inputs: [{name: a, shape: [1, sek]}]\ndims: {seq: {min: 2, max: 4}}",
     "inputs[0].shape[1]: 'sek' is not a dim declared under dims (seq)"),
    ("inputs: [{name: a, shape: [1, 2]}, {name: a, shape: [1]}]", "inputs[1].name: duplicate input name 'a'"),
    ("inputs: [{name: a, shape: [1, 2]}]\ndims: {seq: {min: 2, max: 4}}",
     "dims.seq: no input shape names this dim"),
    ("inputs: [{shape: [1, 2]}]", "inputs[0]: missing required key 'name'"),
    ("input: {shape: [1]}\ninputs: [{name: a, shape: [1]}]", "(top level): expected exactly one of 'input'"),
    ("inputs: [{name: a, shape: [1, 3, 4, 4], memory_format: channels_last}, {name: b, shape: [1, 4], "
     "memory_format: channels_last}]",
     "inputs[1].memory_format: channels_last is a layout of 4-D inputs (N, C, H, W); this one has 2 dimension(s)"),
    ("input: {shape: [1, seq], memory_format: channels_last}\ndims: {seq: {min: 2, max: 4}}",
     "input.memory_format: channels_last is a layout of 4-D inputs"),
])
def test_grammar_mistakes_are_one_line_each(tmp_path, text, expected):
    body = "name: m\nmodel: {torchvision: mobilenet_v2}\ntargets: [{backend: xnnpack}]\n" + text
    with pytest.raises(RecipeErrors) as caught:
        load(tmp_path, body)
    lines = [str(error) for error in caught.value.errors]
    assert any(expected in line and line.startswith("recipes/m.yaml: ") and "\n" not in line for line in lines), lines


def test_channels_last_is_per_input(tmp_path):
    loaded = load(tmp_path, """
        name: m
        model: {torchvision: mobilenet_v2}
        inputs:
          - {name: image, shape: [1, 3, 8, 8], memory_format: channels_last}
          - {name: side, shape: [1, 4]}
        targets: [{backend: xnnpack}]
    """)
    assert [spec["memory_format"] for spec in loaded.inputs] == ["channels_last", "contiguous"]


def test_routes_that_fix_the_example_sizes_say_so_naming_the_dim(tmp_path):
    loaded = load(tmp_path, """
        name: m
        model: {torchvision: mobilenet_v2}
        inputs: [{name: ids, shape: [1, seq], dtype: int64, range: [0, 9]}]
        dims: {seq: {min: 2, max: 9}}
        script: trace
        targets: [{backend: xnnpack}]
    """)
    traced = routes.get("xnnpack", "pytorch-mobile").fixed_shape(loaded, "fp32")
    assert traced.startswith("dim seq fixed at the example size: tracing records")
    assert "NNAPI" in routes.get("nnapi", "pytorch-mobile").fixed_shape(loaded, "fp32")
    executorch = routes.get("xnnpack", "executorch")
    assert executorch.fixed_shape(loaded, "fp32") is None
    assert "int8 export recipe captures the model at the example's sizes" in executorch.fixed_shape(loaded, "int8")
    scripted = recipe.Recipe(**{**loaded.__dict__, "script": "script"})
    assert routes.get("xnnpack", "pytorch-mobile").fixed_shape(scripted, "fp32") is None


# --- example data and the user's batches ---------------------------------------------------------------------

def test_example_inputs_share_their_dims_at_every_size():
    for size, length in (("min", 4), ("example", 16), ("max", 40)):
        ids, mask = modeling.example_inputs(TEXT, seed=1, size=size)
        assert ids.shape == mask.shape == (2, length) and ids.dtype == mask.dtype == torch.int64
        assert 0 <= ids.min() and ids.max() < 50 and set(mask.unique().tolist()) <= {0, 1}
    assert modeling.sizes(TEXT) == ("min", "example", "max") and modeling.sizes(TWO) == ("example",)
    # a lone input's values are what they were before several inputs existed: drawn first from the seed
    (alone,) = modeling.example_inputs([IMAGE], seed=5)
    assert torch.equal(alone, torch.randn([1, 3, 8, 8], generator=torch.Generator().manual_seed(5)))
    image, side = modeling.example_inputs(TWO, seed=5)
    assert torch.equal(image, alone) and 0 <= side.min() and side.max() < 1


def test_user_batches_come_as_tensors_tuples_or_dicts_by_name():
    ids, mask = torch.randint(0, 50, (2, 9)), torch.ones(2, 9, dtype=torch.int32)
    by_name = modeling.as_inputs({"mask": mask, "ids": ids}, TEXT, "quantize.calibration.function")
    in_order = modeling.as_inputs((ids, mask), TEXT, "quantize.calibration.function")
    assert all(torch.equal(a, b) for a, b in zip(by_name, in_order))
    assert by_name[1].dtype == torch.int64  # cast to the input's dtype
    assert modeling.as_inputs([ids[:1], mask[:1]], TEXT, "f", any_batch=True)[0].shape == (1, 9)


@pytest.mark.parametrize("batch, expected", [
    (lambda: {"ids": torch.zeros(2, 8, dtype=torch.int64)},
     "a batch keyed ['ids'] does not match the inputs (ids, mask)"),
    (lambda: torch.zeros(2, 8), "expected 2 tensor(s) (ids [2, seq] int64, mask [2, seq] int64)"),
    (lambda: (torch.zeros(2, 80), torch.zeros(2, 80)), "input ids has shape [2, 80]: dim seq is 80, outside [4, 40]"),
    (lambda: (torch.zeros(3, 8), torch.zeros(3, 8)), "input ids has shape [3, 8]: expected [2, seq]"),
    (lambda: (torch.zeros(2, 8, 1), torch.zeros(2, 8)), "input ids has shape [2, 8, 1]: expected 2 dimensions"),
])
def test_a_batch_that_does_not_fit_is_one_line_naming_the_field(batch, expected):
    with pytest.raises(MobileBuildError) as caught:
        modeling.as_inputs(batch(), TEXT, "quantize.calibration.function")
    assert expected in caught.value.message and caught.value.field == "quantize.calibration.function"


def test_calibration_functions_may_yield_dicts_and_their_holdout_stacks_each_input(monkeypatch):
    def batches():
        for index in range(5):
            yield {"ids": torch.full((2, 8), index), "mask": torch.ones(2, 8)}

    monkeypatch.setattr(modeling, "resolve_callable", lambda spec, field: batches)
    settings = {"source": "function", "function": "m:batches", "kwargs": {}, "batches": 3}
    seen = list(calibration.batches(settings, TEXT))
    assert len(seen) == 3 and all(len(batch) == 2 for batch in seen)
    ids, mask = calibration.holdout(settings, TEXT, samples=3)
    assert ids.shape == (3, 8) and ids[:, 0].tolist() == [3, 3, 4]  # what calibration did not read


class FixedLength(MaskedText):
    """Takes only the example's length, whatever the recipe's dims say."""

    def forward(self, ids, mask):
        return super().forward(ids.view(2, 16), mask.view(2, 16))


def test_the_checkpoint_check_tries_each_dims_smallest_and_largest():
    checkpoint.check_input(text_model(), TEXT)
    short = [{**spec, "dynamic": [{**spec["dynamic"][0], "min": 2}]} for spec in TEXT]
    with pytest.raises(MobileBuildError) as caught:
        checkpoint.check_input(FixedLength(), short)
    assert caught.value.message.startswith("the model rejects inputs ids [2, 2] int64, mask [2, 2] int64 (the dims' "
                                           "min sizes)") and caught.value.field == "inputs"


# --- through each route -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["script", "trace"])
def test_torchscript_takes_every_input_and_scripting_keeps_the_dims(tmp_path, mode):
    model = text_model()
    scripted = script.to_torchscript(model, mode, modeling.example_inputs(TEXT))
    optimized = optimize.optimize(scripted, {"blocklist": [], "preserved_methods": [], "bundled_inputs": True},
                                  mode, TEXT)
    bundled = optimized.get_all_bundled_inputs()[0]
    assert [tuple(x.shape) for x in bundled] == [(2, 16), (2, 16)] and bundled[0].max() < 50
    path = tmp_path / "m.ptl"
    optimized._save_for_lite_interpreter(str(path))
    lite = _load_for_lite_interpreter(str(path))
    assert_matches(model, lite, TEXT, sizes=("min", "example", "max") if mode == "script" else ("example",))


NHWC_IMAGE = [{**IMAGE, "memory_format": "channels_last"}, SIDE]  # channels_last on one of two inputs


@pytest.mark.parametrize("mode", ["script", "trace"])
def test_channels_last_on_one_of_two_inputs_builds_and_verifies_for_xnnpack(tmp_path, mode):
    """The script stage converts the channels_last input alone; the .ptl verifies against eager fp32 on the
    verify stage's own inputs (the image channels_last, the side vector as it is)."""
    torch.manual_seed(0)
    source = stored_fused(two_model(), tmp_path / "fused.pt", factory="test_multi_input:two_model")
    modeling.save(two_model().state_dict(), tmp_path / "checkpoint.pt")
    script.run({"model": tmp_path / "fused.pt"},
               torchscript.ScriptConfig(mode=mode, precision="fp32", engine=None, quantization=None, inputs=NHWC_IMAGE,
                                   **source), tmp_path / "scripted.pt")
    graph = torch.jit.load(tmp_path / "scripted.pt").inlined_graph
    converted = [node for node in graph.nodes() if node.kind() == "aten::contiguous"]
    image = list(graph.inputs())[1]  # after self
    assert len(converted) == 1 and converted[0].inputsAt(0).debugName() == image.debugName()
    path = tmp_path / "m.ptl"
    optimize.run({"scripted": tmp_path / "scripted.pt"},
                 torchscript.OptimizeConfig(backend="xnnpack", engine=None, script_mode=mode, inputs=NHWC_IMAGE,
                                       options={"blocklist": [], "preserved_methods": [], "bundled_inputs": True}),
                 path)
    lite = _load_for_lite_interpreter(str(path))
    assert [tuple(x.shape) for x in lite.run_method("get_all_bundled_inputs")[0]] == [(1, 3, 8, 8), (1, 4)]
    assert_matches(two_model(), lite, NHWC_IMAGE, sizes=("example",))
    config = stages.VerifyConfig(
        runtime="pytorch-mobile", runtime_module="mobilebuild.routes.torchscript.worker.runtime", engine=None,
        inputs=NHWC_IMAGE, runs_on_host=True, host_reason=None, model={"factory": "test_multi_input:two_model"},
        precision="fp32", pruning=None, samples=4, seed=0, thresholds={"sqnr_db": 40.0})
    verify.run({"artifact": path, "checkpoint": tmp_path / "checkpoint.pt"}, config, tmp_path / "verify.json")
    result = json.loads((tmp_path / "verify.json").read_text())
    assert result["status"] == "passed" and result["metrics"]["sqnr_db"] > 100, result


def test_dynamic_int8_keeps_integer_inputs_and_every_size():
    model = text_model()
    quantized = quantize.dynamic(text_model(), "qnnpack")
    quantize.check_runs(quantized, TEXT, "qnnpack", field="model")
    scripted = script.to_torchscript(quantized, "script", modeling.example_inputs(TEXT))
    assert_matches(model, scripted, TEXT, floor=25.0)


def test_a_clamp_qnnpack_cannot_quantize_is_named_in_one_line():
    settings = {"source": "random", "batches": 3, "seed": 0}
    with pytest.raises(MobileBuildError) as caught:
        quantize.static_any(text_model(), "qnnpack", lambda: calibration.batches(settings, TEXT), None,
                            "quantize.calibration", TEXT, source_field="model.factory")
    assert caught.value.message.startswith("the quantized model fails on the qnnpack engine in Tensor.clamp (Both "
                                           "min and max should be specified for quantized clamp!)")
    assert caught.value.field == "model.factory"


def test_static_int8_of_two_float_inputs_goes_through_fx_graph_mode():
    model = two_model()
    batches = lambda: (modeling.example_inputs(TWO, seed=seed) for seed in range(16))  # noqa: E731
    quantized, note = quantize.static_any(two_model(), "qnnpack", batches, None, "quantize.calibration", TWO)
    assert note.startswith("eager mode cannot quantize it (its stubs take one float input, and the model takes "
                           "image [1, 3, 8, 8] float32, side [1, 4] float32): quantized in FX graph mode")
    assert_matches(model, quantized, TWO, sizes=("example",), floor=15.0)


class MaskedTextWithoutClamp(MaskedText):
    """QNNPACK's quantized clamp takes a min and a max, never one alone (`.clamp(min=1.0)` fails on it)."""

    def forward(self, ids, mask):
        weights = mask.unsqueeze(-1).to(torch.float32)
        return self.head((self.embedding(ids) * weights).sum(1) / (weights.sum(1) + 1.0))


def test_static_int8_lets_integer_inputs_through_and_calibrates_across_the_dims():
    torch.manual_seed(0)
    model = MaskedTextWithoutClamp().eval()
    settings = {"source": "random", "batches": 9, "seed": 0}
    lengths = [batch[0].shape[1] for batch in calibration.batches(settings, TEXT)]
    assert lengths[:3] == [16, 4, 40]  # example first (ExecuTorch exports it), then the dims' extremes in turn
    quantized, note = quantize.static_any(copy.deepcopy(model), "qnnpack", lambda: calibration.batches(settings, TEXT),
                                          None, "quantize.calibration", TEXT)
    assert "quantized in FX graph mode" in note
    assert "quantize_per_tensor(ids" not in quantized.code and "quantize_per_tensor(mask" not in quantized.code
    assert_matches(model, quantized, TEXT, floor=15.0)


@pytest.mark.slow  # an int8 lowering: XNNPACK's quantizer takes seconds on any model
def test_executorch_int8_of_a_model_with_dynamic_dims_is_fixed_at_the_example_sizes(tmp_path):
    torch.manual_seed(0)
    model = MaskedTextWithoutClamp().eval()
    samples = lower.calibration_samples({"source": "random", "batches": 9, "seed": 0}, TEXT)
    assert len(samples) == 3  # the batches at the example sizes: the graph is captured there
    path = tmp_path / "m.pte"
    path.write_bytes(lower.lower_to_bytes(model, TEXT, "xnnpack", "int8", samples=samples))
    assert_matches(model, et_runtime.load(path, SimpleNamespace(timing={"threads": 1})), TEXT, sizes=("example",),
                   floor=25.0)


@pytest.mark.parametrize("precision", ["fp32", pytest.param("int8", marks=pytest.mark.slow)])  # int8: as above
def test_executorch_programs_take_every_input_at_any_size_in_range(tmp_path, precision):
    model = text_model() if precision == "fp32" else two_model()
    specs = TEXT if precision == "fp32" else TWO
    samples = [lower.in_layout(modeling.example_inputs(specs, seed=seed)) for seed in range(8)]
    path = tmp_path / "m.pte"
    path.write_bytes(lower.lower_to_bytes(model, specs, "xnnpack", precision,
                                          samples=samples if precision == "int8" else None))
    program = et_runtime.load(path, SimpleNamespace(timing={"threads": 1}))
    assert_matches(model, program, specs, sizes=modeling.sizes(specs), floor=60.0 if precision == "fp32" else 15.0)


@pytest.fixture(scope="module")
def two_onnx():
    """The two-input model exported to ONNX, once for the tests that read it."""
    return export.export_float(two_model(), TWO)


def test_onnx_exports_named_inputs_and_outputs(two_onnx):
    proto = two_onnx
    assert [value.name for value in proto.graph.input] == ["image", "side"]
    assert [value.name for value in proto.graph.output] == ["scores", "embedding"]
    renamed = export.export_float(two_model(), TWO, names=["logits", "vector"])
    assert [value.name for value in renamed.graph.output] == ["logits", "vector"]
    with pytest.raises(MobileBuildError, match="1 names for 2 output tensor"):
        export.export_float(two_model(), TWO, names=["logits"])


def test_onnx_inputs_sharing_a_dynamic_dim_share_one_axis_and_run_at_its_sizes(tmp_path):
    text = export.export_float(text_model(), TEXT)
    axes = [[dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim] for value in text.graph.input]
    assert axes[0] == axes[1] and axes[0][0] == 2 and isinstance(axes[0][1], str)  # seq: one dynamic axis, shared
    path = tmp_path / "m.onnx"
    onnx.save(text, path)
    assert_matches(text_model(), ort_runtime.load(path, SimpleNamespace()), TEXT)


def test_onnx_int8_calibration_feeds_every_input_by_name(tmp_path, two_onnx):
    proto = two_onnx
    settings = {"source": "random", "batches": 8, "seed": 0}
    quantized = export.quantize_int8(proto, settings, TWO)
    assert any(node.op_type == "QuantizeLinear" for node in quantized.graph.node)
    path = tmp_path / "m.onnx"
    onnx.save(quantized, path)
    assert_matches(two_model(), ort_runtime.load(path, SimpleNamespace()), TWO, sizes=("example",), floor=15.0)


# --- verification -----------------------------------------------------------------------------------------------

def verify_config(**overrides):
    settings = dict(inputs=TEXT, samples=3, seed=0, evaluation=None, calibration=None, fixed_shape=None, outputs=None)
    return SimpleNamespace(**{**settings, **overrides})


def test_random_verification_runs_at_the_dims_smallest_example_and_largest_sizes():
    groups, description = verify.evaluation_data(verify_config())
    assert description == "random" and [size for size, _, _ in groups] == ["min", "example", "max"]
    assert [tuple(group[1][0].shape) for group in groups] == [(6, 4), (6, 16), (6, 40)]
    fixed, _ = verify.evaluation_data(verify_config(fixed_shape="dim seq fixed at the example size: tracing"))
    assert [size for size, _, _ in fixed] == ["example"]


def test_evaluation_data_by_name_with_labels_also_checks_the_extremes(monkeypatch):
    data = ({"ids": torch.randint(0, 50, (6, 10)), "mask": torch.ones(6, 10)}, torch.zeros(6, dtype=torch.long))
    monkeypatch.setattr(modeling, "resolve_callable", lambda spec, field: lambda: data)
    groups, description = verify.evaluation_data(verify_config(evaluation={"function": "m:f"}))
    assert description == "evaluation" and [size for size, _, _ in groups] == ["example", "min", "max"]
    assert groups[0][1][0].shape == (6, 10) and groups[0][2] is data[1] and groups[1][2] is None


def test_verify_names_outputs_and_judges_each_size(tmp_path):
    model = text_model()
    config = verify_config(outputs=["scores"], thresholds={"sqnr_db": 30.0})
    (groups, _) = verify.evaluation_data(config)
    for size, inputs, labels in groups:
        (found,), usable, _ = verify.verify(model, [model], config, inputs, labels)
        assert list(found) == ["scores"] and usable == 6 and found["scores"]["sqnr_db"] == 300.0
    with pytest.raises(MobileBuildError, match="2 output names for 1 output tensor"):
        verify.run_in_batches(model, groups[0][1], 2, ["a", "b"])


# --- what a runtime cannot keep, in one line each ---------------------------------------------------------------

class Recurrent(nn.Module):
    """torch.export unrolls an LSTM over the example's steps: its sequence length cannot stay dynamic."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        steps, _ = self.lstm(self.embedding(ids))
        return self.head(steps[:, -1])


class Video(nn.Module):
    """A 3-D convolution on 5-D input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 4, 3)

    def forward(self, clip):
        return torch.relu(self.conv(clip)).mean(dim=(2, 3, 4))


class Steps(nn.Module):
    """forward takes a non-tensor parameter after its inputs, with a default (RAFT's num_flow_updates)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, steps: int = 3):
        for _ in range(steps):
            x = torch.relu(self.linear(x))
        return x


CLIP = [{"name": "clip", "shape": [1, 3, 4, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]
VECTOR = [{"name": "x", "shape": [1, 4], "dtype": "float32", "memory_format": "contiguous"}]


@pytest.mark.parametrize("exporter", ["executorch", "onnx"])
def test_a_dim_the_model_pins_is_named_in_one_line(exporter):
    with pytest.raises(MobileBuildError) as caught:
        if exporter == "executorch":
            lower.lower_to_bytes(Recurrent().eval(), [IDS], "xnnpack")
        else:
            export.export_float(Recurrent().eval(), [IDS])  # the exporter would keep the example's size silently
    assert "found that the model fixes dim seq: an operation in it pins the size (nn.LSTM" in caught.value.message
    assert caught.value.field == "targets" and "\n" not in caught.value.message
    # ONNX has a way out for an LSTM: its TorchScript exporter (test_export); ExecuTorch has none
    assert ("set the target's `onnx: {exporter: torchscript}`" in caught.value.message) == (exporter == "onnx")


def test_a_program_a_portable_kernel_refuses_is_refused_when_lowered():
    with pytest.raises(MobileBuildError) as caught:
        lower.check_runs(lower.lower_to_bytes(Video().eval(), CLIP, "xnnpack"), CLIP)
    assert caught.value.message.startswith("the program fails in ExecuTorch's runtime, in kernel_ops_util: Check "
                                           "failed (in.dim() == 3 || in.dim() == 4)")


@pytest.mark.slow  # the int8 lowering fails only once XNNPACK has partitioned the quantized graph
def test_a_quantized_operator_the_delegate_leaves_without_a_kernel_is_one_line():
    with pytest.raises(MobileBuildError) as caught:
        lower.lower_to_bytes(Video().eval(), CLIP, "xnnpack", "int8",
                             samples=[lower.in_layout(modeling.example_inputs(CLIP))])
    assert caught.value.message == ("ExecuTorch has no kernel for 'quantized_decomposed::dequantize_per_channel', left "
                                    "outside XNNPACK (the delegate did not take an operator the quantizer quantized): "
                                    "build this target in fp32")


def test_weights_qnnpack_cannot_unpack_are_its_limit_in_one_line():
    quantized, _ = quantize.static_any(Video().eval(), "qnnpack", lambda: [modeling.example_inputs(CLIP)], None,
                                       "quantize.calibration", CLIP)
    with pytest.raises(MobileBuildError) as caught:
        quantize.stored_state(quantized, "qnnpack", "model.factory")
    assert caught.value.message.startswith("the qnnpack engine cannot store the quantized model's weights (Conv3d): "
                                           "QNNPACK only supports conv2d_unpack")


def test_bundled_inputs_give_later_parameters_their_defaults():
    scripted = script.to_torchscript(Steps().eval(), "script", modeling.example_inputs(VECTOR))
    optimized = optimize.optimize(scripted, {"blocklist": [], "preserved_methods": [], "bundled_inputs": True},
                                  "script", VECTOR)
    (bundled,) = optimized.get_all_bundled_inputs()
    assert bundled[1] == 3 and optimized(*bundled).shape == (1, 4)


class LayerScale(nn.Module):
    """ConvNeXt's layer scale: a residual branch multiplied by 1e-6 at initialisation."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.gamma = nn.Parameter(torch.full((1, 8, 1, 1), 1e-6))

    def forward(self, x):
        y = self.conv(x)
        return y + self.gamma * torch.relu(y)


def test_an_operator_the_engine_refuses_is_named_with_the_engines_reason(capfd):
    spec = [{**IMAGE}]
    with pytest.raises(MobileBuildError) as caught:
        quantize.static_any(LayerScale().eval(), "qnnpack", lambda: [modeling.example_inputs(spec, seed=seed)
                                                                     for seed in range(4)], None,
                            "quantize.calibration", spec)
    assert caught.value.message.startswith("the quantized model fails on the qnnpack engine in "
                                           "torch.ops.quantized.add: failed to create add operator with ")
    assert caught.value.message.endswith("scale ratio must be in [2**-14, 2**8) range")
    assert "QNNPACK" not in capfd.readouterr().err  # said once, in the line, not in the log


def test_repeated_native_warnings_are_shown_once(capfd):
    from mobilebuild.worker import quiet

    warning = b"[W1124 01:27:45.123456789 TensorShape.cpp:167] Warning: All inputs of this cat operator must share\n"
    with quiet.native_stderr(once=True):
        for _ in range(32):
            os.write(2, warning)
        os.write(2, b"[W1124 01:27:46.000000001 qlinear_dynamic.cpp:251] Warning: reduce_range\n")
        os.write(2, b"the runtime's own error\n")
    assert capfd.readouterr().err.splitlines() == [
        warning.decode().strip(), "[W1124 01:27:46.000000001 qlinear_dynamic.cpp:251] Warning: reduce_range",
        "the runtime's own error", "   (31 repeats of the warnings above not shown)"]


def test_a_native_warning_shown_earlier_in_the_build_is_not_shown_again(capfd, monkeypatch, tmp_path):
    """Every dynamic int8 stage of a build (quantize, verify, bench) warned of qnnpack's reduce_range: once is
    enough. The build's reporter names the file where stages, in any worker, note what they showed."""
    from mobilebuild.worker import quiet

    monkeypatch.setenv(quiet.SHOWN_WARNINGS, str(tmp_path / "shown"))
    reduce_range = b"[W1124 01:27:46.000000001 qlinear_dynamic.cpp:251] Warning: reduce_range\n"
    with quiet.native_stderr(once=True):
        os.write(2, reduce_range)
    with quiet.native_stderr(once=True):  # a later stage, at another time
        os.write(2, reduce_range.replace(b"01:27:46", b"01:29:01"))
        os.write(2, b"[W1124 01:29:01.000000002 TensorShape.cpp:167] Warning: cat\n")
    assert capfd.readouterr().err.splitlines() == [
        reduce_range.decode().strip(), "[W1124 01:29:01.000000002 TensorShape.cpp:167] Warning: cat"]

    monkeypatch.delenv(quiet.SHOWN_WARNINGS)  # outside a build: once per block
    with quiet.native_stderr(once=True):
        os.write(2, reduce_range)
    assert capfd.readouterr().err == reduce_range.decode()


QNNPACK_DYNAMIC_LINEAR = textwrap.dedent("""
    import os, sys
    import torch
    from mobilebuild.worker import quiet

    torch.backends.quantized.engine = "qnnpack"
    linear = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(4, 2)), {torch.nn.Linear})
    with quiet.native_stderr(once=sys.argv[1] == "filtered"):
        linear(torch.randn(1, 4))
        os.write(2, b"[W1124 01:29:01.000000002 TensorShape.cpp:167] Warning: cat\\n")
""")


@pytest.mark.parametrize("filtered", [False, True])
def test_qnnpacks_reduce_range_note_is_dropped_and_other_native_warnings_pass(filtered):
    """torch's dynamic quantized Linear asks qnnpack for reduce_range, which it ignores and says so (C++, once per
    process: a fresh interpreter each): every text model's dynamic int8 build on qnnpack printed it."""
    import subprocess
    import sys

    from mobilebuild.worker import quiet

    outside_a_build = {name: value for name, value in os.environ.items() if name != quiet.SHOWN_WARNINGS}
    ran = subprocess.run([sys.executable, "-c", QNNPACK_DYNAMIC_LINEAR, "filtered" if filtered else "raw"],
                         capture_output=True, text=True, timeout=120, env=outside_a_build)
    assert ran.returncode == 0, ran.stderr
    assert ("qnnpack incorrectly ignores reduce_range" in ran.stderr) is not filtered
    assert "TensorShape.cpp:167] Warning: cat" in ran.stderr


def test_a_python_warning_is_shown_once_per_build(monkeypatch, tmp_path):
    """A quantized cat's UserWarning came from every stage, and from every candidate `mobilebuild tune` built."""
    import warnings

    from mobilebuild.worker import quiet

    def stage():
        with warnings.catch_warnings(), quiet.warnings_once():
            warnings.simplefilter("always")
            for _ in range(3):
                warnings.warn("All inputs of this cat operator must share the same quantization parameters")
            warnings.warn("another")

    def shown(*stages):
        with warnings.catch_warnings(record=True) as caught:  # what reaches the display
            for run in stages:
                run()
        return [str(warning.message) for warning in caught]

    monkeypatch.setenv(quiet.SHOWN_WARNINGS, str(tmp_path / "shown"))
    assert shown(stage, stage) == [  # a later stage of the same build shows none again
        "All inputs of this cat operator must share the same quantization parameters", "another"]
    with quiet.shown_warnings_list():  # tune's rounds share one list, whatever the build had
        assert len(shown(stage, stage)) == 2
    assert os.environ[quiet.SHOWN_WARNINGS] == str(tmp_path / "shown")
