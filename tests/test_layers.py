"""Per-layer error of int8 artifacts (worker/stages/layers.py): on each route the deliberately broken convolution
of tiny_models.BrokenConv is ranked first, not the layers after it."""

import json
from types import SimpleNamespace

import pytest
from tiny_models import broken_conv, stored_fused

from mobilebuild.plan import stages
from mobilebuild.routes import onnx as onnx_route
from mobilebuild.worker.stages import calibration, export, fuse, layers, modeling, quantize

INPUTS = [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]
CALIBRATION = {"source": "random", "batches": 8, "seed": 0}
BROKEN = "features.2"  # fused with its ReLU: features.2 is the ConvReLU2d


def fused_model(tmp_path):
    """The broken model fused as the fuse stage stores it, and the settings the later stages rebuild it from."""
    fused, _ = fuse.fuse(broken_conv(), "auto")
    return stored_fused(fused, tmp_path / "fused.pt", factory="tiny_models:broken_conv")


def layers_config(route, source, **extra):
    return stages.LayersConfig(route=route, precision="int8", inputs=INPUTS, samples=4, seed=0, evaluation=None,
                               calibration=CALIBRATION, **source, **{"top": 5, **extra})


def run_layers(tmp_path, config, inputs):
    output = tmp_path / f"layers-{config.route}.json"
    layers.run({"model": str(tmp_path / "fused.pt"), **inputs}, config, str(output))
    assert "error" not in json.loads(output.read_text()), output.read_text()
    return json.loads(output.read_text())


def assert_broken_first(result, top=5):
    ranked = result["layers"]
    assert ranked[0]["name"].startswith(BROKEN), ranked
    assert len(ranked) <= top
    # the broken layer is far below every other one, the last layers included
    assert ranked[0]["sqnr_db"] < 3 and ranked[1]["sqnr_db"] > ranked[0]["sqnr_db"] + 10, ranked
    assert result["seconds"] >= 0 and result["samples"] == 4


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


def test_executorch_int8_ranks_the_broken_convolution_first(tmp_path):
    source = fused_model(tmp_path)
    config = layers_config("pt2e", source, options={})

    result = run_layers(tmp_path, config, {})

    assert result["method"] == "pt2e" and "event tracer" in result["method_detail"]
    assert_broken_first(result)


def test_onnx_int8_ranks_the_broken_convolution_first(tmp_path):
    source = fused_model(tmp_path)
    model = fuse.load(str(tmp_path / "fused.pt"), SimpleNamespace(**source))
    proto = export.quantize_int8(export.export_float(model, INPUTS), CALIBRATION, INPUTS)
    (tmp_path / "model.onnx").write_bytes(export.reproducible(proto).SerializeToString())
    config = layers_config("onnx", source, options={})

    result = run_layers(tmp_path, config, {"artifact": str(tmp_path / "model.onnx")})

    assert result["method"] == "onnx"
    assert_broken_first(result)
    assert result["layers"][0]["op"] == "Conv2d" and "weight_sqnr_db" in result["layers"][0]


@pytest.mark.slow
def test_the_build_writes_each_int8_targets_worst_layers_to_the_manifest_and_the_report(project):
    from conftest import tiny_recipe

    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "qnnpack"},
                                              {"backend": "onnx", "precision": "int8"}]))
    built = project.run()

    assert built.returncode == 0, built.stdout + built.stderr
    said = [line for line in built.stdout.splitlines() if line.startswith("   worst layers: ")
            or line.startswith("   artifacts/tiny/layers-") and line.endswith("(from the cache)")]
    assert len(said) == 2  # the int8 targets only: a line each, unless an earlier test's build cached it
    assert sorted(path.name for path in project.artifact("tiny").glob("layers-*")) == ["layers-onnx.json",
                                                                                       "layers-qnnpack.json"]
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    assert sorted(manifest["layers"]) == ["onnx", "qnnpack"]
    for result in manifest["layers"].values():
        assert 0 < len(result["layers"]) <= 5 and result["seconds"] > 0
        assert [row["sqnr_db"] for row in result["layers"]] == sorted(row["sqnr_db"] for row in result["layers"])
    assert "**Worst layers of the int8 artifacts" in project.artifact("report.md").read_text()

    project.write_recipe(tiny_recipe(targets=[{"backend": "qnnpack"}], verify={"layers": False}))
    listed = project.run("list", "--all")
    assert listed.returncode == 0 and "layers:" not in listed.stdout and "verify:tiny-qnnpack" in listed.stdout


