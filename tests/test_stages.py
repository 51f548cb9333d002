"""Stage functions on tiny models: numerics of every artifact against the eager model, and clear errors."""

import re

import pytest
import tiny_models
import torch
import torchvision
from torch.jit.mobile import _load_for_lite_interpreter
from torch.utils.mobile_optimizer import optimize_for_mobile

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.torchscript.worker import optimize, script
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import calibration, checkpoint, fuse, modeling, quantize

INPUT = {"name": "input", "shape": [1, 3, 16, 16], "dtype": "float32", "memory_format": "contiguous"}
INPUTS = [INPUT]
OPTIONS = {"blocklist": [], "preserved_methods": [], "bundled_inputs": True}
FP32_DB = 80.0  # fp32 artifacts compute the same function: anything below means a wrong transformation


def lite_sqnr(model, fuse_setting, mode, tmp_path):
    """Take `model` through fuse -> script/trace -> optimize -> .ptl and compare the lite model with eager."""
    x = modeling.example_inputs(INPUTS, seed=1)[0]
    with torch.no_grad():
        reference = model(x)
    fused, _ = fuse.fuse(model, fuse_setting)
    scripted = script.to_torchscript(fused, mode, modeling.example_inputs(INPUTS))
    path = tmp_path / f"{mode}.ptl"
    optimize.optimize(scripted, OPTIONS, mode, INPUTS)._save_for_lite_interpreter(str(path))
    return sqnr_db(reference, _load_for_lite_interpreter(str(path))(x))


@pytest.mark.parametrize("factory", [tiny_models.conv_bn, tiny_models.branchy, tiny_models.branchy_sequential])
def test_the_test_models_trip_optimize_for_mobile_when_traced_naively(factory):
    model = factory()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        naive = optimize_for_mobile(torch.jit.trace(model, x))
        assert sqnr_db(model(x), naive(x)) < 10.0  # pytorch/pytorch#76807: proves these models can catch it


FUSE_CASES = [
    (tiny_models.conv_bn, "auto"), (tiny_models.conv_bn, False), (tiny_models.conv_bn, [["0", "1"]]),
    (tiny_models.branchy, "auto"), (tiny_models.branchy, False),
    (tiny_models.branchy_sequential, "auto"), (tiny_models.branchy_sequential, False),
    (tiny_models.self_fusing, "auto"),
]


@pytest.mark.parametrize("mode", ["trace", "script"])
@pytest.mark.parametrize("factory, fuse_setting", FUSE_CASES)
def test_every_ptl_matches_the_eager_model(factory, fuse_setting, mode, tmp_path):
    assert lite_sqnr(factory(), fuse_setting, mode, tmp_path) > FP32_DB


def test_auto_fuse_finds_the_performance_recipe_sequences():
    model = tiny_models.conv_bn()
    _, groups = fuse.fuse(model, "auto")
    assert groups == [["0", "1", "2"], ["3", "4"]]
    _, groups = fuse.fuse(tiny_models.conv_bn(), False)
    assert groups == [["0", "1"], ["3", "4"]]  # batch norm is folded even with fuse: false


def test_a_models_own_fuse_model_is_used_and_what_it_leaves_is_folded():
    fused, groups = fuse.fuse(tiny_models.self_fusing(), "auto")
    assert groups == [["3", "4"]]
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())


def test_fuse_falls_back_to_sequential_structure_when_fx_cannot_trace():
    _, groups = fuse.fuse(tiny_models.branchy_sequential(), "auto")
    assert groups == [["features.0", "features.1", "features.2"]]


def test_explicit_fuse_names_are_checked():
    with pytest.raises(MobileBuildError, match=r"no module named 'nope'") as caught:
        fuse.fuse(tiny_models.conv_bn(), [["0", "nope"]])
    assert caught.value.field == "fuse[0]"
    with pytest.raises(MobileBuildError, match=r"cannot fuse \(ReLU, Conv2d\)"):
        fuse.fuse(tiny_models.conv_bn(), [["2", "3"]])


def test_the_optimize_stage_keeps_batch_norm_it_was_not_shown_unfolded(tmp_path):
    # Bypass the fuse stage entirely: a traced model still holding batch norm must come out correct.
    model = tiny_models.branchy()
    x = modeling.example_inputs(INPUTS, seed=1)[0]
    traced = script.to_torchscript(model, "trace", modeling.example_inputs(INPUTS))
    assert optimize.has_batch_norm(traced)
    with torch.no_grad():
        assert sqnr_db(model(x), optimize.optimize(traced, OPTIONS, "trace", INPUTS)(x)) > FP32_DB


