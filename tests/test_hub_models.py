"""Models from timm, built from their configs with random weights (no download): the stages take them as they take
the project's own. Each model is small and runs at a small input size, so these stay in the fast tier."""

import copy
from types import SimpleNamespace

import pytest
import timm  # noqa: F401  (a test dependency: the factory below imports it by name)
import torch
import torch.ao.nn.intrinsic as nni

from mobilebuild.engine import fetched
from mobilebuild.plan.stages import QuantizeConfig
from mobilebuild.routes.torchscript.worker import script
from mobilebuild.worker.stages import calibration, fuse, modeling, quantize

INPUTS = [{"name": "input", "shape": [1, 3, 64, 64], "dtype": "float32", "memory_format": "contiguous"}]
CALIBRATION = {"source": "random", "batches": 2, "seed": 0}


def source(name):
    """The recipe's model source for a timm model: its factory, random weights."""
    return {"factory": "timm:create_model", "kwargs": {"model_name": name, "pretrained": False}}


def with_batchnorm_statistics(model, seed=0):
    """Non-trivial batch-norm statistics and affine parameters (a fresh model's are mean 0, var 1, weight 1, bias 0,
    which hide a wrong fold)."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            size = module.num_features
            module.running_mean.copy_(torch.randn(size, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(size, generator=generator) * 0.5 + 0.75)
            module.weight.data.copy_(torch.rand(size, generator=generator) * 0.5 + 0.75)
            module.bias.data.copy_(torch.randn(size, generator=generator) * 0.1)
    return model.eval()


def checkpoint(name, path):
    """The checkpoint stage's output for the timm model `name`: its weights, batch-norm statistics made non-trivial."""
    model = with_batchnorm_statistics(modeling.build_model(source(name), seed=0))
    modeling.save(model.state_dict(), path)
    return model


def sqnr(reference, value):
    return float(10 * torch.log10(reference.pow(2).mean() / (reference - value).pow(2).mean()))


# --- FX graph-mode int8: what is stored loads weights-only ------------------------------------------------------

def test_fx_quantized_timm_model_is_stored_weights_only_and_rebuilt_exactly(tmp_path, monkeypatch):
    """timm's Linear calls F.linear, which FX graph mode packs into a script object (LinearPackedParamsBase) kept as
    an attribute of the converted model: its state_dict held it, and the stages after quantize refused the file
    ("it carries code, not only tensors (... GLOBAL torch.ScriptObject ...)")."""
    checkpoint("lcnet_050", tmp_path / "checkpoint.pt")
    config = QuantizeConfig(engine="qnnpack", mode="static", weights=None, inputs=INPUTS, model=source("lcnet_050"),
                            fuse="auto", calibration=CALIBRATION)
    fuse.run({"checkpoint": tmp_path / "checkpoint.pt"}, config, tmp_path / "fused.pt")
    stored = []  # the model the stage quantized, as it stores it
    monkeypatch.setattr(quantize, "stored_state", lambda model, *args, store=quantize.stored_state: (
        stored.append(model), store(model, *args))[1])
    quantize.run({"model": tmp_path / "fused.pt"}, config, tmp_path / "quantized.pt")
    (direct,) = stored
    assert isinstance(direct, torch.fx.GraphModule)  # quantized in FX graph mode
    assert any(isinstance(value, torch.ScriptObject) for value in direct.state_dict().values())

    assert fetched.problem(tmp_path / "quantized.pt", "weights") is None  # the shared cache's check takes it too
    stage = SimpleNamespace(engine="qnnpack", inputs=INPUTS, model=source("lcnet_050"), fuse="auto",
                            quantization={"mode": "static", "weights": None})
    rebuilt = quantize.load_quantized({"model": tmp_path / "fused.pt", "quantized": tmp_path / "quantized.pt"}, stage)
    example = modeling.example_inputs(INPUTS, seed=5)[0]
    with torch.no_grad():
        assert torch.equal(direct(example), rebuilt(example))
        # the packed weights put back are the engine's own: the script stage compiles and runs them
        assert torch.equal(script.to_torchscript(rebuilt, "script", (example,))(example), rebuilt(example))


def test_fx_graph_modes_observers_see_the_calibration_batches_alone():
    """Finding the observers on integer tensors runs the example (random inputs) through the observed model: the
    observers recorded it as calibration. timm's mobileone_s0 trained on digits reached 57,000 on the random image
    (39 on digits), and the ranges it left rounded every qnnpack output to zero (SQNR 0 dB, cosine 0)."""
    from torch.ao.quantization.observer import ObserverBase

    from mobilebuild.worker.stages import fx_quantize

    observed = fx_quantize.prepared(with_batchnorm_statistics(modeling.build_model(source("lcnet_050"), seed=0)),
                                    "qnnpack", INPUTS)
    observers = [module for module in observed.modules() if isinstance(module, ObserverBase)
                 and hasattr(module, "min_val")]  # not the fixed ranges of hardsigmoid and the like
    assert observers and all(torch.isinf(module.min_val).all() for module in observers)  # nothing seen yet


