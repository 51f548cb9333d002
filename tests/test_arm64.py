"""CPU artifacts on emulated ARM CPUs: the nodes a recipe gets where `mobilebuild arm64 setup` made an environment,
the gate and the report that read their results, and (slow, with QEMU) real runs of outside models' artifacts."""

import json
import shutil

import pytest
import yaml
from conftest import tiny_recipe

from mobilebuild.arm64 import setup
from mobilebuild.engine.actions import check_verified
from mobilebuild.errors import RecipeErrors
from mobilebuild.plan import arm64, graph, recipe, routes
from mobilebuild.results import report_data

ONNX_AND_LITERT = [{"backend": "xnnpack"}, {"backend": "onnx"},
                   {"backend": "onnx", "precision": "int8", "name": "onnx-int8"},
                   {"backend": "xnnpack", "runtime": "litert"}, {"backend": "nnapi"},
                   {"backend": "gpu-delegate", "runtime": "litert"}]


def fake_environment(home, **wheels):
    """current.json as the setup writes it, for the plan layer (nothing runs)."""
    (home / "env").mkdir(parents=True, exist_ok=True)
    found = {"key": "k", "path": str(home / "env"), "qemu": "7.2.22", "python": "3.11.2", "counter": "c",
             "wheels": {"numpy": "2.4.6", "onnxruntime": "1.32.0", "ai-edge-litert": "2.3.0", **wheels},
             "cpus": {name: {"qemu": cpu.qemu, "features": []} for name, cpu in arm64.CPUS.items()},
             "runtimes": {name: {"runner": found.runner, "wheels": list(found.wheels)}
                          for name, found in routes.arm64_runtimes().items() if name in ("onnxruntime", "litert")}}
    setup.store_current(home, found)
    return found


def arm64_nodes(root, data):
    (root / "recipes").mkdir(parents=True, exist_ok=True)
    (root / "recipes" / "r.yaml").write_text(yaml.safe_dump(data))
    return {n.task_name: n for n in graph.build(recipe.load_all(root), root) if n.stage == "arm64"}


@pytest.fixture
def environment(tmp_path, monkeypatch):
    monkeypatch.setenv(arm64.HOME_VARIABLE, str(tmp_path / "arm64"))
    return tmp_path / "arm64"


def test_no_environment_plans_no_arm_node(tmp_path, environment):
    assert arm64_nodes(tmp_path / "repo", tiny_recipe(targets=ONNX_AND_LITERT)) == {}


def test_each_cpu_artifact_of_a_runtime_the_environment_has_runs_on_each_default_cpu(tmp_path, environment):
    fake_environment(environment)
    nodes = arm64_nodes(tmp_path / "repo", tiny_recipe(targets=ONNX_AND_LITERT))
    expected = {f"arm64:tiny-{target}-{cpu}" for target in ("onnx", "onnx-int8", "xnnpack-litert")
                for cpu in arm64.DEFAULT_CPUS}
    assert set(nodes) == expected  # not the .ptl (no torch in this environment), NNAPI, nor the GPU delegate's
    node = nodes["arm64:tiny-onnx-int8-cortex-a53"]
    assert node.inputs["artifact"].endswith("tiny-onnx-int8.onnx")
    assert node.config["emulator"] == {"qemu": "7.2.22", "cpu": "cortex-a53", "python": "3.11.2",
                                       "wheels": {"onnxruntime": "1.32.0"}, "counter": "c"}
    assert node.config["samples"] == arm64.DEFAULT_SAMPLES and "path" not in json.dumps(node.config["emulator"])


def test_a_recipe_names_its_cpus_and_samples_or_turns_them_off(tmp_path, environment):
    fake_environment(environment)
    asked = arm64_nodes(tmp_path / "a", tiny_recipe(targets=[{"backend": "onnx"}],
                                                     verify={"arm64": {"cpus": ["cortex-a76"], "samples": 3}}))
    assert list(asked) == ["arm64:tiny-onnx-cortex-a76"] and asked["arm64:tiny-onnx-cortex-a76"].config["samples"] == 3
    assert arm64_nodes(tmp_path / "b", tiny_recipe(targets=[{"backend": "onnx"}], verify={"arm64": False})) == {}