def test_int8_artifact_stays_close_to_eager(tmp_path):
    model = tiny_models.conv_bn()
    x = modeling.example_inputs(INPUTS, seed=1)[0]
    with torch.no_grad():
        reference = model(x)
    fused, _ = fuse.fuse(model, "auto")
    quantized = quantize.static(fused, "qnnpack", calibration.batches(
        {"source": "random", "batches": 4, "seed": 0}, INPUTS))
    scripted = script.to_torchscript(quantized, "script", (x,))
    path = tmp_path / "int8.ptl"
    optimize.optimize(scripted, OPTIONS, "script", INPUTS)._save_for_lite_interpreter(str(path))
    assert sqnr_db(reference, _load_for_lite_interpreter(str(path))(x)) > 20.0


def test_channels_last_wrapper_converts_the_input():
    scripted = script.to_torchscript(script.ChannelsLastInput(tiny_models.conv_bn()).eval(), "script",
                                     modeling.example_inputs(INPUTS))
    graph = str(scripted.inlined_graph)
    assert "aten::contiguous" in graph


def test_script_failure_advises_trace():
    class Untypable(torch.nn.Module):
        def forward(self, x):
            return {frozenset([1]): x}[frozenset([1])]

    with pytest.raises(MobileBuildError, match=r"torch.jit.script cannot compile.*set `script: trace`") as caught:
        script.to_torchscript(Untypable(), "script", (torch.randn(1),))
    assert caught.value.field == "script"


