"""Models from timm, built from their configs with random weights (no download): the stages take them as they take
the project's own. Each model is small and runs at a small input size, so these stay in the fast tier."""

from types import SimpleNamespace

import timm  # noqa: F401  (a test dependency: the factory below imports it by name)
import torch

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

