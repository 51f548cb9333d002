"""What the per-layer comparison's tests share (tests/test_layers*.py): the deliberately broken model, its
settings, and running the layers stage on them."""

import json

from tiny_models import broken_conv, stored_fused

from mobilebuild.plan import stages
from mobilebuild.worker.stages import fuse, layers

INPUTS = [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]
CALIBRATION = {"source": "random", "batches": 8, "seed": 0}
BROKEN = "features.2"  # fused with its ReLU: features.2 is the ConvReLU2d
TOKENS_AND_MASK = [{"name": name, "shape": [1, 16], "dtype": "int64", "range": [0, high],
                    "memory_format": "contiguous", "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}
                   for name, high in (("ids", 100), ("mask", 2))]


METHODS = {"eager": "mobilebuild.worker.layers.eager", "pt2e": "mobilebuild.routes.executorch.worker.layers",
           "onnx": "mobilebuild.routes.onnx.worker.layers"}


def method(route):
    """The worker-side module the planner names for a route: eager, pt2e, onnx."""
    return METHODS[route]


def fused_model(tmp_path):
    """The broken model fused as the fuse stage stores it, and the settings the later stages rebuild it from."""
    fused, _ = fuse.fuse(broken_conv(), "auto")
    return stored_fused(fused, tmp_path / "fused.pt", factory="tiny_models:broken_conv")


def layers_config(route, source, **extra):
    return stages.LayersConfig(method=method(route), precision="int8", inputs=INPUTS, samples=4, seed=0,
                               evaluation=None, calibration=CALIBRATION, **source, **{"top": 5, **extra})


def run_layers(tmp_path, config, inputs):
    output = tmp_path / f"layers-{config.method.rpartition('.')[2]}.json"
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


def encoder_source(tmp_path):
    from tiny_models import tiny_encoder

    return stored_fused(tiny_encoder(), tmp_path / "fused.pt", factory="tiny_models:tiny_encoder")


def assert_real(result):
    assert result["layers"], result
    assert all(0 < row["sqnr_db"] < 100 for row in result["layers"]), result["layers"]
    for row in result.get("not_compared", []):
        assert row["reason"] and "sqnr_db" not in row, row
