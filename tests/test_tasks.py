"""The doit graph, driven by real doit: what runs, what does not, and what a failure leaves behind."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, tiny_recipe

from mobilebuild import store

pytestmark = pytest.mark.slow  # incremental builds through real doit
MOBILEBUILD = str(Path(sys.executable).with_name("mobilebuild"))

ALL_TASKS = sorted([
    "checkpoint:tiny", "fuse:tiny", "quantize:tiny-qnnpack", "script:tiny-fp32", "script:tiny-int8-qnnpack",
    "optimize:tiny-xnnpack", "optimize:tiny-qnnpack", "verify:tiny-xnnpack", "verify:tiny-qnnpack",
    "bench:tiny-eager", "bench:tiny-xnnpack", "bench:tiny-qnnpack", "layers:tiny-qnnpack", "manifest:tiny", "plot:tiny",
    "verified:tiny",
])


def test_build_then_nothing_to_do(project):
    project.write_recipe(tiny_recipe())
    assert project.doit() == ALL_TASKS
    assert project.doit() == []
    assert project.artifact("tiny/tiny-xnnpack.ptl").stat().st_size > 0


def test_touching_without_changing_rebuilds_nothing(project):
    recipe_file = project.write_recipe(tiny_recipe())
    project.doit()
    for path in [recipe_file, project.root / "tinynet.py", *project.artifact("tiny").iterdir()]:
        os.utime(path, (path.stat().st_atime + 100, path.stat().st_mtime + 100))
    assert project.doit() == []


def test_changing_calibration_rebuilds_quantize_and_what_follows_only(project):
    project.write_recipe(tiny_recipe())
    project.doit()
    changed = tiny_recipe(quantize={"calibration": {"source": "random", "batches": 24, "seed": 0}})
    project.write_recipe(changed)
    explained = project.run("info", "quantize:tiny-qnnpack").stdout  # before the build that follows
    assert "    - changed: recipes/tiny.yaml: quantize.calibration.batches: 16 -> 24 (args=[], kwargs={})" in explained
    why = subprocess.run([MOBILEBUILD, "why", "quantize:tiny-qnnpack", "fuse:tiny"], cwd=project.root,
                         capture_output=True, text=True, timeout=600)
    assert why.returncode == 0, why.stderr
    lines = why.stdout.splitlines()
    assert lines[:2] == ["quantize:tiny-qnnpack (artifacts/tiny/quantized-qnnpack.pt, from recipes/tiny.yaml): would "
                         "run, because", "  - recipes/tiny.yaml: quantize.calibration.batches: 16 -> 24"]
    assert '      quantize.calibration: {"batches": 24, "kwargs": {}, "seed": 0, "source": "random"}' in lines
    assert '      engine (derived): "qnnpack"' in lines
    assert "fuse:tiny (artifacts/tiny/fused.pt, from recipes/tiny.yaml): up to date" in lines
    assert project.doit() == ["bench:tiny-qnnpack", "layers:tiny-qnnpack", "manifest:tiny", "optimize:tiny-qnnpack",
                              "plot:tiny", "quantize:tiny-qnnpack", "script:tiny-int8-qnnpack", "verified:tiny",
                              "verify:tiny-qnnpack"]


def test_changing_one_targets_blocklist_rebuilds_that_target_alone(project):
    project.write_recipe(tiny_recipe())
    project.doit()
    targets = [{"backend": "xnnpack", "optimize": {"blocklist": ["INSERT_FOLD_PREPACK_OPS"]}}, {"backend": "qnnpack"}]
    project.write_recipe(tiny_recipe(targets=targets))
    explained = project.run("info", "optimize:tiny-xnnpack").stdout
    assert "changed: recipes/tiny.yaml: targets[0].optimize.blocklist: [] -> [\"INSERT_FOLD_PREPACK_OPS\"]" in explained
    assert project.doit() == ["bench:tiny-xnnpack", "manifest:tiny", "optimize:tiny-xnnpack", "plot:tiny",
                              "verified:tiny", "verify:tiny-xnnpack"]


def test_changing_the_factory_source_rebuilds_from_the_checkpoint(project):
    project.write_recipe(tiny_recipe())
    project.doit()
    factory = project.root / "tinynet.py"
    factory.write_text(factory.read_text() + "\n# a comment still changes the source\n")
    assert "checkpoint:tiny" in project.doit()


def test_one_chain_builds_alone(project):
    project.write_recipe(tiny_recipe())
    assert project.doit("optimize:tiny-xnnpack") == [
        "checkpoint:tiny", "fuse:tiny", "optimize:tiny-xnnpack", "script:tiny-fp32"]


def test_listing_and_up_to_date_runs_never_import_torch(project, poisoned_torch):
    project.write_recipe(tiny_recipe())
    listed = project.run("list", env=poisoned_torch)
    assert listed.returncode == 0, listed.stderr
    assert "optimize:tiny-xnnpack" in listed.stdout
    project.doit()
    idle = project.run(env=poisoned_torch)
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert idle.stdout.splitlines() == [f"all {len(ALL_TASKS) + 1} tasks up to date: nothing to do"]  # + the report
    assert "torch was imported" not in idle.stdout + idle.stderr


def test_manifest_lists_every_file_with_hash_and_size(project):
    recipe_file = project.write_recipe(tiny_recipe())
    project.doit()
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    assert manifest["recipe"] == "tiny"
    assert manifest["recipe_sha256"] == store.sha256_file(recipe_file)
    assert set(manifest["toolchain"]) >= {"python", "torch", "torchvision", "mobilebuild"}
    by_path = {entry["path"]: entry for entry in manifest["artifacts"]}
    assert set(by_path) == {p.relative_to(project.root / "artifacts").as_posix()
                            for p in project.artifact("tiny").glob("*.p*")}  # .pt, .ptl: not the JSON results
    for path, entry in by_path.items():
        assert entry["sha256"] == store.sha256_file(project.artifact(path))
        assert entry["bytes"] == project.artifact(path).stat().st_size
    assert by_path["tiny/tiny-qnnpack.ptl"]["backend"] == "qnnpack"
    assert by_path["tiny/tiny-qnnpack.ptl"]["runtime"] == "pytorch-mobile"
    assert by_path["tiny/tiny-qnnpack.ptl"]["stage"] == "optimize"
    assert [(t["target"], t["precision"], t["status"]) for t in manifest["targets"]] == [
        ("xnnpack", "fp32", "passed"), ("qnnpack", "int8", "passed")]
    assert manifest["verification"]["xnnpack"]["metrics"]["sqnr_db"] > 80
    assert manifest["verification"]["qnnpack"]["samples"] == 16
    assert set(manifest["benchmarks"]) == {"eager", "xnnpack", "qnnpack"}
    for result in manifest["benchmarks"].values():
        assert result["status"] == "ran" and result["iters"] == 5 and result["threads"] == 1
        assert 0 < result["p10_ms"] <= result["median_ms"] <= result["p90_ms"]
        assert result["peak_rss_mb"] > 0 and result["load_ms"] > 0
    assert manifest["benchmarks"]["xnnpack"]["device"]["status"] == "skipped"
    assert (project.root / "artifacts" / "report.html").is_file()


def test_a_failing_verification_fails_with_its_numbers_and_is_marked_in_the_manifest(project):
    recipe = tiny_recipe(verify={"thresholds": {"int8": {"sqnr_db": 200}}})
    project.write_recipe(recipe)
    result = project.run()
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("ERROR: verified:tiny: recipes/tiny.yaml: qnnpack: verification failed: sqnr_db ")
    assert "< 200 (thresholds: verify.thresholds.int8)" in errors[0]
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    assert {t["target"]: t["status"] for t in manifest["targets"]} == {"xnnpack": "passed", "qnnpack": "failed"}
    assert manifest["verification"]["qnnpack"]["failures"][0].startswith("sqnr_db ")
    assert "FAILED" in (project.root / "artifacts" / "report.md").read_text()
    # nothing is rebuilt or re-measured, and the build keeps failing until the recipe changes
    again = project.run("-r", "json")
    assert again.returncode != 0
    ran = [t["name"] for t in json.loads(again.stdout)["tasks"] if t["result"] != "up-to-date" and ":" in t["name"]]
    assert ran == ["verified:tiny"]
    assert project.run("verify").returncode != 0

    project.write_recipe(tiny_recipe())  # thresholds back to the defaults
    assert "verify:tiny-qnnpack" in project.doit()
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    assert {t["target"]: t["status"] for t in manifest["targets"]} == {"xnnpack": "passed", "qnnpack": "passed"}
    assert project.doit() == []


def test_a_bad_checkpoint_fails_in_one_line_and_leaves_no_artifact(project):
    (project.root / "weights.pt").write_bytes(b"not a checkpoint")
    recipe = tiny_recipe()
    recipe["model"]["checkpoint"] = "../weights.pt"
    project.write_recipe(recipe)
    result = project.run()
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1
    assert errors[0].startswith("ERROR: checkpoint:tiny: recipes/tiny.yaml: model.checkpoint: ")
    # one line for the broken recipe; what it kept from running is a count, and the report line says what it covers
    assert not [line for line in result.stderr.splitlines() if line.startswith("skipped ")], result.stderr
    assert "not run, as they need a task that failed" in result.stdout.splitlines()[-1]
    assert result.stderr.splitlines()[-1].endswith("no recipe built; NOT BUILT, listed with their errors: tiny")
    written = {p.relative_to(project.root / "artifacts").as_posix() for p in (project.root / "artifacts").rglob("*")
               if p.is_file()}
    assert written == {"report.md", "report.html"}  # which says so: "tiny: NOT BUILT, 1 error(s): checkpoint:tiny..."
    assert "- tiny: NOT BUILT, 1 error(s): checkpoint:tiny: recipes/tiny.yaml: model.checkpoint: " in \
        project.artifact("report.md").read_text()


def test_an_invalid_recipe_is_an_error_for_that_recipe_alone(project):
    project.write_recipe(tiny_recipe("good", targets=[{"backend": "xnnpack"}]))
    project.write_recipe({"name": "broken", "model": {"factory": "tinynet:make"}, "input": {"shape": [1, 3, 8, 8]},
                          "targets": [{"backend": "xnnpak"}], "colour": "blue"}, file="mine/broken.yaml")

    listed = project.run("list")
    alone = project.run("optimize:good-xnnpack")
    whole = project.run()

    assert listed.returncode == 0 and "optimize" in listed.stdout and "invalid" in listed.stdout
    assert alone.returncode == 0, alone.stderr
    assert whole.returncode != 0 and "Traceback" not in whole.stdout + whole.stderr
    errors = [line for line in whole.stderr.splitlines() if line.startswith(("ERROR", "recipes/"))]
    assert errors[0].startswith("ERROR: invalid:recipes/mine/broken.yaml: recipes/mine/broken.yaml: (top level): "
                                "unknown key 'colour'")
    assert errors[1].startswith("recipes/mine/broken.yaml: targets[0].backend: expected one of") and len(errors) == 2
    assert project.artifact("good/manifest.json").is_file() and project.artifact("good/verify-xnnpack.json").is_file()
    report = project.artifact("report.md").read_text()
    assert "- recipes/mine/broken.yaml: NOT BUILT, 2 error(s): recipes/mine/broken.yaml: (top level): unknown " \
           "key 'colour'" in report
    assert "; recipes/mine/broken.yaml: targets[0].backend: expected one of" in report
    assert "- good: 1 target(s): 1 passed" in report


def test_a_failing_target_leaves_its_recipes_other_targets_in_the_manifest_and_report(project):
    # ONNX Runtime's exporter cannot write opset 13 from this torch: the export stage fails for that target alone
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "onnx", "onnx": {"opset": 13}},
                                              {"backend": "qnnpack"}]))

    result = project.run()

    assert result.returncode != 0 and "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith("ERROR: onnx:tiny-onnx: recipes/tiny.yaml: targets[1].onnx")
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    status = {target["target"]: (target["status"], target.get("reason")) for target in manifest["targets"]}
    assert status["xnnpack"] == ("passed", None) and status["qnnpack"] == ("passed", None)
    assert status["onnx"][0] == "failed" and status["onnx"][1].startswith("onnx:tiny-onnx: recipes/tiny.yaml: ")
    assert set(manifest["benchmarks"]) == {"eager", "xnnpack", "qnnpack"}
    assert not [a for a in manifest["artifacts"] if a["path"].endswith(".onnx")]
    report = project.artifact("report.md").read_text()
    assert "- tiny: 3 target(s): 2 passed, 1 FAILED" in report and "NOT BUILT" not in report
    assert "onnx: onnx:tiny-onnx: recipes/tiny.yaml: targets[1].onnx" in report


def test_clean_removes_every_artifact(project):
    project.write_recipe(tiny_recipe())
    project.doit()
    result = project.run("clean")
    assert result.returncode == 0, result.stderr
    assert not (project.root / "artifacts").exists()


@pytest.mark.parametrize("mode", ["trace", "script"])
def test_built_ptl_files_match_the_eager_model(project, mode, monkeypatch):
    import torch
    from torch.jit.mobile import _load_for_lite_interpreter

    from mobilebuild.worker.metrics import sqnr_db

    project.write_recipe(tiny_recipe(script=mode))
    project.doit()
    monkeypatch.syspath_prepend(str(project.root))
    model = importlib.import_module("tinynet").make()
    model.load_state_dict(torch.load(project.artifact("tiny/checkpoint.pt")))
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = model.eval()(x)
    torch.backends.quantized.engine = "qnnpack"
    fp32 = _load_for_lite_interpreter(str(project.artifact("tiny/tiny-xnnpack.ptl")))
    int8 = _load_for_lite_interpreter(str(project.artifact("tiny/tiny-qnnpack.ptl")))
    assert sqnr_db(reference, fp32(x)) > 80.0
    assert sqnr_db(reference, int8(x)) > 15.0


def test_two_builds_at_once_run_one_after_the_other(project):
    import subprocess
    import sys

    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}]))
    first, second = [subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=600) for process in (first, second)]
    assert [process.returncode for process in (first, second)] == [0, 0], outputs
    assert sum("another build is running in this repository" in err for _, err in outputs) == 1
    executed = [line for out, _ in outputs for line in out.splitlines() if line.startswith(".  ")]
    assert sorted(set(executed)) == sorted(executed)  # the waiting build found everything done: nothing twice
    assert ".  optimize:tiny-xnnpack" in executed


def test_a_build_with_another_reporter_holds_the_lock_too(project):
    """doit's reporters are replaced by locking ones (pyproject.toml, or the mobilebuild command): a `-r json` build
    makes a plain one wait."""
    import subprocess
    import sys

    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}]))
    commands = [[sys.executable, "-m", "mobilebuild.cli", "-r", "json"], [sys.executable, "-m", "mobilebuild.cli"]]
    # cold builds (no artifact cache): long enough that the second surely starts while the first runs
    env = {**os.environ, "MOBILEBUILD_CACHE": "off"}
    processes = [subprocess.Popen(command, cwd=project.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for command in commands]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert sum("another build is running in this repository" in err for _, err in outputs) == 1
    report = json.loads(outputs[0][0])
    ran_first = [t["name"] for t in report["tasks"] if t["result"] == "success" and ":" in t["name"] and t["started"]]
    ran_second = [line for line in outputs[1][0].splitlines() if line.startswith(".  ")]
    assert not (ran_first and ran_second and {f".  {name}" for name in ran_first} & set(ran_second))


def test_a_recipe_that_fails_to_build_does_not_cost_the_others_their_report(project):
    """The report depends on every manifest; when a broken recipe keeps doit from writing it, the reporter writes it
    once the run is over, from the recipes that built (in parallel too, and with the JSON reporter on stdout)."""
    # the reporters as the README tells a repository to register them, as this one does
    sections = (REPO / "pyproject.toml").read_text().split("\n\n")
    (project.root / "pyproject.toml").write_text(next(s for s in sections if "[tool.doit.plugins.reporter]" in s))
    project.write_recipe(tiny_recipe())
    broken = tiny_recipe(name="broken")
    broken["model"]["kwargs"] = {"width": -1}
    project.write_recipe(broken)
    result = project.run("-r", "json", "-n", "2")
    assert result.returncode != 0
    assert {t["name"]: t["result"] for t in json.loads(result.stdout)["tasks"]}["manifest:tiny"] == "success"
    markdown = project.artifact("report.md").read_text()
    assert "## tiny" in markdown and "## broken" not in markdown
    assert ("- broken: NOT BUILT, 1 error(s): checkpoint:broken: recipes/broken.yaml: model.factory: tinynet:make"
            "(**kwargs) raised RuntimeError: ") in markdown
    assert "broken: NOT BUILT" in project.artifact("report.html").read_text()

    project.write_recipe(tiny_recipe(name="broken"))
    project.doit()
    markdown = project.artifact("report.md").read_text()
    assert "NOT BUILT" not in markdown and "## broken" in markdown and "## tiny" in markdown
