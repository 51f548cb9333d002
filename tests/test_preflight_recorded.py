"""`mobilebuild check` after a build takes what was recorded instead of computing it again: the build's verify result
(what ExecuTorch delegated, and that verify ran those very bytes on this host) and an earlier check's structure
analysis of the same model. Fast: the records themselves; slow: a real build, then checks in processes of their own
that import neither ExecuTorch's exir nor torchvision (the second not even torch), with the same findings as a check
that recomputes everything."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml
from conftest import Project

from mobilebuild import preflight, store
from mobilebuild.plan import graph, recipe
from mobilebuild.preflight import recorded, structure, verification
from mobilebuild.worker.stages import verify

MODEL = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        """`+` on quantized tensors: eager mode cannot quantize it (FX graph mode does); cumsum: outside XNNPACK."""

        def __init__(self):
            super().__init__()
            self.left = nn.Conv2d(3, 8, 1)
            self.right = nn.Conv2d(3, 8, 1)
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.left(x) + self.right(x))
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1)).cumsum(1)


    def make():
        return Net()
''')

TARGETS = [{"backend": "xnnpack"}, {"backend": "qnnpack"}, {"backend": "xnnpack", "runtime": "executorch"},
           {"backend": "onnx"}]


def write(root, name="reuse", **settings):
    recipe = {"name": name, "model": {"factory": "reuse_net:make"}, "input": {"shape": [1, 3, 8, 8]},
              "quantize": {"calibration": {"source": "random", "batches": 2, "seed": 0}},
              "verify": {"samples": 2, "layers": False, "thresholds": {"int8": {"sqnr_db": 0, "cosine": 0,
                                                                               "max_rel_error": 10}}},
              "benchmark": {"warmup": 1, "iters": 2}, "targets": TARGETS, **settings}
    (root / "reuse_net.py").write_text(MODEL)
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path.relative_to(root).as_posix()


# --- the records (fast) -----------------------------------------------------------------------------------------


def test_a_verify_result_counts_for_the_bytes_it_names(tmp_path):
    artifact, result = tmp_path / "a.ptl", tmp_path / "verify.json"
    artifact.write_bytes(b"program")
    result.write_text(json.dumps({"artifact_sha256": store.sha256_file(artifact), "status": "passed"}))
    assert recorded.verify_result(result, artifact, current=False)["status"] == "passed"
    artifact.write_bytes(b"another program")
    assert recorded.verify_result(result, artifact, current=False) is None
    # doit found verify and the artifact's task up to date: it has compared the file with what verify read
    assert recorded.verify_result(result, tmp_path / "not hashed", current=True)["status"] == "passed"
    assert recorded.verify_result(tmp_path / "missing.json", artifact, current=True) is None


def test_the_outcome_line_says_what_verify_found():
    result = {"status": "failed", "samples": 16, "data": "random", "relaxed": [], "metrics": {"sqnr_db": 12.345},
              "failures": ["sqnr_db 12.35 < 15", "cosine 0.9 < 0.98"]}
    assert recorded.outcome_line(result) == "failed on 16 random inputs, SQNR 12.3 dB, sqnr_db 12.35 < 15 and 1 more"


def test_the_structure_is_analysed_once_per_model_and_fusion(tmp_path, no_build, monkeypatch):
    project = Project(tmp_path)
    path = write(project.root)
    calls = []
    analyse = structure.analyse
    monkeypatch.setattr(structure, "analyse", lambda *args: calls.append(1) or analyse(*args))

    first = preflight.run(path, project.root)
    second = preflight.run(path, project.root)
    assert len(calls) == 1 and not first["model"]["cached"] and second["model"]["cached"]
    assert [result["findings"] for result in first["targets"]] == [result["findings"] for result in second["targets"]]
    assert first["model"]["findings"] == second["model"]["findings"]

    write(project.root, fuse=False)  # what the analysis reads changed: analysed again
    assert not preflight.run(path, project.root)["model"]["cached"] and len(calls) == 2
    (project.root / "reuse_net.py").write_text(MODEL + "\n# the factory's source changed\n")
    assert not preflight.run(path, project.root)["model"]["cached"] and len(calls) == 3


def test_a_record_that_cannot_be_read_is_computed_again(tmp_path, no_build):
    project = Project(tmp_path)
    path = write(project.root)
    preflight.run(path, project.root)
    (project.root / recorded.CHECK_DIR / "reuse.json").write_text("{not json")
    assert not preflight.run(path, project.root)["model"]["cached"]
    assert preflight.run(path, project.root)["model"]["cached"]


DATA = "import torch\n\n\ndef data():\n    return torch.randn(4, 3, 8, 8)\n"


def test_the_recipe_s_verify_checks_run_once_per_recipe_and_are_recalled_until_what_they_read_changes(
        tmp_path, monkeypatch):
    """verify's evaluation data and output names, for every target verify runs: once, whatever the targets (their
    verify settings differ in what these checks do not read), then from the record."""
    project = Project(tmp_path)
    (project.root / "reuse_data.py").write_text(DATA)
    settings = {"samples": 2, "evaluation": {"function": "reuse_data:data"}}
    path = write(project.root, verify=settings)
    calls = []
    evaluation_data = verify.evaluation_data
    monkeypatch.setattr(verify, "evaluation_data", lambda config: calls.append(1) or evaluation_data(config))

    def problems():
        loaded = recipe.load(path, project.root)
        checks = verification.RecipeVerification(project.root, ["output"], recorded.Memory(project.root, loaded.name))
        return {node.task_name: checks.problem(node) for node in graph.recipe_nodes(loaded, project.root)
                if node.stage == "verify"}

    assert set(problems().values()) == {None} and len(calls) == 1  # four targets, fp32 and int8
    assert set(problems().values()) == {None} and len(calls) == 1  # recalled

    write(project.root, verify=settings, outputs=["scores", "embedding"])
    found = problems()
    assert len(calls) == 2 and found["verify:reuse-onnx"] == verification.Problem(
        "verify:reuse-onnx", "recipes/reuse.yaml: outputs: 2 output names for 1 output tensor(s) (output)", True)
    (project.root / "reuse_data.py").write_text(DATA.replace("(4,", "(4, 3, 8, 8), torch.zeros(3) #"))
    monkeypatch.delitem(sys.modules, "reuse_data")  # as a check of its own process imports it
    found = problems()  # the data first, as verify takes it
    assert len(calls) == 3 and found["verify:reuse-xnnpack"] == verification.Problem(
        "verify:reuse-xnnpack", "recipes/reuse.yaml: verify.evaluation.function: expected one label per input (4), "
        "got a Tensor of shape [3]", False)


# --- after a real build (slow) ----------------------------------------------------------------------------------

CHECK = textwrap.dedent('''
    import json, sys
    from mobilebuild.preflight import whole_recipe
    report = whole_recipe.run(sys.argv[1], ".")
    imported = {name: name in sys.modules for name in ("torch", "torchvision", "executorch.exir", "torch._dynamo")}
    print("REPORT " + json.dumps({"report": report, "imported": imported}))
''')


def check_in_a_process(root, recipe_path, env=None):
    done = subprocess.run([sys.executable, "-c", CHECK, recipe_path], cwd=root, capture_output=True, text=True,
                          timeout=600, env={**os.environ, **(env or {})})
    line = next((line for line in done.stdout.splitlines() if line.startswith("REPORT ")), None)
    assert line is not None, done.stdout + done.stderr
    found = json.loads(line.removeprefix("REPORT "))
    return found["report"], found["imported"]


def findings(report):
    return {result["target"]: result["findings"] for result in report["targets"]}


@pytest.mark.slow
def test_a_check_after_a_build_takes_the_build_s_records_and_agrees_with_a_full_check(tmp_path, poisoned_torch):
    project = Project(tmp_path)
    path = write(project.root)
    built = project.run("reuse")
    assert built.returncode == 0, built.stdout + built.stderr
    verified = {target: json.loads((project.root / f"artifacts/reuse/verify-{target}.json").read_text())
                for target in ("xnnpack", "qnnpack", "xnnpack-executorch", "onnx")}

    first, imported = check_in_a_process(project.root, path)
    assert not imported["executorch.exir"]  # the .pte is not read again (the structure is analysed: torch)
    assert first["exit_code"] == 0 and {result["made"] for result in first["targets"]} == {"up to date"}
    for result in first["targets"]:  # the build's verify ran each of them here: its outcome stands
        assert result["host_run"] == {"by": "verify", "status": verified[result["target"]]["status"]}
    executorch = next(result for result in first["targets"] if result["target"] == "xnnpack-executorch")
    assert executorch["delegation"] == verified["xnnpack-executorch"]["artifact"]["delegation"]
    assert [item["where"] for item in executorch["findings"]] == ["aten::cumsum.out"]

    # the second: the structure and the FX note an earlier check found; torch is never imported (it cannot be)
    second, imported = check_in_a_process(project.root, path, env={
        "PYTHONPATH": os.pathsep.join(filter(None, [poisoned_torch["PYTHONPATH"], os.environ.get("PYTHONPATH")]))})
    assert second["model"]["cached"] and not any(imported.values())
    assert findings(second) == findings(first) and second["model"]["findings"] == first["model"]["findings"]
    assert [result["notes"] for result in second["targets"]] == [result["notes"] for result in first["targets"]]
    qnnpack = next(result for result in second["targets"] if result["target"] == "qnnpack")
    assert any(note.startswith("int8: eager mode cannot quantize the model") for note in qnnpack["notes"])

    # a check that has nothing recorded to take runs every artifact and reads the program: the same findings
    for target in verified:
        (project.root / f"artifacts/reuse/verify-{target}.json").unlink()
    (project.root / recorded.CHECK_DIR / "reuse.json").unlink()
    full, imported = check_in_a_process(project.root, path)
    assert imported["executorch.exir"] and not full["model"]["cached"]
    assert {result["host_run"]["by"] for result in full["targets"]} == {"check"}
    assert findings(full) == findings(first) and full["exit_code"] == first["exit_code"]


@pytest.mark.slow
def test_an_artifact_rebuilt_after_its_verify_runs_on_the_host_again(tmp_path):
    project = Project(tmp_path)
    path = write(project.root)
    assert project.run("reuse").returncode == 0
    data = yaml.safe_load((project.root / path).read_text())
    data["targets"][0]["optimize"] = {"bundled_inputs": False}  # other bytes for the xnnpack target alone
    (project.root / path).write_text(yaml.safe_dump(data, sort_keys=False))
    report, _ = check_in_a_process(project.root, path)
    by_target = {result["target"]: result for result in report["targets"]}
    assert by_target["xnnpack"]["made"] == "built" and by_target["xnnpack"]["host_run"] == {"by": "check"}
    assert by_target["onnx"]["host_run"]["by"] == "verify"
