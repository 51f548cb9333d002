"""The ONNX method (routes/onnx/worker/layers.py, its graph surgery in onnx_surgery.py): each quantized node, or integer
unit, of the shipped model cut out and run on the float model's values."""

from types import SimpleNamespace

from layers_support import (
    CALIBRATION,
    INPUTS,
    TOKENS_AND_MASK,
    assert_broken_first,
    assert_real,
    fused_model,
    layers_config,
    method,
    run_layers,
)
from tiny_models import stored_fused

from mobilebuild.plan import stages
from mobilebuild.routes.onnx import plan as onnx_route
from mobilebuild.routes.onnx.worker import export
from mobilebuild.routes.onnx.worker import layers as onnx_method
from mobilebuild.worker.stages import fuse


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
    config = stages.LayersConfig(method=method("onnx"), precision="int8", inputs=tokens, samples=4, seed=0, top=10,
                                 options=options, mode="dynamic", **source)
    result = run_layers(tmp_path, config, {"artifact": str(tmp_path / "dynamic.onnx")})
    assert result["method"] == "onnx"
    assert {(row["name"], row["op"]) for row in result["layers"]} >= {("lstm", "LSTM"), ("head", "Linear")}, \
        result["layers"]
    assert all(30 < row["sqnr_db"] < 60 for row in result["layers"]), result["layers"]


def test_onnx_static_int8_with_a_dynamic_dim_is_ranked(tmp_path, transformer_static_onnx):
    """positions[:, :seq] has no shape that inference can declare at a dynamic seq: the comparison read the float
    model's tensors flattened and could not shape them back ("Invalid rank for input: slice_1")."""
    from mobilebuild.worker import reproducible

    tokens = [dict(TOKENS_AND_MASK[0])]
    # the export stage's static int8 of tiny_models.tiny_transformer on these tokens, calibrated on CALIBRATION
    # (conftest's, shared)
    exported = transformer_static_onnx
    source = exported.rebuild
    with reproducible.plain_attention():
        config = stages.LayersConfig(method=method("onnx"), precision="int8", inputs=tokens, samples=4, seed=0, top=40,
                                     options={}, calibration=CALIBRATION, **source)
        result = run_layers(tmp_path, config, {"model": str(exported.folder / "fused.pt"),
                                               "artifact": str(exported.path)})

    assert result["method"] == "onnx"
    assert_real(result)
    assert {"qkv", "proj", "mlp.0", "mlp.2", "head"} <= {row["name"] for row in result["layers"]}, result["layers"]


def test_onnx_static_int8_of_a_transformer_encoder_ranks_its_attention_and_logs_no_errors(tmp_path, caplog,
                                                                                             encoder_static_onnx):
    """Two inputs, a dynamic seq, nn.TransformerEncoder. quantize_static calibrated the additive attention mask (0 and
    -inf) to an infinite scale, and the int8 attention's masked scores were all NaN: the export now keeps those nodes
    float, and the comparison feeds a node the float model's value of an input left float (the mask), so the
    MultiheadAttention has a real SQNR. onnxruntime's create_weight_matching logged "ERROR:root:Model Error ...
    weight tensor 'encoder.layers.0.norm1.bias0' not found!" (a shared bias quantized once per node): not any more,
    and an all-zero bias gives no weight SQNR (it gave LayerNorm 0.0 dB)."""
    import logging

    from mobilebuild.worker import reproducible

    # the export stage's static int8 of tiny_models.tiny_encoder on TOKENS_AND_MASK, calibrated on CALIBRATION
    # (conftest's, shared with test_export)
    exported = encoder_static_onnx
    source = exported.rebuild
    with reproducible.plain_attention():
        config = stages.LayersConfig(method=method("onnx"), precision="int8", inputs=TOKENS_AND_MASK, samples=4, seed=0,
                                     top=40, options={}, calibration=CALIBRATION, **source)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            result = run_layers(tmp_path, config, {"model": str(exported.folder / "fused.pt"),
                                                   "artifact": str(exported.path)})

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

    with caplog.at_level(logging.INFO), quiet.dropped_logs("test_layers_onnx", onnx_method.UNMATCHED_WEIGHT):
        logging.error("Model Error in '/tmp/x/float.onnx': weight tensor 'norm.bias0' not found!")
        logging.error("Model Error in '/tmp/x/qdq.onnx': Dequantized tensor name 'w' not recognized!")
        logging.getLogger("other").error("Model Error in '/tmp/x/float.onnx': weight tensor 'b' not found!")
    logging.error("Model Error in '/tmp/x/float.onnx': weight tensor 'after' not found!")  # the filter is gone
    assert [record.getMessage().split("'")[3] for record in caplog.records] == ["w", "b", "after"]