def test_the_sme_cpu_is_refused_on_a_qemu_that_emulates_sme_wrongly(tmp_path, environment):
    sme = tiny_recipe(targets=[{"backend": "onnx"}], verify={"arm64": {"cpus": ["armv9-sme"]}})
    found = fake_environment(environment)
    with pytest.raises(RecipeErrors, match=r"recipes/r.yaml: verify.arm64.cpus: armv9-sme needs QEMU 8.2.3 or newer, "
                                           r"this is 7.2.22: QEMU before 8.2.3 computes SME's int8 outer product"):
        arm64_nodes(tmp_path / "a", sme)
    setup.store_current(environment, {**found, "qemu": "9.0.0"})
    assert list(arm64_nodes(tmp_path / "b", sme)) == ["arm64:tiny-onnx-armv9-sme"]


def test_an_unknown_cpu_model_is_one_line_naming_the_field(tmp_path, environment):
    fake_environment(environment)
    with pytest.raises(Exception, match="verify.arm64"):
        arm64_nodes(tmp_path, tiny_recipe(targets=[{"backend": "onnx"}], verify={"arm64": {"cpus": ["m1"]}}))


def test_a_new_runtime_wheel_reruns_only_that_runtimes_arm_nodes(tmp_path, environment):
    fake_environment(environment)
    data = tiny_recipe(targets=ONNX_AND_LITERT)
    before = {name: node.key() for name, node in arm64_nodes(tmp_path / "repo", data).items()}
    fake_environment(environment, onnxruntime="1.33.0")
    after = {name: node.key() for name, node in arm64_nodes(tmp_path / "repo", data).items()}
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {name for name in before if "-onnx" in name} and changed


def test_the_manifest_gathers_each_targets_results_by_cpu(tmp_path, environment):
    fake_environment(environment)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(yaml.safe_dump(tiny_recipe(targets=[{"backend": "onnx"}])))
    manifest = next(n for n in graph.build(recipe.load_all(tmp_path), tmp_path) if n.stage == "manifest")
    assert manifest.config["arm64"] == {"onnx": {cpu: f"artifacts/tiny/arm64-onnx-{cpu}.json"
                                                 for cpu in arm64.DEFAULT_CPUS}}


def test_the_schema_offers_the_cpu_models_there_are_with_the_defaults():
    cpus = recipe.schema()["properties"]["verify"]["properties"]["arm64"]["oneOf"][1]["properties"]["cpus"]
    assert cpus["items"]["enum"] == list(arm64.CPUS) and cpus["default"] == list(arm64.DEFAULT_CPUS)


def test_setup_without_qemu_is_one_line_with_the_apt_line(monkeypatch, capsys, environment):
    from mobilebuild.arm64 import command, emulator

    monkeypatch.setattr(emulator.shutil, "which", lambda name: None)
    assert command.arm64_command(["setup"], routes.arm64_runtimes()) == 1
    assert capsys.readouterr().out == ("mobilebuild arm64 setup: qemu-aarch64 not found: install QEMU's user mode "
                                       "(apt-get install qemu-user), then run `mobilebuild arm64 setup` again\n")
    assert not environment.exists() or not any(environment.iterdir())


def test_hwcap_bits_name_the_features_linux_shows():
    assert setup.features(0b11, 0) == ["fp", "asimd"]
    assert "asimddp" in setup.features(1 << 20, 0) and setup.features(0, 1 << 1) == ["sve2"]
    assert setup.features(0, 1 << 23) == ["sme"]


def arm_result(cpu, status="passed", instructions=60_000_000, failures=()):
    return {"status": status, "cpu": cpu, "metrics": {"sqnr_db": 30.0}, "failures": list(failures),
            "against_host": {"identical": status == "passed", "sqnr_db": 140.0}, "seconds": {"total": 2.5},
            "instructions": {"per_inference": instructions, "runs": [instructions], "spread": 0.0}}


def test_a_target_that_passes_here_and_fails_on_an_arm_cpu_fails_its_gate_naming_the_cpu(tmp_path):
    here, there = tmp_path / "verify.json", tmp_path / "arm.json"
    here.write_text(json.dumps({"status": "passed", "failures": [], "precision": "int8"}))
    line = "on emulated armv9-sme (ARMv9-class with SME): sqnr_db -19.4 < 20"
    there.write_text(json.dumps({**arm_result("armv9-sme", "failed", failures=[line]), "precision": "int8"}))
    failed = check_verified([("litert-int8", str(here)), ("litert-int8", str(there))], "recipes/m.yaml")
    assert failed.message.strip() == (f"recipes/m.yaml: litert-int8: verification failed: {line} "
                                   "(thresholds: verify.thresholds.int8)")


