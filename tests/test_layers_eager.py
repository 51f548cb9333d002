"""The eager method (worker/layers/eager.py): the quantize stage's model rebuilt, each quantized module shadowed by its
float module; a model quantized in FX graph mode goes to fx.py (its own cases: test_layers_fx.py)."""

from types import SimpleNamespace

import pytest
from layers_support import CALIBRATION, INPUTS, assert_broken_first, fused_model, layers_config, run_layers

from mobilebuild.worker.stages import calibration, fuse, modeling, quantize


@pytest.mark.parametrize("graph_mode", [False, True])
def test_eager_and_fx_quantization_rank_the_broken_convolution_first(tmp_path, graph_mode, capsys):
    source = fused_model(tmp_path)
    fused = fuse.load(str(tmp_path / "fused.pt"), SimpleNamespace(**source))
    batches = lambda: calibration.batches(CALIBRATION, INPUTS)  # noqa: E731
    if graph_mode:
        from mobilebuild.worker.stages import fx_quantize

        quantize.use_engine("qnnpack")
        quantized = fx_quantize.static(fused, "qnnpack", batches(), INPUTS, quantize.qconfig_for("qnnpack"))
        state = {quantize.GRAPH_MODE: "fx", "state_dict": quantized.state_dict()}
    else:
        quantized = quantize.static(fused, "qnnpack", batches(), specs=INPUTS)
        state = quantized.state_dict()
    modeling.save(state, tmp_path / "quantized.pt")
    config = layers_config("eager", source, engine="qnnpack", quantization={"mode": "static", "weights": None})

    result = run_layers(tmp_path, config, {"quantized": str(tmp_path / "quantized.pt")})

    assert result["method"] == ("fx" if graph_mode else "eager")
    assert_broken_first(result)
    assert "worst layers: features.2 (" in capsys.readouterr().out
