"""The FX method (worker/layers/fx.py): a model quantized in FX graph mode, its quantized ops shadowed by float
copies through the FX numeric suite (the eager route's layers of such a model)."""

from types import SimpleNamespace

from layers_support import CALIBRATION, INPUTS, layers_config, run_layers
from tiny_models import stored_fused

from mobilebuild.worker.stages import calibration, fuse, modeling, quantize


def hardswish_source(tmp_path):
    from tiny_models import tiny_hardswish

    fused, _ = fuse.fuse(tiny_hardswish(), "auto")
    source = stored_fused(fused, tmp_path / "fused.pt", factory="tiny_models:tiny_hardswish")
    from mobilebuild.worker.stages import fx_quantize

    quantize.use_engine("qnnpack")
    model = fuse.load(str(tmp_path / "fused.pt"), SimpleNamespace(**source))
    quantized = fx_quantize.static(model, "qnnpack", calibration.batches(CALIBRATION, INPUTS), INPUTS,
                                   quantize.qconfig_for("qnnpack"))
    modeling.save({quantize.GRAPH_MODE: "fx", "state_dict": quantized.state_dict()}, tmp_path / "quantized.pt")
    return source


def test_fx_quantization_with_an_in_place_hardswish_is_ranked(tmp_path):
    """MobileNetV3's nn.Hardswish(inplace=True) quantized in FX graph mode: the FX numeric suite handed the float
    Hardswish the int8 model's quantized tensor, and the whole comparison failed ("Could not run
    'aten::hardswish_' with arguments from the 'QuantizedCPU' backend"). Each float copy is now fed float and run
    out of place: the Hardswish layers are ranked like the others."""
    source = hardswish_source(tmp_path)
    config = layers_config("eager", source, engine="qnnpack", quantization={"mode": "static", "weights": None},
                           top=10)

    result = run_layers(tmp_path, config, {"quantized": str(tmp_path / "quantized.pt")})

    assert result["method"] == "fx" and "not_compared" not in result, result
    found = {(row["name"], row["op"]) for row in result["layers"]}
    assert {("features.2", "Hardswish"), ("features.5", "Hardswish"), ("features.0", "Conv2d"),
            ("features.3", "Conv2d"), ("head", "Linear")} <= found, found
    assert all(25 < row["sqnr_db"] < 80 for row in result["layers"]), result["layers"]


def test_an_fx_layer_whose_float_copy_cannot_run_is_listed_not_fatal(tmp_path, monkeypatch):
    """Where one float copy truly cannot run on what the int8 model feeds it, that layer is listed under
    not_compared with the error, and the others are still ranked."""
    import torch
    from torch.ao.ns import _numeric_suite_fx as ns_fx

    source = hardswish_source(tmp_path)
    config = layers_config("eager", source, engine="qnnpack", quantization={"mode": "static", "weights": None},
                           top=10)
    shadowing = ns_fx.add_shadow_loggers

    def failing_afterwards(*args, **kwargs):  # the float model still traces and runs before the shadows exist
        shadowed = shadowing(*args, **kwargs)
        monkeypatch.setattr(torch.nn.Hardswish, "forward", lambda self, input: input.no_such_kernel())
        return shadowed

    monkeypatch.setattr(ns_fx, "add_shadow_loggers", failing_afterwards)
    result = run_layers(tmp_path, config, {"quantized": str(tmp_path / "quantized.pt")})

    uncompared = {(row["name"], row["op"]): row["reason"] for row in result["not_compared"]}
    assert set(uncompared) == {("features.2", "Hardswish"), ("features.5", "Hardswish")}, uncompared
    assert all("its float module cannot run on the int8 model's input: AttributeError" in reason
               for reason in uncompared.values()), uncompared
    assert {"features.0", "features.3", "head"} <= {row["name"] for row in result["layers"]}, result["layers"]


def test_the_numeric_suite_builds_its_fusion_patterns_once_and_prints_nothing(tmp_path, monkeypatch, capsys):
    """The suite's matcher asked for its fusion patterns, built afresh, at every node it matched: 53.7 s of the
    71.4 s add_shadow_loggers took on timm's mobileone_s0. And it prints a line per op it cannot shadow."""
    from torch.ao.ns.fx import graph_matcher, pattern_utils

    built = []
    building = pattern_utils.get_reversed_fusions

    def counted():
        built.append(1)
        return building()

    monkeypatch.setattr(pattern_utils, "get_reversed_fusions", counted)
    monkeypatch.setattr(graph_matcher, "get_reversed_fusions", counted)
    source = hardswish_source(tmp_path)
    config = layers_config("eager", source, engine="qnnpack", quantization={"mode": "static", "weights": None})
    capsys.readouterr()

    result = run_layers(tmp_path, config, {"quantized": str(tmp_path / "quantized.pt")})

    assert result["method"] == "fx" and result["layers"]
    assert len(built) == 1
    assert graph_matcher.get_reversed_fusions is counted  # put back
    assert "skipping shadow loggers" not in capsys.readouterr().out
