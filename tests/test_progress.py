"""Progress notes of long stages: on stderr, under their task's name, in the order the work happens."""

import pytest
from conftest import tiny_recipe

from mobilebuild.worker import progress

pytestmark = pytest.mark.slow  # real builds, ExecuTorch lowering included

TARGETS = [{"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "name": "et-int8"},
           {"backend": "onnx", "precision": "int8", "name": "onnx-int8"}]


def notes(stderr, task):
    prefix = f"   {task}: "
    return [line[len(prefix):] for line in stderr.splitlines() if line.startswith(prefix)]


def test_lowering_export_and_benchmarks_say_what_they_are_doing(project):
    project.write_recipe(tiny_recipe(targets=TARGETS))
    result = project.run("lower:tiny-et-int8", "onnx:tiny-onnx-int8", "bench:tiny-et-int8",
                         env={"MOBILEBUILD_CACHE": "off"})
    assert result.returncode == 0, result.stderr
    assert notes(result.stderr, "bench:tiny-et-int8")[-1] == "5/5 iterations"
    assert notes(result.stderr, "lower:tiny-et-int8") == [
        "quantizing, calibrated on 16 batches", "torch.export", "lowering to XNNPACK", "writing the ExecuTorch program"]
    assert notes(result.stderr, "onnx:tiny-onnx-int8") == [
        "torch.onnx.export", "quantizing with ONNX Runtime's quantize_static"]


def test_outside_a_build_nothing_is_noted(capfd):
    progress.note("torch.export")
    with progress.working_on("lower:x"):
        progress.note("lowering to XNNPACK")
    progress.note("writing the ExecuTorch program")
    assert capfd.readouterr().err == "   lower:x: lowering to XNNPACK\n"


def test_a_long_call_is_noted_every_period_with_its_seconds(capfd):
    import time

    with progress.working_on("lm_lower:x"), progress.while_running("lowering", seconds=0.2):
        time.sleep(0.5)
    lines = capfd.readouterr().err.splitlines()
    assert lines[:2] == ["   lm_lower:x: lowering (0 s)", "   lm_lower:x: lowering (0 s)"]
