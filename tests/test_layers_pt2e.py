"""The PT2E method (routes/executorch/worker/layers.py): ExecuTorch int8, its quantization run again and both graphs
logged with torchao's PT2E numeric debugger, each int8 node fed the float graph's input."""

import layers_support as support
import pytest

from mobilebuild.plan import stages


def test_executorch_int8_ranks_the_broken_convolution_first(tmp_path):
    source = support.fused_model(tmp_path)
    config = support.layers_config("pt2e", source, options={})

    result = support.run_layers(tmp_path, config, {})

    assert result["method"] == "pt2e" and "event tracer" in result["method_detail"]
    support.assert_broken_first(result)


# static: over 3 s, the XNNPACK quantizer tracing its patterns again on every call and the encoder's larger graph
@pytest.mark.parametrize("mode", [pytest.param("static", marks=pytest.mark.slow), "dynamic"])
def test_executorch_int8_of_a_transformer_encoder_has_real_layers_only(tmp_path, mode):
    """nn.TransformerEncoder turns the padding mask into a float mask of 0 and -inf (zeros_like, then masked_fill_ in
    place): it was "encoder (TransformerEncoder) -300 dB". The whole F.multi_head_attention_forward is one source
    node: its layer is the MultiheadAttention; a TransformerEncoderLayer's own ops (residual adds, its functional
    ReLU) are named by the op, not by the container's class."""
    from mobilebuild.worker import reproducible

    source = support.encoder_source(tmp_path)
    config = stages.LayersConfig(method=support.method("pt2e"), precision="int8", inputs=support.TOKENS_AND_MASK,
                                 samples=4, seed=0, top=40, options={}, mode=mode, calibration=support.CALIBRATION,
                                 **source)
    with reproducible.plain_attention():  # as every stage runs (reproducible.stage_session)
        result = support.run_layers(tmp_path, config, {})

    support.assert_real(result)
    assert "not_compared" not in result, result["not_compared"]
    found = {(row["name"], row["op"]) for row in result["layers"]}
    assert ("encoder.layers.0.self_attn", "MultiheadAttention") in found, found
    assert {"encoder.layers.0.linear1", "encoder.layers.0.linear2", "head"} <= {name for name, _ in found}
    assert not any(name == "encoder" or op.startswith("Transformer") for name, op in found), found
    if mode == "static":
        assert {("encoder.layers.0", "add #1"), ("encoder.layers.0", "add #2")} <= found, found
