"""What models from outside tripped on (issue 39): a transformers model from a factory with its cache on, an
embedding on eager static int8, FX graph mode failing on transformers' forward, and error lines that blamed
another cause than the library's."""

import json
import textwrap

import pytest
import torch
from tiny_models import HOST_TARGETS
from torch import nn
from torch.ao import quantization as tq

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.onnx.worker import export
from mobilebuild.worker import hub
from mobilebuild.worker.stages import fx_quantize, modeling, quantize

FACTORIES = textwrap.dedent('''
    from transformers import GPT2Config, GPT2LMHeadModel, WhisperConfig, WhisperModel


    def gpt2():
        """GPT-2 as its configuration comes: use_cache on."""
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=64))


    def whisper_encoder():
        """Whisper's encoder: its positions an nn.Embedding whose weight forward adds to the features."""
        config = WhisperConfig(num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=2,
                               decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
                               max_source_positions=32, max_target_positions=16, vocab_size=100, pad_token_id=0,
                               bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        return WhisperModel(config).get_encoder()
''')


@pytest.fixture
def factories(tmp_path, monkeypatch):
    (tmp_path / "outside_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_factorys_transformers_model_gets_its_cache_off_with_a_note(factories, capsys):
    model = modeling.build_model({"factory": "outside_factories:gpt2"}, seed=0, notes=True)
    assert model.config.use_cache is False
    output = model(torch.randint(0, 1000, (1, 8)))
    assert output.past_key_values is None
    assert "turned off" in capsys.readouterr().out
    # an encoder's configuration may say use_cache; its forward takes none: no note
    encoder = modeling.build_model({"factory": "outside_factories:whisper_encoder"}, seed=0, notes=True)
    assert not hub.single_pass(encoder)
    assert "use_cache" not in capsys.readouterr().out


class EagerWithPositions(nn.Module):
    """Written for eager mode (its own stubs), adding an embedding's weight as Whisper's encoder does."""

    def __init__(self):
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.positions = nn.Embedding(16, 8)

    def forward(self, x):
        return self.dequant(self.conv(self.quant(x))).transpose(1, 2) + self.positions.weight


def test_eager_static_int8_keeps_embeddings_float_with_a_note():
    specs = [{"name": "x", "shape": [1, 4, 16], "dtype": "float32", "memory_format": "contiguous"}]
    model = EagerWithPositions().eval()
    quantized, note = quantize.static_any(
        model, "qnnpack", lambda: [modeling.example_inputs(specs, seed=seed) for seed in range(2)], None,
        "quantize.calibration", specs)
    assert "keeps embeddings float: positions" in note
    assert type(quantized.positions) is nn.Embedding
    assert type(quantized.conv).__module__.startswith("torch.ao.nn.quantized")
    torch.testing.assert_close(quantized(*modeling.example_inputs(specs)), model(*modeling.example_inputs(specs)),
                               atol=0.1, rtol=0.1)


class ControlFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) if x.sum() > 0 else -self.linear(x)


def test_fx_advises_on_control_flow_only_where_the_tracer_reported_it(factories):
    specs = [{"name": "x", "shape": [1, 4], "dtype": "float32", "memory_format": "contiguous"}]
    with pytest.raises(fx_quantize.Untraceable, match="Python control flow"):
        fx_quantize.prepared(ControlFlow(), "qnnpack", specs)
    gpt2 = modeling.build_model({"factory": "outside_factories:gpt2"}, seed=0)
    tokens = [{"name": "input_ids", "shape": [1, 8], "dtype": "int64", "memory_format": "contiguous",
               "range": [0, 1000]}]
    with pytest.raises(fx_quantize.Untraceable) as caught:
        fx_quantize.prepared(gpt2, "qnnpack", tokens)
    assert "control flow" not in caught.value.message
    assert "quantize.mode: dynamic, which does not trace it" in caught.value.message
    # the quantize stage quantizes it dynamically instead, and says so; a model without Linear layers keeps the error
    quantized, note = quantize.dynamic_instead(gpt2, "qnnpack", None, (), caught.value)
    assert "quantized dynamically instead" in note and caught.value.reason in note
    assert any(type(module).__module__.startswith("torch.ao.nn.quantized.dynamic") for module in quantized.modules())
    with pytest.raises(fx_quantize.Untraceable):
        quantize.dynamic_instead(nn.Sequential(nn.Conv2d(1, 1, 1)), "qnnpack", None, (), caught.value)


class ImageAndMeta(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.meta = nn.Linear(4, 4)

    def forward(self, image, meta):
        return torch.cat([self.image(image), self.meta(meta)], dim=1)


def test_onnx_names_a_failure_after_the_capture_as_such_not_a_missing_translation():
    """The model that produced the line (captured as it is, without the capture root the stages use): its `meta`
    clashes in the exporter's decompositions, which the line once called a missing ONNX translation."""
    specs = [{"name": "image", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"},
             {"name": "meta", "shape": [1, 4], "dtype": "float32", "memory_format": "contiguous"}]
    with pytest.raises(MobileBuildError, match="failed on the graph torch.export captured") as caught:
        export.export_float(ImageAndMeta().eval(), specs)
    assert "no ONNX translation" not in caught.value.message


@pytest.mark.slow
def test_gpt2_from_a_factory_and_whispers_encoder_build_their_targets(project, factories):
    """GPT-2 with its default configuration on every single-pass host target; Whisper's encoder on qnnpack; no
    library's log lines on the console."""
    (project.root / "outside_factories.py").write_text(FACTORIES)
    targets = HOST_TARGETS
    benchmark = {"warmup": 1, "iters": 2}
    project.write_recipe({"name": "gpt2", "model": {"factory": "outside_factories:gpt2"},
                          "inputs": [{"name": "input_ids", "shape": [1, 16], "dtype": "int64", "range": [0, 1000]}],
                          "benchmark": benchmark, "targets": targets})
    project.write_recipe({"name": "whisper", "model": {"factory": "outside_factories:whisper_encoder"},
                          "input": {"shape": [1, 16, 64], "memory_format": "contiguous"},
                          "benchmark": benchmark, "targets": [{"backend": "qnnpack"}]})
    result = project.run("-n", "2")
    console = result.stdout + result.stderr
    assert result.returncode == 0, console
    for noise in ("_pytree.py", "[transformers]", "FutureWarning", "WARNING:root", "[W"):
        assert noise not in console, noise
    assert "use_cache): turned off" in console and "quantized dynamically instead" in console
    # how qnnpack's int8 was made travels in the .ptl's record to the report
    assert "int8 dynamic, as eager mode cannot quantize it" in project.artifact("report.md").read_text()
    built = [("gpt2", target.get("name", target["backend"])) for target in targets] + [("whisper", "qnnpack")]
    for recipe, name in built:
        verdict = json.loads(project.artifact(f"{recipe}/verify-{name}.json").read_text())
        assert verdict["status"] == "passed", (recipe, name, verdict.get("reason"))
