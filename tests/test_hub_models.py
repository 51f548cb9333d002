"""Models from timm, built from their configs with random weights (no download): the stages take them as they take
the project's own. Each model is small and runs at a small input size, so these stay in the fast tier."""

from types import SimpleNamespace

import pytest
import timm  # noqa: F401  (a test dependency: the factory below imports it by name)
import torch
import torch.ao.nn.intrinsic as nni

from mobilebuild.engine import fetched
from mobilebuild.plan.stages import QuantizeConfig
from mobilebuild.worker.stages import fuse, modeling, quantize, script

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