def test_the_report_shows_each_cpu_ranks_candidates_by_instructions_and_ships_none_that_fails_on_arm():
    from report_manifests import benchmark, full_manifest, target, verification

    manifest = full_manifest()
    manifest["targets"].append(target("fast", "xnnpack", "fp32", 14_700_000, "passed"))
    manifest["verification"]["fast"] = verification("passed", {"sqnr_db": 104.0, "cosine": 1.0,
                                                               "max_rel_error": 1e-6, "top1_agreement": 1.0})
    manifest["benchmarks"]["fast"] = benchmark("pytorch-mobile", 3.0, 2.9, 3.1, 14_700_000)
    manifest["arm64"] = {
        "xnnpack": {"cortex-a53": arm_result("cortex-a53", instructions=180_000_000)},
        "fast": {"cortex-a53": arm_result("cortex-a53", "failed", failures=["on emulated cortex-a53: sqnr 3 < 40"])},
    }
    section = report_data.build([manifest]).sections[0]
    assert section.recommendation[0].startswith("Ship xnnpack ")  # fast is faster here, and fails on cortex-a53
    assert any("fast (3.00 ms): FAILED on emulated cortex-a53" in line for line in section.recommendation)
    assert not any("Fewest instructions" in line for line in section.recommendation)  # one counted candidate
    assert [row[0] for row in section.arm64.cells] == ["xnnpack", "fast"]
    assert section.arm64.cells[0][1:] == ["passed", "30.0", "identical", "180 M"]
    assert section.arm64.states == ["passed", "failed"]
    assert "fast: on emulated cortex-a53: sqnr 3 < 40" in section.failures
    assert any("cortex-a53: ARMv8.0" in note for note in section.arm64_notes)


def test_the_instruction_counts_rank_the_candidates_a_host_run_cannot_tell_apart():
    from report_manifests import benchmark, full_manifest

    manifest = full_manifest()
    manifest["targets"][1]["status"] = "passed"
    manifest["verification"]["qnnpack"].update(status="passed", failures=[])
    manifest["verification"]["qnnpack"]["metrics"].update(sqnr_db=30.0, cosine=1.0, max_rel_error=0.001,
                                                           top1_agreement=1.0)
    manifest["benchmarks"]["qnnpack"] = benchmark("pytorch-mobile", 6.1, 5.7, 6.6, 3_500_000)  # within xnnpack's
    manifest["arm64"] = {"xnnpack": {"cortex-a76": arm_result("cortex-a76", instructions=180_000_000)},
                         "qnnpack": {"cortex-a76": arm_result("cortex-a76", instructions=64_700_000)}}
    lines = report_data.build([manifest]).sections[0].recommendation
    ranked = "cortex-a76: qnnpack (64.7 M) < xnnpack (180 M)"
    assert any(line.startswith("Not told apart by this run: xnnpack and qnnpack") for line in lines)
    assert f"Of those this run cannot tell apart, the instruction counts say {ranked}." in lines
    assert any(line.startswith("Fewest instructions per inference on emulated ARM CPUs") and ranked in line
               for line in lines)


# --- real runs under QEMU (slow) -------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def real_environment(tmp_path_factory):
    """An environment made by the real setup, in the tests' own folder; skipped, saying why, without QEMU."""
    if shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-aarch64 not found: apt-get install qemu-user (.ci/run installs it)")
    home = tmp_path_factory.mktemp("arm64")
    return home, setup.setup(routes.arm64_runtimes(), {arm64.HOME_VARIABLE: str(home)})


OUTSIDE_MODEL = {
    "name": "mnv3",
    "model": {"torchvision": "mobilenet_v3_small", "seed": 0, "batchnorm_stats": 2},
    "input": {"shape": [1, 3, 96, 96]},
    "quantize": {"calibration": {"source": "random", "batches": 8, "seed": 0}},
    "benchmark": {"warmup": 1, "iters": 5},
    "targets": [{"backend": "onnx", "precision": "int8", "name": "onnx-int8"},
                {"backend": "xnnpack", "runtime": "litert", "precision": "int8", "name": "litert-int8"}],
    # random weights and random calibration: loose thresholds, the same on the host and on ARM
    "verify": {"samples": 4, "thresholds": {"int8": {"sqnr_db": 5, "cosine": 0.8, "max_rel_error": 5,
                                                     "top1_agreement": 0.0}},
               "arm64": {"cpus": ["cortex-a53", "cortex-a76"], "samples": 2}},
}