def with_dead_channels(model, relu_norm, channels=4, batches=4):
    """`model` with `channels` channels of the norm-activation layer `relu_norm` dead after its ReLU (a bias far below
    zero), then batch-norm statistics estimated on random inputs with its weights fixed, as the hub zoo's training
    ends: a depthwise convolution reading a dead channel gives a constant, whose batch norm gets running variance 0
    and divides by sqrt(eps) alone (what timm's mobilenetv4_conv_small had after brief training, gain 880)."""
    with torch.no_grad():
        model.get_submodule(relu_norm).bias[:channels] = -1e3
    norms = [module for module in model.modules() if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average
        norm.train()
    with torch.no_grad():
        for seed in range(batches):
            model(modeling.example_inputs(INPUTS, seed=10 + seed, batch=8)[0])
    return model.eval()


@pytest.mark.slow
def test_fx_graph_mode_int8_keeps_the_channels_beside_a_large_folded_gain():
    """Batch norm folded into a convolution scales each output channel by its own factor: a channel normalised by
    sqrt(eps) alone gets weights hundreds of times the others', and qnnpack's default of one weight scale per tensor
    rounded the rest away (the hub zoo's trained mobilenetv4_conv_small: -1.0 dB, cosine 0.26; 18.4 dB per channel).
    FX graph mode takes per-channel weights unless quantize.weights says otherwise, as ExecuTorch's and ONNX
    Runtime's quantizers do. Random weights otherwise: about 10 dB is what int8 gives this model either way."""
    model = with_dead_channels(modeling.build_model(source("mobilenetv4_conv_small"), seed=0), "blocks.1.1.bn1")
    assert list(fuse.still_channels(model)) == ["blocks.2.0.dw_start.bn"]
    fused, _ = fuse.fuse(model, "auto")
    example = modeling.example_inputs(INPUTS, seed=5, batch=4)
    with torch.no_grad():
        reference = fused(*example)
    found = {}
    for weights in (None, "per_tensor"):
        quantized, note = quantize.static_any(copy.deepcopy(fused), "qnnpack", lambda: calibration.batches(
            CALIBRATION, INPUTS), weights, "quantize.calibration", INPUTS)
        with torch.no_grad():
            found[weights] = sqnr(reference, quantized(*example)), note
    assert found[None][0] > 8 and "quantized in FX graph mode, weights per-channel;" in found[None][1], found
    assert found["per_tensor"][0] < 2, found  # what a recipe asking for per-tensor weights gets


def test_batch_norm_of_channels_that_never_varied_is_named_with_its_gain():
    """timm's mobileone_s0 trained briefly had channels dead after its stem: the batch norms of its first stage's
    branches (identity branches among them) got running variance 0, dividing by sqrt(eps) alone (gains up to 970).
    int8 rounding there was multiplied so much that qnnpack, ExecuTorch and ONNX int8 all failed; a failed int8
    verification names them and says what to do."""
    from mobilebuild.worker.stages import verify

    model = with_batchnorm_statistics(modeling.build_model(source("mobileone_s0"), seed=0))
    assert fuse.still_channels(model) == {}
    identity = model.get_submodule("stages.0.1.identity")
    identity.running_var[:3] = 0
    identity.weight.data[:3] = torch.tensor([0.5, 2.0, 1.0])
    found = fuse.still_channels(model)
    assert list(found) == ["stages.0.1.identity"]
    assert found["stages.0.1.identity"] == pytest.approx(2.0 / identity.eps ** 0.5)  # 632
    note = verify.still_channels_note(found)
    assert note.startswith("batch norm in stages.0.1.identity normalises channels that hardly varied on the data "
                           "its statistics came from (running variance at most eps: gains up to 632)")
    assert note.endswith("or keep float the modules that compute them (`quantize.exclude`: stages.0.1.identity)")
    assert verify.int8_notes(model, calibrated=True) == note  # no layer norm: nothing on the mode


def test_a_folded_batch_norm_is_named_by_the_convolution_that_computes_it():
    """Fused, a batch norm folded into its convolution leaves an identity (or its activation) at its own path, and
    `quantize.exclude` naming that path kept nothing float (timm's mnasnet_small trained on digits, qnnpack: 12.4 dB
    either way; its convolution blocks.0.0.conv_dw float: 27.0 dB). The note names the convolution, which the
    exclusion takes."""
    from mobilebuild.worker.stages import exclusion, verify

    model = with_batchnorm_statistics(modeling.build_model(source("mobileone_s0"), seed=0))
    norm = model.get_submodule("stages.0.0.conv_kxk.0.bn")
    norm.running_var[:3] = 0
    assert fuse.folded_into(model)["stages.0.0.conv_kxk.0.bn"] == "stages.0.0.conv_kxk.0.conv"
    note = verify.int8_notes(model, calibrated=True)
    assert note.startswith("batch norm in stages.0.0.conv_kxk.0.bn normalises"), note
    assert note.endswith("(`quantize.exclude`: stages.0.0.conv_kxk.0.conv; fused, batch norm is computed by the "
                         "convolution it is folded into)"), note
    fused, _ = fuse.fuse(model, "auto")
    assert not isinstance(fused.get_submodule("stages.0.0.conv_kxk.0.bn"), torch.nn.modules.batchnorm._BatchNorm)
    assert exclusion.resolve(fused, ["stages.0.0.conv_kxk.0.conv"]) == ["stages.0.0.conv_kxk.0.conv"]


def test_a_statically_quantized_transformer_is_pointed_at_dynamic_int8():
    """transformers' ViT (2 layers x 64, trained on digits in the hub zoo): ONNX Runtime's static int8 gave 14.6 dB,
    its dynamic int8 40.5 dB."""
    from mobilebuild.worker.stages import verify

    vit = modeling.build_model({"transformers": "AutoModelForImageClassification",
                                "config": {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 1,
                                           "num_attention_heads": 2, "intermediate_size": 64, "image_size": 32,
                                           "patch_size": 8, "num_labels": 10}}, seed=0)
    assert verify.int8_notes(vit, calibrated=True) == verify.STATIC_TRANSFORMER
    assert verify.int8_notes(vit, calibrated=False) is None  # dynamic already
    assert verify.int8_notes(modeling.build_model(source("lcnet_050"), seed=0), calibrated=True) is None


# --- fuse: batch norm in timm's norm-activation layers is folded -------------------------------------------------

# (model, batch-norm layers, folded into the convolution before them): mobileone_s0's identity branches are batch norm
# alone, on the block's input (timm's reparameterize_model merges them into the convolution of the block)
FOLDED = [("lcnet_050", 27, 27), ("mobilenetv4_conv_small", 46, 46), ("mobileone_s0", 226, 191)]


@pytest.mark.parametrize(("name", "norms", "folded"), FOLDED)
def test_fuse_auto_folds_batchnorm_of_timms_norm_activation_layers(name, norms, folded):
    from timm.layers import BatchNormAct2d

    model = with_batchnorm_statistics(modeling.build_model(source(name), seed=0))
    assert len(fuse.batch_norms(model)) == norms
    assert all(isinstance(model.get_submodule(path), BatchNormAct2d) for path in fuse.batch_norms(model))
    example = modeling.example_inputs(INPUTS, seed=3, batch=2)[0]
    with torch.no_grad():
        reference = model(example)
        fused, _ = fuse.fuse(model, "auto")
        assert len(fuse.batch_norms(fused)) == norms - folded
        assert sqnr(reference, fused(example)) > 80  # float rounding apart, the same model


def test_batchnorm_of_timms_norm_activation_layers_is_folded_whatever_fuse_says():
    """As a plain batch norm after a convolution is (optimize_for_mobile's own folding is wrong on traced models)."""
    model = with_batchnorm_statistics(modeling.build_model(source("lcnet_050"), seed=0))
    example = modeling.example_inputs(INPUTS, seed=3)[0]
    with torch.no_grad():
        reference = model(example)
        fused, groups = fuse.fuse(model, False)
        assert not fuse.batch_norms(fused) and len(groups) == 27
        assert not any(isinstance(module, nni.ConvReLU2d) for module in fused.modules())  # nothing else fused
        assert sqnr(reference, fused(example)) > 80


def test_the_fuse_stage_says_how_much_it_folded_and_the_later_stages_rebuild_it(tmp_path, capsys):
    """The stages after fuse rebuild the fused structure from the recipe (on the meta device) and load its weights."""
    model = checkpoint("mobilenetv4_conv_small", tmp_path / "checkpoint.pt")
    config = SimpleNamespace(model=source("mobilenetv4_conv_small"), fuse="auto")
    fuse.run({"checkpoint": tmp_path / "checkpoint.pt"}, config, tmp_path / "fused.pt")
    assert capsys.readouterr().out == ("   batch norm folded into the convolution before it: 46 of 46 (46 of 46 in "
                                       "timm's BatchNormAct2d)\n")
    rebuilt = fuse.load(tmp_path / "fused.pt", config)
    assert not fuse.batch_norms(rebuilt)
    assert sum(isinstance(module, nni.ConvReLU2d) for module in rebuilt.modules()) > 0  # ReLU fused too
    example = modeling.example_inputs(INPUTS, seed=3)[0]
    with torch.no_grad():
        assert sqnr(model(example), rebuilt(example)) > 80
