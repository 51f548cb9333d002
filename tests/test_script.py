"""The script stage (routes/torchscript/worker/script.py): where torch.jit.script fails, in compiling or in saving, the
traced model stands in when it is the eager model at every size verification checks, and the artifact records it."""

import pytest
import torch
from test_hub_sources import built, gpt2_recipe
from torch import nn

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.torchscript.worker import optimize, script

IMAGE = [{"name": "input", "shape": [1, 3, 64, 64], "dtype": "float32", "memory_format": "contiguous"}]


@pytest.mark.slow  # about 12 s here: compiling MobileViTv2 before the save fails
def test_timm_mobilevitv2_fails_in_torch_jit_save_and_is_traced_instead(tmp_path, capsys):
    import timm

    model = timm.create_model("mobilevitv2_050", num_classes=10).eval()
    data, record = script.saved(model, "script", IMAGE)
    assert record["made_by"] == "torch.jit.trace" and "Could not export Python function call" in record["why"]
    assert record["checked_sqnr_db"]["example"] > script.FALLBACK_SQNR_DB
    said = capsys.readouterr().out
    assert said.startswith("   note: torch.jit.script failed (") and "traced instead" in said
    assert "TracerWarning" not in said
    (tmp_path / "s.pt").write_bytes(data)
    assert script.record_of(tmp_path / "s.pt") == record
    carried = {script.RECORD: ""}
    scripted = torch.jit.load(tmp_path / "s.pt", _extra_files=carried)
    mobile = optimize.optimize(scripted, {"blocklist": [], "preserved_methods": [], "bundled_inputs": False},
                               "trace", IMAGE)._save_to_buffer_for_lite_interpreter(_extra_files=carried)
    (tmp_path / "s.ptl").write_bytes(mobile)
    assert script.record_of(tmp_path / "s.ptl") == record  # the .ptl carries it to verify and the report


def test_a_transformers_model_with_a_dynamic_sequence_is_traced_and_checked_at_each_size(tmp_path):
    loaded = gpt2_recipe(tmp_path)
    _, record = script.saved(built(loaded), "script", loaded.inputs)
    assert set(record["checked_sqnr_db"]) == {"min", "example", "max"}
    assert record["why"].startswith("torch.jit.script failed (") and " at 0x" not in record["why"]  # reproducible


class SizedByPython(nn.Module):
    """Fails to script (**kwargs); its trace records the sequence length as a constant."""

    def forward(self, x, **kwargs):
        return x + torch.arange(int(x.shape[1]), dtype=x.dtype)


def test_a_trace_that_recorded_the_example_size_does_not_stand_in_for_the_scripted_model():
    specs = [{"name": "x", "shape": [1, 8], "dtype": "float32", "memory_format": "contiguous",
              "dynamic": [{"axis": 1, "min": 2, "max": 16, "example": 8}]}]
    with pytest.raises(MobileBuildError) as caught:
        script.saved(SizedByPython(), "script", specs)
    message = str(caught.value)
    assert message.startswith("script: torch.jit.script failed (") and "\n" not in message
    assert "the traced model, is not the eager model at the min sizes" in message
    assert "set `script: trace`, which builds for the example's sizes only" in message
    data, record = script.saved(SizedByPython(), "script", [{**specs[0], "dynamic": []}])
    assert record["checked_sqnr_db"] == {"example": 300.0}


def test_a_model_that_scripts_has_no_record():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval()
    specs = [{"name": "x", "shape": [1, 4], "dtype": "float32", "memory_format": "contiguous"}]
    data, record = script.saved(model, "script", specs)
    assert record is None and data.startswith(b"PK")


class ScaledByItsInput(nn.Module):
    """Fails to script (**kwargs); its trace keeps the scale of the input it ran on."""

    def forward(self, x, **kwargs):
        return x / float(x.abs().max())


def test_a_trace_that_kept_a_value_of_its_input_is_refused_without_advising_trace():
    specs = [{"name": "x", "shape": [1, 8], "dtype": "float32", "memory_format": "contiguous"}]
    with pytest.raises(MobileBuildError) as caught:
        script.saved(ScaledByItsInput(), "script", specs)
    message = str(caught.value)
    assert "the traced model, is not the eager model (" in message and "kept a branch or a value" in message
    assert "script: trace" not in message