TORCH_ARTIFACTS = {
    "name": "shuffle",
    "model": {"torchvision": "shufflenet_v2_x0_5", "quantizable": True, "seed": 0, "batchnorm_stats": 2},
    "input": {"shape": [1, 3, 64, 64]},
    "quantize": {"calibration": {"source": "random", "batches": 8, "seed": 0}},
    "benchmark": {"warmup": 1, "iters": 5},
    "targets": [{"backend": "xnnpack"}, {"backend": "qnnpack"},
                {"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "name": "et-int8"}],
    "verify": {"samples": 4, "thresholds": OUTSIDE_MODEL["verify"]["thresholds"],
               "arm64": {"cpus": ["cortex-a53"], "samples": 1}},
}


@pytest.mark.slow
def test_an_outside_models_torch_artifacts_run_in_pypis_aarch64_torch(project, real_environment, monkeypatch):
    """torchvision's ShuffleNetV2 (random weights) as .ptl fp32 (XNNPACK), .ptl int8 (QNNPACK) and .pte int8
    (ExecuTorch's XNNPACK) on an emulated Cortex-A53: PyPI's aarch64 torch (a CUDA build, its CUDA libraries
    stubbed) and ExecuTorch's binding run them, and they agree with this host's run."""
    home, found = real_environment
    if "executorch" not in found["runtimes"]:
        pytest.skip("the environment has no torch: apt-get install binutils-aarch64-linux-gnu, then set up again")
    monkeypatch.setenv(arm64.HOME_VARIABLE, str(home))
    project.write_recipe(TORCH_ARTIFACTS)
    assert set(project.doit("arm64")) >= {f"arm64:shuffle-{t}-cortex-a53" for t in ("xnnpack", "qnnpack", "et-int8")}
    for target in ("xnnpack", "qnnpack", "et-int8"):
        result = json.loads(project.artifact(f"shuffle/arm64-{target}-cortex-a53.json").read_text())
        assert result["status"] == "passed", result
        assert result["against_host"]["sqnr_db"] > 30 or result["against_host"]["identical"], result
        assert result["instructions"]["per_inference"] > 1e6


@pytest.mark.slow
def test_an_outside_models_int8_artifacts_verify_on_arm_cpus_with_repeatable_instruction_counts(
        project, real_environment, monkeypatch):
    """torchvision's MobileNetV3-Small (random weights) through real doit: ONNX Runtime's and LiteRT's int8 files
    run on an emulated Cortex-A53 and A76, pass, and count their instructions; a node run again counts within 1%."""
    home, found = real_environment
    monkeypatch.setenv(arm64.HOME_VARIABLE, str(home))
    project.write_recipe(OUTSIDE_MODEL)
    ran = project.doit("arm64")
    assert {f"arm64:mnv3-{t}-{cpu}" for t in ("onnx-int8", "litert-int8") for cpu in ("cortex-a53", "cortex-a76")} \
        <= set(ran)
    first = {}
    for target in ("onnx-int8", "litert-int8"):
        for cpu in ("cortex-a53", "cortex-a76"):
            result = json.loads(project.artifact(f"mnv3/arm64-{target}-{cpu}.json").read_text())
            assert result["status"] == "passed", result
            assert result["emulator"]["cpu"] == cpu and result["features"] == found["cpus"][cpu]["features"]
            counted = result["instructions"]
            assert counted["per_inference"] > 1e6 and counted["spread"] < 0.01
            first[target, cpu] = counted["per_inference"]
    # the dot-product CPU runs ONNX Runtime's int8 convolutions in fewer instructions than one without it
    assert first["onnx-int8", "cortex-a76"] < first["onnx-int8", "cortex-a53"]
    assert project.run("forget", "arm64:mnv3-onnx-int8-cortex-a53").returncode == 0
    assert project.doit("arm64:mnv3-onnx-int8-cortex-a53") == ["arm64:mnv3-onnx-int8-cortex-a53"]
    again = json.loads(project.artifact("mnv3/arm64-onnx-int8-cortex-a53.json").read_text())
    assert abs(again["instructions"]["per_inference"] / first["onnx-int8", "cortex-a53"] - 1) < 0.01


NCNN = {
    "name": "mnv3",
    "model": {"torchvision": "mobilenet_v3_small", "seed": 0, "batchnorm_stats": 2},
    "input": {"shape": [1, 3, 96, 96]},
    "benchmark": {"warmup": 1, "iters": 5},
    "targets": [{"backend": "ncnn"}, {"backend": "ncnn", "name": "ncnn-fp16", "precision": "fp16"}],
    "verify": {"samples": 4, "arm64": {"cpus": ["cortex-a53", "cortex-a76"], "samples": 2}},
}


@pytest.mark.slow
def test_an_outside_models_ncnn_files_run_on_arm_cpus_where_fp16_computes_in_fp16(
        project, real_environment, monkeypatch):
    """torchvision's MobileNetV3-Small (random weights) as ncnn fp32 and fp16, in PyPI's aarch64 ncnn: fp32 agrees
    with this host's run on both CPUs; an fp16 target computes in fp16 where the CPU has fp16 arithmetic (ARMv8.2's
    A76), which this x86 host never does: further from the host's run there, in fewer instructions."""
    home, found = real_environment
    if "ncnn" not in found["runtimes"]:
        pytest.skip("the environment has no ncnn: install mobilebuild[ncnn], then set up again")
    monkeypatch.setenv(arm64.HOME_VARIABLE, str(home))
    project.write_recipe(NCNN)
    assert {f"arm64:mnv3-{t}-{cpu}" for t in ("ncnn", "ncnn-fp16") for cpu in ("cortex-a53", "cortex-a76")} \
        <= set(project.doit("arm64"))
    results = {(target, cpu): json.loads(project.artifact(f"mnv3/arm64-{target}-{cpu}.json").read_text())
               for target in ("ncnn", "ncnn-fp16") for cpu in ("cortex-a53", "cortex-a76")}
    assert all(result["status"] == "passed" for result in results.values()), results
    assert all(results["ncnn", cpu]["against_host"]["sqnr_db"] > 80 for cpu in ("cortex-a53", "cortex-a76"))
    fp16 = {cpu: results["ncnn-fp16", cpu] for cpu in ("cortex-a53", "cortex-a76")}
    assert fp16["cortex-a76"]["against_host"]["sqnr_db"] < fp16["cortex-a53"]["against_host"]["sqnr_db"] - 20
    assert fp16["cortex-a76"]["instructions"]["per_inference"] < fp16["cortex-a53"]["instructions"]["per_inference"]


def test_release_json_carries_each_cpus_verdict_and_count_and_refuses_a_target_failed_on_arm():
    from mobilebuild.errors import MobileBuildError
    from mobilebuild.results import release

    passed = {**arm_result("cortex-a76"), "generation": arm64.CPUS["cortex-a76"].generation,
              "emulator": {"qemu": "7.2.22", "cpu": "cortex-a76"}}
    manifest = {"recipe": "m", "arm64": {"onnx-int8": {"cortex-a76": passed}}}
    summary = release.arm64_summary(manifest, "onnx-int8")["cortex-a76"]
    assert summary["status"] == "passed" and summary["instructions_per_inference"] == 60_000_000
    assert summary["emulator"]["qemu"] == "7.2.22" and summary["sqnr_db"] == 30.0
    assert release.arm64_summary(manifest, "other") == {}
    manifest["arm64"]["onnx-int8"]["armv9-sve2"] = arm_result("armv9-sve2", "failed", failures=["on emulated x"])
    with pytest.raises(MobileBuildError, match=r"m-onnx-int8: verification failed \(on emulated x\)"):
        release._check_verification("m", "onnx-int8", "passed", manifest, allow_failed=False)
    release._check_verification("m", "onnx-int8", "passed", manifest, allow_failed=True)


@pytest.mark.slow
def test_a_runtime_failing_in_the_emulated_process_is_one_line_with_its_traceback_kept(tmp_path, real_environment):
    import numpy

    from mobilebuild.worker import emulated, failures

    _, found = real_environment
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    session = emulated.session(found, "cortex-a53")
    with pytest.raises(failures.Failed) as raised:
        session.run("mobilebuild.routes.onnx.worker.guest", broken, [[numpy.zeros((1, 3), numpy.float32)]],
                    runtime="onnxruntime")
    failure = failures.library_failure(raised.value)
    assert failure["raised_by"] == "onnxruntime on emulated cortex-a53"
    assert failure["error"].startswith(("InvalidProtobuf", "Fail", "RuntimeError")), failure["error"]
    assert "onnxruntime" in failure["traceback"] and "\n" not in failure["error"]
    assert session.process.poll() is None  # the process serves the next artifact
