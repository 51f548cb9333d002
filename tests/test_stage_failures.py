"""A library failing on a model inside a stage is one line naming the task, the library, the model part and the
library's own first line, with the traceback in a log; only a bug of mobilebuild's prints a traceback."""

import json
import textwrap

import pytest
from conftest import REPO

from mobilebuild.engine import execute, worker_pool
from mobilebuild.plan import stages
from mobilebuild.worker import failures

# A convolution with circular padding, written for eager mode, which torch's quantized convolution refuses on
# conversion ("'padding_mode' circular is not supported by quantized convolution"); and a module whose forward
# calls a method TorchScript was told to ignore: it scripts, but torch.jit.save refuses it (MobileViTv2's
# _forward_cross_attn)
MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Circular(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.wrap = nn.Conv2d(3, 8, 3, padding=1, padding_mode="circular")
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x):
            return self.dequant(self.wrap(self.quant(x)))


    class CrossAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        @torch.jit.ignore
        def _forward_cross_attn(self, x):  # a value of its input, which a trace would keep: no traced fallback
            return x * 2 + float(x.mean())

        def forward(self, x):
            return self._forward_cross_attn(self.proj(x))


    class Ignoring(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = CrossAttention()
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.attn(x))


    def circular():
        return Circular()


    def ignoring():
        return Ignoring()


    def broken_forward():
        return nn.Sequential(nn.Linear(8, 4), nn.Linear(5, 3))