def test_a_layer_kept_float_by_quantize_exclude_is_no_longer_to_blame(tmp_path):
    source = fused_model(tmp_path)
    fused = fuse.load(str(tmp_path / "fused.pt"), SimpleNamespace(**source))
    quantized = quantize.static(fused, "qnnpack", calibration.batches(CALIBRATION, INPUTS), specs=INPUTS,
                                exclude=[BROKEN])
    modeling.save(quantized.state_dict(), tmp_path / "quantized.pt")
    quantization = {"mode": "static", "weights": None, "exclude": [BROKEN]}

    eager = run_layers(tmp_path, layers_config("eager", source, engine="qnnpack", quantization=quantization),
                       {"quantized": str(tmp_path / "quantized.pt")})
    pt2e = run_layers(tmp_path, layers_config("pt2e", source, options={}, exclude=[BROKEN]), {})

    for result in (eager, pt2e):
        assert result["layers"][0]["sqnr_db"] > 25, result["layers"]


def test_dynamic_int8_layers_are_compared_on_executorch_and_onnx(tmp_path):
    """quantize.mode: dynamic: no calibration; ExecuTorch's graph is quantized again dynamically, and ONNX Runtime's
    integer units (DynamicQuantizeLinear, MatMulInteger, the rescaling after it) are cut out of the shipped model;
    each is named by its module, on a model with a dynamic dim."""
    from tiny_models import tiny_transformer

    tokens = [{"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100], "memory_format": "contiguous",
               "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}]
    source = stored_fused(tiny_transformer(), tmp_path / "fused.pt", factory="tiny_models:tiny_transformer")
    model = {"model": str(tmp_path / "fused.pt")}
    export.run(model, onnx_route.ExportConfig(precision="int8", inputs=tokens, options={}, mode="dynamic", **source),
               tmp_path / "dynamic.onnx")
    linears = {"qkv", "proj", "mlp.0", "mlp.2", "head"}
    shipped = {"artifact": str(tmp_path / "dynamic.onnx")}
    for route, extra, artifact in (("pt2e", set(), {}), ("onnx", {"tokens"}, shipped)):  # ONNX: its int8 embedding
        config = stages.LayersConfig(route=route, precision="int8", inputs=tokens, samples=4, seed=0, top=10,
                                     options={}, mode="dynamic", **source)
        result = run_layers(tmp_path, config, artifact)
        assert result["method"] == route
        assert {row["name"] for row in result["layers"]} == linears | extra, result["layers"]
        assert all(35 < row["sqnr_db"] < 60 for row in result["layers"]), result["layers"]  # int8, and fine


def test_dynamic_int8_of_an_lstm_exported_by_torchscript_is_compared_per_module(tmp_path):
    """onnx.exporter: torchscript keeps nn.LSTM whole, and quantize_dynamic makes each layer of it a
    DynamicQuantizeLSTM: each is cut out of the shipped model from its float sequence and initial states, and named
    by the module the exporter's node names lead to (both layers of the two-layer LSTM are `lstm`)."""
    from tiny_models import tiny_lstm

    tokens = [{"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100], "memory_format": "contiguous",
               "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}]
    source = stored_fused(tiny_lstm(), tmp_path / "fused.pt", factory="tiny_models:tiny_lstm")
    options = {"exporter": "torchscript"}
    export.run({"model": str(tmp_path / "fused.pt")}, onnx_route.ExportConfig(
        precision="int8", inputs=tokens, options=options, mode="dynamic", **source), tmp_path / "dynamic.onnx")
    config = stages.LayersConfig(route="onnx", precision="int8", inputs=tokens, samples=4, seed=0, top=10,
                                 options=options, mode="dynamic", **source)
    result = run_layers(tmp_path, config, {"artifact": str(tmp_path / "dynamic.onnx")})
    assert result["method"] == "onnx"
    assert {(row["name"], row["op"]) for row in result["layers"]} >= {("lstm", "LSTM"), ("head", "Linear")}, \
        result["layers"]
    assert all(30 < row["sqnr_db"] < 60 for row in result["layers"]), result["layers"]


def test_a_layer_without_a_real_sqnr_is_said_not_given_a_sentinel_number():
    """Values the float model has -inf (an attention mask) are left out; int8 NaN where float is finite, or an
    all-zero float output, leave the layer without an SQNR, with why."""
    import torch

    errors = layers._Errors()
    mask = torch.tensor([0.0, float("-inf"), 0.0, float("-inf")])
    errors.add("encoder", "masked_fill", mask, mask.clone())  # the same mask: exact, not listed
    scores = torch.tensor([1.0, float("-inf"), 2.0, 3.0])
    errors.add("attention", "add", scores, torch.tensor([1.01, -50.0, 2.0, 3.0]))  # the masked value left out
    errors.add("broken", "add", torch.ones(4), torch.tensor([1.0, float("nan"), 1.0, 1.0]), part="Add node_Add_1")
    errors.add("silent", "relu", torch.zeros(4), torch.full((4,), 0.1))
    errors.add("partial", "Linear", torch.ones(4), torch.full((4,), 1.1))  # one part ran, the other could not
    errors.skip("partial", "Linear", "its MatMul node_MatMul_2 cannot run alone: InvalidGraph: ...")
    ranked, uncompared = errors.results()

    assert [(row["name"], row["float_inf_or_nan_values"]) for row in ranked] == [("attention", 1)]
    assert ranked[0]["sqnr_db"] == 51.46  # 10 log10(14 / 0.0001), not -300
    assert {row["name"]: row["reason"] for row in uncompared} == {
        "broken": "int8 gives inf or NaN for 1 of its 4 values where float's are finite (in Add node_Add_1)",
        "silent": "the float model's output is all zeros: no signal to measure the error against",
        "partial": "its MatMul node_MatMul_2 cannot run alone: InvalidGraph: ..."}
    line = layers.summary({"layers": ranked, "not_compared": uncompared, "method": "pt2e", "seconds": 1.0})
    assert "no SQNR: broken (add): int8 gives inf or NaN" in line and "-300" not in line


TOKENS_AND_MASK = [{"name": name, "shape": [1, 16], "dtype": "int64", "range": [0, high],
                    "memory_format": "contiguous", "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}
                   for name, high in (("ids", 100), ("mask", 2))]


def encoder_source(tmp_path):
    from tiny_models import stored_fused, tiny_encoder

    return stored_fused(tiny_encoder(), tmp_path / "fused.pt", factory="tiny_models:tiny_encoder")


def assert_real(result):
    assert result["layers"], result
    assert all(0 < row["sqnr_db"] < 100 for row in result["layers"]), result["layers"]
    for row in result.get("not_compared", []):
        assert row["reason"] and "sqnr_db" not in row, row


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_executorch_int8_of_a_transformer_encoder_has_real_layers_only(tmp_path, mode):
    """nn.TransformerEncoder turns the padding mask into a float mask of 0 and -inf (zeros_like, then masked_fill_ in
    place): it was "encoder (TransformerEncoder) -300 dB". The whole F.multi_head_attention_forward is one source
    node: its layer is the MultiheadAttention; a TransformerEncoderLayer's own ops (residual adds, its functional
    ReLU) are named by the op, not by the container's class."""
    from mobilebuild.worker import reproducible

    source = encoder_source(tmp_path)
    config = stages.LayersConfig(route="pt2e", precision="int8", inputs=TOKENS_AND_MASK, samples=4, seed=0, top=40,
                                 options={}, mode=mode, calibration=CALIBRATION, **source)
    with reproducible.plain_attention():  # as every stage runs (reproducible.stage_session)
        result = run_layers(tmp_path, config, {})

    assert_real(result)
    assert "not_compared" not in result, result["not_compared"]
    found = {(row["name"], row["op"]) for row in result["layers"]}
    assert ("encoder.layers.0.self_attn", "MultiheadAttention") in found, found
    assert {"encoder.layers.0.linear1", "encoder.layers.0.linear2", "head"} <= {name for name, _ in found}
    assert not any(name == "encoder" or op.startswith("Transformer") for name, op in found), found
    if mode == "static":
        assert {("encoder.layers.0", "add #1"), ("encoder.layers.0", "add #2")} <= found, found


def test_onnx_static_int8_with_a_dynamic_dim_is_ranked(tmp_path):
    """positions[:, :seq] has no shape that inference can declare at a dynamic seq: the comparison read the float
    model's tensors flattened and could not shape them back ("Invalid rank for input: slice_1")."""
    from tiny_models import tiny_transformer

    from mobilebuild.worker import reproducible

    tokens = [dict(TOKENS_AND_MASK[0])]
    source = stored_fused(tiny_transformer(), tmp_path / "fused.pt", factory="tiny_models:tiny_transformer")
    model = {"model": str(tmp_path / "fused.pt")}
    with reproducible.plain_attention():
        export.run(model, onnx_route.ExportConfig(precision="int8", inputs=tokens, options={}, calibration=CALIBRATION,
                                              **source), tmp_path / "static.onnx")
        config = stages.LayersConfig(route="onnx", precision="int8", inputs=tokens, samples=4, seed=0, top=40,
                                     options={}, calibration=CALIBRATION, **source)
        result = run_layers(tmp_path, config, {"artifact": str(tmp_path / "static.onnx")})

    assert result["method"] == "onnx"
    assert_real(result)
    assert {"qkv", "proj", "mlp.0", "mlp.2", "head"} <= {row["name"] for row in result["layers"]}, result["layers"]


def test_onnx_static_int8_of_a_transformer_encoder_ranks_its_attention_and_logs_no_errors(tmp_path, caplog):
    """Two inputs, a dynamic seq, nn.TransformerEncoder. quantize_static calibrated the additive attention mask (0 and
    -inf) to an infinite scale, and the int8 attention's masked scores were all NaN: the export now keeps those nodes
    float, and the comparison feeds a node the float model's value of an input left float (the mask), so the
    MultiheadAttention has a real SQNR. onnxruntime's create_weight_matching logged "ERROR:root:Model Error ...
    weight tensor 'encoder.layers.0.norm1.bias0' not found!" (a shared bias quantized once per node): not any more,
    and an all-zero bias gives no weight SQNR (it gave LayerNorm 0.0 dB)."""
    import logging

    from mobilebuild.worker import reproducible

    source = encoder_source(tmp_path)
    model = {"model": str(tmp_path / "fused.pt")}
    with reproducible.plain_attention():
        export.run(model, onnx_route.ExportConfig(precision="int8", inputs=TOKENS_AND_MASK, options={},
                                              calibration=CALIBRATION, **source), tmp_path / "static.onnx")
        config = stages.LayersConfig(route="onnx", precision="int8", inputs=TOKENS_AND_MASK, samples=4, seed=0,
                                     top=40, options={}, calibration=CALIBRATION, **source)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            result = run_layers(tmp_path, config, {"artifact": str(tmp_path / "static.onnx")})

    assert_real(result)
    assert "not_compared" not in result, result["not_compared"]
    ranked = {row["name"]: row for row in result["layers"]}
    assert "head" in ranked and "encoder.layers.0.linear1" in ranked, ranked
    attention = ranked["encoder.layers.0.self_attn"]
    assert attention["op"] == "MultiheadAttention" and 25 < attention["sqnr_db"] < 60, attention
    assert attention["float_inf_or_nan_values"] > 0  # the masked scores: -inf in float, left out
    assert all(0 < row.get("weight_sqnr_db", 1) <= 300 for row in result["layers"]), result["layers"]
    assert ranked["encoder.layers.0.norm1"]["weight_sqnr_db"] > 100  # its weight (all ones, exact), not its bias
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text


def test_dropped_logs_drops_only_the_expected_complaint(caplog):
    import logging

    from mobilebuild.worker import quiet

    with caplog.at_level(logging.INFO), quiet.dropped_logs("test_layers", layers._UNMATCHED_WEIGHT):
        logging.error("Model Error in '/tmp/x/float.onnx': weight tensor 'norm.bias0' not found!")
        logging.error("Model Error in '/tmp/x/qdq.onnx': Dequantized tensor name 'w' not recognized!")
        logging.getLogger("other").error("Model Error in '/tmp/x/float.onnx': weight tensor 'b' not found!")
    logging.error("Model Error in '/tmp/x/float.onnx': weight tensor 'after' not found!")  # the filter is gone
    assert [record.getMessage().split("'")[3] for record in caplog.records] == ["w", "b", "after"]


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
