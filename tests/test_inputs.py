"""Typed inputs: example data of the input's dtype (token ids within their range, floats from their distribution),
through every host-runnable route."""

import json
import textwrap

import pytest
import torch
from conftest import tiny_recipe

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.torchscript.worker import optimize
from mobilebuild.worker.stages import modeling, quantize

TEXT = textwrap.dedent('''
    import torch
    from torch import nn


    class TextClassifier(nn.Module):
        """Token ids in, class scores out: an embedding averaged over the sequence, then two linear layers."""

        def __init__(self, vocabulary=100, width=32, classes=4):
            super().__init__()
            self.embedding = nn.Embedding(vocabulary, width)
            self.hidden = nn.Linear(width, width)
            self.head = nn.Linear(width, classes)

        def forward(self, ids):
            return self.head(torch.relu(self.hidden(self.embedding(ids).mean(dim=1))))


    def make():
        return TextClassifier()
''')


def spec(dtype, shape=(2, 64), **extra):
    return {"name": "input", "shape": list(shape), "dtype": dtype, "memory_format": "contiguous", **extra}


def example(input_spec, seed=0):
    """The one input's example tensor."""
    return modeling.example_inputs([input_spec], seed=seed)[0]


def test_integer_inputs_stay_in_their_range_and_are_seeded():
    ids = example(spec("int64", range=[5, 9]), seed=3)
    assert ids.dtype == torch.int64 and 5 <= ids.min() and ids.max() < 9
    assert set(ids.unique().tolist()) == {5, 6, 7, 8}
    assert torch.equal(ids, example(spec("int64", range=[5, 9]), seed=3))
    assert not torch.equal(ids, example(spec("int64", range=[5, 9]), seed=4))
    pixels = example(spec("uint8"))
    assert pixels.dtype == torch.uint8 and pixels.max() > 200  # a byte's whole range by default
    assert example(spec("bool")).dtype == torch.bool
    assert example(spec("int32", range=[0, 2])).dtype == torch.int32


def test_float_inputs_draw_from_their_distribution():
    default = example(spec("float32"), seed=1)
    assert torch.equal(default, torch.randn([2, 64], generator=torch.Generator().manual_seed(1)))  # as before
    uniform = example(spec("float32", distribution={"uniform": {"low": 0.0, "high": 1.0}}))
    assert 0.0 <= uniform.min() and uniform.max() < 1.0
    shifted = example(spec("float32", shape=(64, 64), distribution={"normal": {"mean": 10, "std": 0.5}}))
    assert 9.5 < shifted.mean() < 10.5 and 0.4 < shifted.std() < 0.6
    assert example(spec("float16")).dtype == torch.float16


def test_a_bundled_integer_input_is_inflated_within_its_range():
    bundled = optimize.bundled_input(spec("int64", shape=(1, 16), range=[0, 100]))
    assert bundled.value.dtype == torch.int64 and list(bundled.value.shape) == [1, 16]
    assert bundled.fmt == "torch.randint_like({}, 0, 100)"


def test_static_eager_quantization_of_token_ids_says_to_use_dynamic(tmp_path):
    namespace = {}
    exec(TEXT, namespace)  # noqa: S102 - the test's own model source
    with pytest.raises(MobileBuildError, match=r"takes input \[1, 16\] int64: use quantize.mode: dynamic"):
        quantize.static(namespace["make"](), "qnnpack", [], specs=[spec("int64", shape=(1, 16), range=[0, 100])])


@pytest.mark.slow
def test_a_text_classifier_on_token_ids_builds_for_every_host_route(project):
    (project.root / "textnet.py").write_text(TEXT)
    targets = [{"backend": "xnnpack"}, {"backend": "qnnpack"},
               {"backend": "xnnpack", "runtime": "executorch", "name": "et"},
               {"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "name": "et-int8",
                "quantize": {"mode": "static"}},
               {"backend": "onnx"}, {"backend": "onnx", "precision": "int8", "name": "onnx-int8",
                                     "quantize": {"mode": "static"}}]
    project.write_recipe(tiny_recipe(model={"factory": "textnet:make", "seed": 0},
                                     input={"shape": [1, 16], "dtype": "int64", "range": [0, 100]},
                                     quantize={"mode": "dynamic",
                                               "calibration": {"source": "random", "batches": 8, "seed": 0}},
                                     targets=targets))
    result = project.run()
    assert result.returncode == 0, result.stdout + result.stderr
    for target in [t.get("name", t["backend"]) for t in targets]:
        verification = json.loads(project.artifact(f"tiny/verify-{target}.json").read_text())
        assert verification["status"] == "passed", (target, verification)
        assert verification["metrics"]["top1_agreement"] == 1.0
        benchmark = json.loads(project.artifact(f"tiny/bench-{target}.json").read_text())
        assert benchmark["status"] == "ran", (target, benchmark)
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    assert {t["target"]: t["quantization"] for t in manifest["targets"]}["qnnpack"]["mode"] == "dynamic"
    assert manifest["inputs"] == [{"name": "input", "shape": [1, 16], "dtype": "int64", "range": [0, 100],
                                   "memory_format": "contiguous"}]
    assert all(t["outputs"] == [{"name": "output", "shape": [1, 4], "dtype": "float32"}] for t in manifest["targets"])


def test_a_forward_with_optional_masks_gets_its_bundled_input():
    """A Transformer encoder's forward takes masks after the input: they are bundled as None (it crashed)."""
    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16, batch_first=True, dropout=0.0)
    scripted = torch.jit.script(torch.nn.TransformerEncoder(layer, num_layers=1).eval())
    options = {"blocklist": [], "preserved_methods": [], "bundled_inputs": True}
    optimized = optimize.optimize(scripted, options, "script", [spec("float32", shape=(1, 4, 8))])
    (inputs,) = optimized.get_all_bundled_inputs()
    assert list(inputs[0].shape) == [1, 4, 8] and inputs[1:] == (None, None, None)
    assert optimized(*inputs).shape == (1, 4, 8)


ENCODER = textwrap.dedent('''
    from torch import nn


    def make():
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True, dropout=0.0)
        return nn.TransformerEncoder(layer, num_layers=2)
''')


@pytest.mark.slow
def test_a_transformer_encoder_builds_for_every_host_route(project):
    """Eager Transformer layers take torch's fused attention fast path: exported, it was an operator ExecuTorch
    lacks (a flood of native log lines, then "Missing operator"), and dynamic quantization failed in its checks."""
    (project.root / "encoder.py").write_text(ENCODER)
    targets = [{"backend": "xnnpack"}, {"backend": "qnnpack"},
               {"backend": "xnnpack", "runtime": "executorch", "name": "et"}, {"backend": "onnx"}]
    project.write_recipe(tiny_recipe(model={"factory": "encoder:make", "seed": 0}, input={"shape": [1, 16, 32]},
                                     quantize={"mode": "dynamic"}, targets=targets))
    result = project.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "operator_registry" not in result.stdout + result.stderr
    for target in [t.get("name", t["backend"]) for t in targets]:
        verification = json.loads(project.artifact(f"tiny/verify-{target}.json").read_text())
        assert verification["status"] == "passed", (target, verification)