''')

CIRCULAR = {"name": "circ", "model": {"factory": "failing:circular"}, "input": {"shape": [1, 3, 8, 8]},
            "quantize": {"calibration": {"batches": 2}}, "targets": [{"backend": "qnnpack"}]}
IGNORING = {"name": "ign", "model": {"factory": "failing:ignoring"}, "input": {"shape": [1, 8]}, "script": "script",
            "targets": [{"backend": "xnnpack"}]}


# --- who raised it -------------------------------------------------------------------------------------------------

def _raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - whatever it is, it is what the test looks at
        return exc
    raise AssertionError("it did not raise")


def test_an_exception_raised_inside_a_library_is_the_librarys():
    import torch

    exc = _raised(lambda: torch.nn.Linear(3, 4)(torch.zeros(2, 5)))  # in torch/nn/modules/linear.py
    assert failures.raised_by(exc) == "torch"


def test_an_exception_raised_in_mobilebuilds_own_code_is_a_bug():
    from mobilebuild.plan import recipe

    exc = _raised(lambda: recipe.field_path(None))  # our code, handed what it never gets
    assert failures.raised_by(exc) is None
    assert failures.library_failure(exc) is None


def _raised_in_mobilebuild(expression, **names):
    """The exception of `expression`, evaluated in a frame whose file lies in the mobilebuild package."""
    code = compile(expression, str(failures.PACKAGE / "engine" / "calling.py"), "eval")
    return _raised(lambda: eval(code, names))


def test_a_wrong_call_into_a_library_is_ours_and_standard_library_frames_do_not_decide():
    """A keyword a library function does not take fails in the caller's frame, before the library runs; json raises
    from the standard library, which is passed over to the frame that called it; what fails inside the library's
    own code is the library's, whoever called it."""
    import torch

    assert failures.raised_by(_raised_in_mobilebuild("torch.zeros(2, no_such_keyword=1)", torch=torch)) is None
    assert failures.raised_by(_raised_in_mobilebuild("json.loads('{')", json=json)) is None
    assert failures.raised_by(_raised_in_mobilebuild("torch.nn.Linear(3, 4)(torch.zeros(2, 5))",
                                                     torch=torch)) == "torch"


def test_the_models_own_code_is_named_by_its_file(tmp_path, monkeypatch):
    (tmp_path / "usermodel.py").write_text("def forward():\n    raise ValueError('the model says no')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import usermodel

    failure = failures.library_failure(_raised(usermodel.forward))
    assert failure["raised_by"] == "usermodel.py"
    assert failure["error"] == "ValueError: the model says no"
    assert "Traceback" in failure["traceback"]


def test_the_model_part_is_the_module_the_failing_frames_worked_on():
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(8, 4), nn.Sequential(nn.ReLU(), nn.Linear(5, 3)))
    failure = failures.library_failure(_raised(lambda: model(torch.zeros(1, 8))))
    assert failure["raised_by"] == "torch"
    assert failure["part"] == "1.1 (Linear)"
    assert failure["error"].startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")


# --- through a stage worker ----------------------------------------------------------------------------------------

def _script_request(tmp_path, dtype="float32"):
    """The script stage's request for the Ignoring model, its fused weights at tmp_path/fused.pt."""
    import torch

    from mobilebuild.routes.torchscript import plan as torchscript

    (tmp_path / "failing.py").write_text(MODELS)
    namespace = {}
    exec(compile(MODELS, "failing", "exec"), namespace)
    torch.save(namespace["ignoring"]().state_dict(), tmp_path / "fused.pt")
    spec = {"name": "input", "shape": [1, 8], "dtype": dtype, "memory_format": "contiguous"}
    config = torchscript.ScriptConfig(mode="script", precision="fp32", engine=None, quantization=None,
                                      inputs=[spec], model={"factory": "failing:ignoring"}, fuse=False)
    return {"stage": "script", "module": "mobilebuild.routes.torchscript.worker.script", "measures": False,
            "config_type": stages.type_path(torchscript.ScriptConfig), "config": stages.as_json(config),
            "inputs": {"model": str(tmp_path / "fused.pt")}, "output": str(tmp_path / "scripted.pt"),
            "root": str(tmp_path), "task": "script:test"}


def test_a_worker_replies_a_librarys_failure_as_data_and_a_bug_of_ours_as_a_crash(tmp_path):
    """The same worker: a model torch.jit.save refuses, then a request our own code cannot take (an input dtype the
    recipe's schema never lets through)."""
    try:
        reply = worker_pool.call(_script_request(tmp_path))
        assert set(reply) - {"waited", "peak_rss_mb"} == {"failure", "printed"}, reply
        assert reply["failure"]["raised_by"] == "torch"
        assert reply["failure"]["error"].startswith("RuntimeError: Could not export Python function call "
                                                    "'_forward_cross_attn'.")
        assert "torch/jit/_script.py" in reply["failure"]["traceback"]
        reply = worker_pool.call(_script_request(tmp_path, dtype="complex128"))
        assert set(reply) - {"waited", "peak_rss_mb"} == {"crash", "printed"}, reply
        assert reply["crash"].startswith("Traceback") and "/mobilebuild/" in reply["crash"]
    finally:
        worker_pool.close_all()


# --- through a real build ------------------------------------------------------------------------------------------

@pytest.fixture
def failing_build(project):
    (project.root / "failing.py").write_text(MODELS)
    project.write_recipe(CIRCULAR)
    project.write_recipe(IGNORING)
    result = project.run("quantize:circ-qnnpack", "script:ign-fp32")
    return project, result


@pytest.mark.slow
def test_a_library_failing_inside_a_stage_is_one_line_with_its_traceback_in_a_log(failing_build):
    project, result = failing_build
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 2, result.stderr
    quantize = next(line for line in errors if line.startswith("ERROR: quantize:circ-qnnpack: "))
    log = project.root / ".mobilebuild/logs/quantize/circ-qnnpack.log"
    assert quantize == (
        "ERROR: quantize:circ-qnnpack: recipes/circ.yaml: torch failed at wrap (Conv2d): ValueError: "
        "'padding_mode' circular is not supported by quantized convolution "
        "(traceback: .mobilebuild/logs/quantize/circ-qnnpack.log)")
    assert "Traceback (most recent call last)" in log.read_text()
    assert "quantized/modules/conv.py" in log.read_text()
    script = next(line for line in errors if line.startswith("ERROR: script:ign-fp32: "))
    assert "recipes/ign.yaml: torch failed: RuntimeError: Could not export Python function call " \
           "'_forward_cross_attn'" in script
    assert script.endswith("(traceback: .mobilebuild/logs/script/ign-fp32.log)")
    assert "save_to_buffer" in (project.root / ".mobilebuild/logs/script/ign-fp32.log").read_text()
    # nothing half-made: no artifact, no temporary file beside it
    assert not project.artifact("circ/quantized-qnnpack.pt").exists()
    assert not project.artifact("ign/scripted-fp32.pt").exists()
    assert not [path for path in project.root.joinpath("artifacts").rglob("*") if ".partial" in path.name]


@pytest.mark.slow
def test_doit_clean_removes_a_failed_nodes_log(failing_build):
    project, _ = failing_build
    log = project.root / ".mobilebuild/logs/quantize/circ-qnnpack.log"
    assert log.exists()
    assert project.run("clean", "quantize:circ-qnnpack").returncode == 0
    assert not log.exists()
    assert (project.root / ".mobilebuild/logs/script/ign-fp32.log").exists()
    assert project.run("clean").returncode == 0
    assert not (project.root / ".mobilebuild/logs").exists()


def test_a_failed_nodes_log_lies_in_the_ignored_state_folder():
    ignored = (REPO / ".gitignore").read_text().split()
    assert execute.LOG_DIR.split("/")[0] + "/" in ignored