class TestCheckpointFiles:
    @pytest.fixture
    def model(self):
        return tiny_models.ConvBn().eval()

    def test_round_trip(self, model, tmp_path):
        path = tmp_path / "ok.pt"
        torch.save(tiny_models.conv_bn().state_dict(), path)
        modeling.load_weights(model, path, field="model.checkpoint")
        assert torch.equal(model[1].running_var, tiny_models.conv_bn()[1].running_var)

    @pytest.mark.parametrize("content, message", [
        (b"", "not a readable PyTorch checkpoint"),
        (b"garbage", "not a readable PyTorch checkpoint"),
    ])
    def test_unreadable(self, model, tmp_path, content, message):
        path = tmp_path / "bad.pt"
        path.write_bytes(content)
        with pytest.raises(MobileBuildError, match=message):
            modeling.load_weights(model, path, field="model.checkpoint")

    def test_truncated(self, model, tmp_path):
        path = tmp_path / "cut.pt"
        torch.save(model.state_dict(), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(MobileBuildError, match="not a readable PyTorch checkpoint"):
            modeling.load_weights(model, path, field="model.checkpoint")

    def test_code_carrying_pickle_is_refused_not_run(self, model, tmp_path):
        marker = tmp_path / "pwned"

        class Payload:
            def __reduce__(self):
                return (open, (str(marker), "w"))

        path = tmp_path / "evil.pt"
        torch.save({"0.weight": Payload()}, path)
        with pytest.raises(MobileBuildError, match="refused"):
            modeling.load_weights(model, path, field="model.checkpoint")
        assert not marker.exists()

    def test_keys_and_shapes_must_match(self, model, tmp_path):
        state = tiny_models.conv_bn().state_dict()
        state["0.weight"] = torch.zeros(2, 2)
        state.pop("4.bias")
        state["extra"] = torch.zeros(1)
        path = tmp_path / "mismatch.pt"
        torch.save(state, path)
        with pytest.raises(MobileBuildError, match=r"missing keys 4.bias; unexpected keys extra; shape mismatch "
                                                   r"0.weight \(2, 2\) vs model \(8, 3, 3, 3\)"):
            modeling.load_weights(model, path, field="model.checkpoint")


def test_checkpoint_reports_an_input_shape_the_model_rejects():
    with pytest.raises(MobileBuildError, match=r"the model rejects inputs input \[1, 5, 16, 16\] float32: ") as caught:
        checkpoint.check_input(tiny_models.conv_bn(), [{**INPUT, "shape": [1, 5, 16, 16]}])
    assert caught.value.field == "input.shape"


@pytest.mark.parametrize("make, layer", [(tiny_models.conv_bn, "0 (Conv2d)"),
                                         (lambda: torchvision.models.mobilenet_v3_small(), "features.0.0 (Conv2d)")])
def test_an_input_of_the_wrong_rank_is_named_as_such(make, layer):
    """[1, 3, 64] for a Conv2d model: torch reads it as one unbatched image and speaks of channels."""
    with pytest.raises(MobileBuildError, match=rf"the recipe's shape \[1, 3, 64\] has rank 3, but the model's first "
                                               rf"layer, {re.escape(layer)}, takes rank 4 \(\[batch, channels, "
                                               r"height, width\]\): give input.shape 4 sizes \(torch: ") as caught:
        checkpoint.check_input(make().eval(), [{**INPUT, "shape": [1, 3, 64]}])
    assert caught.value.field == "input.shape"


def test_batchnorm_statistics_are_reestimated():
    model = tiny_models.ConvBn().eval()
    checkpoint.reestimate_batchnorm(model, INPUTS, batches=2, seed=0)
    assert not torch.allclose(model[1].running_var, torch.ones(8))
    assert not model.training


class TestImageCalibration:
    IMAGE_INPUTS = [{"name": "input", "shape": [2, 3, 16, 16], "dtype": "float32", "memory_format": "contiguous"}]

    def test_images_are_loaded_resized_and_normalised(self, tmp_path):
        from PIL import Image

        for index in range(3):
            Image.new("RGB", (20, 10), (index * 100, 50, 200)).save(tmp_path / f"{index}.png")
        batches = list(calibration.batches(
            {"source": "images", "path": str(tmp_path), "batches": 2, "mean": [0.5, 0.5, 0.5],
             "std": [0.5, 0.5, 0.5]}, self.IMAGE_INPUTS))
        assert len(batches) == 2 and all(len(batch) == 1 for batch in batches)  # one tensor per input
        (images,) = batches[0]
        assert images.shape == (2, 3, 16, 16)
        assert images[0, 2].mean().item() == pytest.approx((200 / 255 - 0.5) / 0.5, abs=1e-3)

    def test_a_file_that_is_not_an_image(self, tmp_path):
        (tmp_path / "notes.txt").write_text("hello")
        with pytest.raises(MobileBuildError, match=r"notes.txt is not a readable image"):
            list(calibration.batches({"source": "images", "path": str(tmp_path), "batches": 1}, self.IMAGE_INPUTS))

    def test_an_empty_folder(self, tmp_path):
        with pytest.raises(MobileBuildError, match="holds no images"):
            list(calibration.batches({"source": "images", "path": str(tmp_path), "batches": 1}, self.IMAGE_INPUTS))


def test_a_library_message_is_quoted_as_whole_sentences_without_its_staff_notes():
    first_line = modeling.first_line
    dispatcher = ("Could not run 'aten::add.out' with arguments from the 'QuantizedCPU' backend. This could be because "
                  "the operator doesn't exist for this backend, or was omitted during the selective/custom build "
                  "process (if using custom build). If you are a Facebook employee using PyTorch on mobile, please "
                  "visit https://fburl.com/ptmfixes for possible resolutions. 'aten::add.out' is only available for "
                  "these backends: [CPU, Meta, BackendSelect, Python, FuncTorchDynamicLayerBackMode, Functionalize].")
    assert first_line(RuntimeError(dispatcher)) == (
        "Could not run 'aten::add.out' with arguments from the 'QuantizedCPU' backend. This could be because the "
        "operator doesn't exist for this backend, or was omitted during the selective/custom build process (if "
        "using custom build).")
    assert first_line(ValueError("one sentence, e.g. this one\nand a second line")) == "one sentence, e.g. this one"
    assert first_line(ValueError("x" * 400)) == "x" * 299 + "\u2026"
    assert first_line(KeyError()) == "KeyError"


def test_a_message_that_introduces_a_list_keeps_what_it_is_about():
    # torch.jit.script of a dynamically quantized Transformer encoder: the code it points at, and where
    torchscript = ("\nmethod cannot be used as a value:\n  File \"/venv/torch/nn/modules/transformer.py\", line 884\n"
                   "                self.norm2.bias,\n                self.linear1.weight,\n"
                   "                ~~~~~~~~~~~~~~~~~~~ <--- HERE\n                self.linear1.bias,\n")
    assert modeling.first_line(RuntimeError(torchscript)) == (
        "method cannot be used as a value: self.linear1.weight, (transformer.py, line 884)")
    # pybind11: the list of signatures that follows is left out, and so is the sentence that announces it
    pybind = ("__call__(): incompatible function arguments. The following argument types are supported:\n"
              "    1. (self: torch._C.ScriptMethod, *args, **kwargs) -> object\n\nInvoked with: 3")
    assert modeling.first_line(TypeError(pybind)) == "__call__(): incompatible function arguments."
