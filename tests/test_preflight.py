"""`mobilebuild check`: the pre-flight that runs the build's own tasks up to each target's artifact, runs the artifact
on the host, and adds the model's architecture advice. The advice alone is checked fast (the build's tasks replaced by
a stand-in); what the build's tasks decide is checked end to end (slow), against real builds."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from conftest import Project
from doit.exceptions import TaskFailed, UnmetDependency

from mobilebuild import preflight
from mobilebuild.engine import runner
from mobilebuild.plan import graph, recipe, routes
from mobilebuild.preflight import command
from mobilebuild.preflight.targets import TargetCheck

# Factories (and evaluation data) for the recipes below; a module name of its own, as recipe factories are imported by
# name.
MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        """Conv-BN-activation, Conv-ReLU, pooling, a linear head of 5 outputs."""

        def __init__(self, activation=nn.ReLU, width=8):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, width, 3, bias=False), nn.BatchNorm2d(width), activation(),
                                          nn.Conv2d(width, 16, 3), nn.ReLU())
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.head = nn.Linear(16, 5)

        def forward(self, x):
            return self.head(torch.flatten(self.pool(self.features(x)), 1))


    class ConvertsItsInput(Net):
        """The performance recipe's model converts its own input to channels_last."""

        def forward(self, x):
            return super().forward(x.contiguous(memory_format=torch.channels_last))


    class CumulativeHead(Net):
        """XNNPACK has no cumulative sum: it stays on ExecuTorch's portable kernels."""

        def forward(self, x):
            return super().forward(x).cumsum(1)


    class InverseErrorHead(Net):
        """No kernel library of ExecuTorch's runtime has erfinv: the program would not load."""

        def forward(self, x):
            return torch.erfinv(torch.tanh(super().forward(x)) * 0.5)


    class Pythonic(nn.Module):
        """Python torch.jit.script cannot compile (a generator over *args); torch.export takes it, the trace keeps
        the scale of the input it ran on (the script stage's fallback refuses it)."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)

        def forward(self, *inputs):
            return sum(self.conv(x) for x in inputs) / float(inputs[0].abs().max())


    class Branchy(nn.Module):
        """Control flow on tensor values: FX and torch.export cannot capture it, and no nn.Sequential shows the
        Conv-BN pair to eager fusion."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, bias=False)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            if x.mean() > 0:
                return self.bn(self.conv(x))
            return self.bn(self.conv(-x))


    class PlainAdd(nn.Module):
        """`+` on two quantized tensors has no quantized kernel (FloatFunctional has)."""

        def __init__(self):
            super().__init__()
            self.left = nn.Conv2d(3, 8, 1)
            self.right = nn.Conv2d(3, 8, 1)

        def forward(self, x):
            return self.left(x) + self.right(x)


    def clean():
        return Net()


    def relu6():
        return Net(nn.ReLU6)


    def relu6_inplace():
        return Net(lambda: nn.ReLU6(inplace=True))


    def hardswish():
        return Net(nn.Hardswish)


    def converts_its_input():
        return ConvertsItsInput(nn.Hardswish)


    def narrow():
        return Net(width=12)


    def cumulative():
        return CumulativeHead()


    def inverse_error():
        return InverseErrorHead()


    def branchy():
        return Branchy()


    def pythonic():
        return Pythonic()


    def plain_add():
        return PlainAdd()


    def raising_data():
        """verify.evaluation: a loader that fails."""
        raise KeyError("no split 'test' in the dataset")


    def short_labels():
        """verify.evaluation: 16 inputs, 10 labels (the last batch of labels dropped)."""
        return torch.randn(16, 3, 12, 12), torch.randint(0, 5, (10,))
''')

NHWC = {"shape": [1, 3, 12, 12], "memory_format": "channels_last"}
NCHW = {"shape": [1, 3, 12, 12]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A repository (dodo.py, recipes/) whose recipes the tests add; the build's tasks find them there."""
    project = Project(tmp_path_factory.mktemp("preflight"))
    (project.root / "preflight_models.py").write_text(MODELS)
    return project.root


def write_recipe(root, name, factory, targets, input_config=NHWC, **settings):
    recipe_ = {"name": name, "model": {"factory": f"preflight_models:{factory}"}, "input": input_config,
               "quantize": {"calibration": {"source": "random", "batches": 1, "seed": 0}},
               "benchmark": {"warmup": 1, "iters": 2}, "targets": targets, **settings}
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe_, sort_keys=False))
    return path.relative_to(root)


def by_target(report, target):
    return next(result for result in report["targets"] if result["target"] == target)


def of_kind(result, kind):
    return [item for item in result["findings"] if item["kind"] == kind]


def build(root, *tasks):
    """A real build in a process of its own (`doit`), as after `mobilebuild check`: (exit status, stderr, the tasks
    it executed)."""
    done = subprocess.run([sys.executable, "-m", "doit", *tasks], cwd=root, capture_output=True, text=True,
                          timeout=600)
    executed = [line[3:] for line in done.stdout.splitlines() if line.startswith(".  ") and ":" in line]
    return done.returncode, done.stderr, executed


# --- the model's advice (fast: the build's tasks stand aside) -------------------------------------------------


def test_relu6_is_flagged_for_nnapi_and_fuses_on_xnnpack(root, no_build):
    report = preflight.run(write_recipe(root, "relu6", "relu6", [{"backend": "nnapi"}, {"backend": "xnnpack"}]), root)
    (advice,) = of_kind(by_target(report, "nnapi"), "advice")
    assert advice["target"] == "nnapi" and advice["where"] == "features.0"
    assert advice["detail"].startswith("ReLU6 does not fuse")
    assert of_kind(by_target(report, "xnnpack"), "advice") == []  # a clamp: optimize_for_mobile folds it


def test_widths_not_a_multiple_of_8_are_listed_by_layer(root, no_build):
    report = preflight.run(write_recipe(root, "narrow", "narrow", [{"backend": "xnnpack"}]), root)
    (width,) = report["model"]["findings"]  # the head's 5 outputs are the task's, not flagged
    assert width["target"] == preflight.ALL_TARGETS and width["kind"] == "advice"
    assert width["where"] == "features.0 (Conv2d)" and width["detail"].startswith("12 output channels")


def test_advice_depends_on_what_the_target_fuses(root, no_build):
    targets = [{"backend": "xnnpack"}, {"backend": "onnx"}]
    report = preflight.run(write_recipe(root, "hardswish", "hardswish", targets, NCHW), root)
    wheres = {item["where"]: item["detail"] for item in of_kind(by_target(report, "xnnpack"), "advice")}
    assert wheres["features.0"].startswith("Hardswish does not fuse")
    assert "channels_last" in wheres["input.memory_format"]  # NCHW input on XNNPACK through PyTorch Mobile
    assert of_kind(by_target(report, "onnx"), "advice") == []  # no claim about ONNX Runtime's fusions


def test_a_model_that_converts_its_own_input_needs_no_channels_last_advice(root, no_build):
    report = preflight.run(write_recipe(root, "converts", "converts_its_input", [{"backend": "xnnpack"}], NCHW), root)
    assert [item["where"] for item in of_kind(by_target(report, "xnnpack"), "advice")] == ["features.0"]


def test_a_conv_bn_pair_eager_fusion_did_not_see(root, no_build):
    report = preflight.run(write_recipe(root, "branchy_pair", "branchy", [{"backend": "xnnpack"}]), root)
    (pair,) = report["model"]["findings"]
    assert pair["where"] == "bn after conv" and "[conv, bn]" in pair["detail"]


def test_a_blocked_target_says_why_in_its_line_and_blocks(root, no_build, monkeypatch, capsys):
    path = write_recipe(root, "lines", "clean", [{"backend": "xnnpack"}, {"backend": "onnx"}])
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("route families installed: PyTorch Mobile, ExecuTorch, ONNX Runtime, onnxruntime-genai, "
                        "LiteRT, LiteRT-LM, ncnn")
    assert lines[3].startswith("xnnpack (xnnpack, pytorch-mobile, fp32): not made in ")
    assert lines[3].endswith(": BLOCKED: optimize:lines-xnnpack: not made: the build's tasks are not run in this test")
    assert lines[4].startswith("onnx (onnx, onnxruntime, fp32): not made in ")
    assert lines[-1] == "2 blocking, 0 advice: blocked (exit 1)"


@pytest.mark.parametrize("factory, arguments, expected", [
    ("missing", [], "model.factory: module 'preflight_models' has no attribute 'missing'"),
    ("clean", ["--target", "nope"], "targets: no target 'nope' in the recipe (targets: xnnpack)"),
])
def test_a_bad_recipe_is_one_line_and_exit_2(root, monkeypatch, capsys, factory, arguments, expected):
    path = write_recipe(root, f"bad_{factory}", factory, [{"backend": "xnnpack"}])
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path), *arguments]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines() == [f"{path.as_posix()}: {expected}"]


def test_a_recipe_outside_the_repository_recipes_is_one_line_and_exit_2(root, monkeypatch, capsys):
    (root / "elsewhere").mkdir(exist_ok=True)
    path = write_recipe(root, "outside", "clean", [{"backend": "xnnpack"}])
    moved = root / "elsewhere" / path.name
    (root / path).rename(moved)
    monkeypatch.chdir(root)
    assert preflight.check_command([str(moved.relative_to(root))]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("elsewhere/outside.yaml: not a recipe of this repository")


def test_a_failed_dependency_is_blamed_on_the_task_that_failed():
    """What doit reports for the artifact's task (its dependency failed) leads to the build's own error."""
    reporter = runner.Reporter(runner.Run(["optimize:r-xnnpack"]))
    reporter.failed = {"script:r-fp32": TaskFailed("recipes/r.yaml: script: torch.jit.script cannot compile\nmore"),
                         "optimize:r-xnnpack": UnmetDependency("script:r-fp32")}
    assert reporter.cause("optimize:r-xnnpack") == ("script:r-fp32",
                                                    "recipes/r.yaml: script: torch.jit.script cannot compile")


def test_an_artifact_this_host_cannot_load_cannot_run(root, tmp_path):
    """The host run is verify's loading: here ONNX Runtime refusing a file that is not a model."""
    loaded = recipe.load(write_recipe(root, "garbage", "clean", [{"backend": "onnx"}]), root)
    nodes = {node.task_name: node for node in graph.recipe_nodes(loaded, root)}
    artifact = nodes["onnx:garbage-onnx"]
    check = TargetCheck(loaded.targets[0], routes.route_for(loaded.targets[0], loaded.file),
                        type("Model", (), {"inputs": loaded.inputs})(), artifact, nodes)
    (root / artifact.output).parent.mkdir(parents=True, exist_ok=True)
    (root / artifact.output).write_bytes(b"not an ONNX model")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        check.host_run()
    (cannot,) = check.findings
    assert cannot["kind"] == "cannot-run" and cannot["where"] == "onnxruntime runtime"
    assert "cannot load artifacts/garbage/garbage-onnx.onnx" in cannot["detail"]


def test_the_text_report_lists_findings_after_the_target_lines():
    finding = {"target": "onnx", "kind": "fallback", "detail": "2 calls outside", "where": "aten::cumsum.out"}
    report = {"recipe": "r", "file": "recipes/r.yaml", "versions": {"torch": "2.12.1"},
              "model": {"findings": [], "notes": [], "seconds": 0.5},
              "targets": [{"target": "et", "backend": "xnnpack", "runtime": "executorch", "delegate": "xnnpack",
                           "precision": "fp32", "made": "up to date", "findings": [finding], "notes": ["a note"],
                           "seconds": 1.25}],
              "blocking": 0, "advice": 1, "exit_code": 0}
    assert command.format(report).splitlines() == [
        "r (recipes/r.yaml): torch 2.12.1",
        f"model: built and fused in 0.5 s; all targets: ok ({command.STRUCTURE_ONLY})",
        "et (xnnpack, executorch -> xnnpack, fp32): up to date in 1.2 s: ok, 1 fallback",
        "et:",
        "    kind           where             detail",
        "    fallback       aten::cumsum.out  2 calls outside",
        "    note: a note",
        f"0 blocking, 1 fallback: no blocking findings ({command.STRUCTURE_ONLY}) (exit 0)"]


# --- what the build's own tasks decide (slow: they run, and real builds follow) -----------------------------------


@pytest.mark.slow
def test_a_model_that_scripts_badly_is_blocked_as_the_build_fails(root):
    path = write_recipe(root, "pythonic", "pythonic", [{"backend": "xnnpack"}, {"backend": "onnx"}], NCHW)
    report = preflight.run(path, root)
    (fails,) = of_kind(by_target(report, "xnnpack"), "build-fails")
    assert fails["where"] == "script:pythonic-fp32"
    assert fails["detail"].startswith("recipes/pythonic.yaml: script: torch.jit.script failed (")
    assert by_target(report, "onnx")["made"] == "built" and of_kind(by_target(report, "onnx"), "build-fails") == []
    assert report["exit_code"] == 1

    status, errors, _ = build(root, "pythonic")
    assert status != 0 and f"ERROR: {fails['where']}: {fails['detail']}" in errors.splitlines()
    assert (root / "artifacts/pythonic/pythonic-onnx.onnx").is_file()
    assert not (root / "artifacts/pythonic/pythonic-xnnpack.ptl").exists()


def blocked_on_verify(report, target, task, detail):
    """The target's one blocking finding: the build's verify task `task` fails with `detail`."""
    (fails,) = [item for item in by_target(report, target)["findings"] if item["kind"] in ("build-fails", "cannot-run")]
    assert (fails["kind"], fails["where"], fails["detail"]) == ("build-fails", task, detail)
    return f"ERROR: {task}: {detail}"


@pytest.mark.slow
def test_output_names_the_model_does_not_have_block_as_verify_fails_on_them(root):
    """verify names the output tensors with the recipe's `outputs`, after the artifact is made: the check runs that
    check of verify's on the eager model. A device's artifact verify does not run: nothing to name, not blocked."""
    path = write_recipe(root, "two_names", "clean", [{"backend": "xnnpack"}, {"backend": "nnapi"}], NCHW,
                        outputs=["scores", "embedding"])
    report = preflight.run(path, root)
    error = blocked_on_verify(report, "xnnpack", "verify:two_names-xnnpack",
                              "recipes/two_names.yaml: outputs: 2 output names for 1 output tensor(s) (output)")
    assert by_target(report, "xnnpack")["made"] == "built"
    assert of_kind(by_target(report, "nnapi"), "build-fails") == [] and report["exit_code"] == 1

    status, errors, _ = build(root, "verify:two_names-xnnpack", "verify:two_names-nnapi")
    assert status != 0 and error in errors.splitlines()
    assert "ERROR: verify:two_names-nnapi" not in errors
    assert json.loads((root / "artifacts/two_names/verify-nnapi.json").read_text())["status"] == "not run on host"


@pytest.mark.slow
def test_an_evaluation_function_that_raises_blocks_every_target_as_verify_fails_on_it(root):
    targets = [{"backend": "xnnpack"}, {"backend": "qnnpack"}]
    path = write_recipe(root, "raising", "clean", targets, NCHW,
                        verify={"evaluation": {"function": "preflight_models:raising_data"}})
    report = preflight.run(path, root)
    errors_expected = [blocked_on_verify(report, target, f"verify:raising-{target}",
                                         "recipes/raising.yaml: verify.evaluation.function: "
                                         "preflight_models:raising_data raised KeyError: \"no split 'test' in the "
                                         "dataset\"")
                       for target in ("xnnpack", "qnnpack")]
    assert report["exit_code"] == 1

    status, errors, _ = build(root, "verify:raising-xnnpack", "verify:raising-qnnpack")
    assert status != 0 and set(errors_expected) <= set(errors.splitlines())


@pytest.mark.slow
def test_labels_that_are_not_one_per_input_block_as_verify_fails_on_them(root, monkeypatch, capsys):
    path = write_recipe(root, "short_labels", "clean", [{"backend": "xnnpack"}], NCHW,
                        verify={"evaluation": {"function": "preflight_models:short_labels"}})
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    error = blocked_on_verify(report, "xnnpack", "verify:short_labels-xnnpack",
                              "recipes/short_labels.yaml: verify.evaluation.function: expected one label per input "
                              "(16), got a Tensor of shape [10]")

    status, errors, _ = build(root, "verify:short_labels-xnnpack")
    assert status != 0 and error in errors.splitlines()


@pytest.mark.slow
def test_portable_fallbacks_are_a_warning_and_the_program_builds(root):
    targets = [{"backend": "xnnpack", "runtime": "executorch"}]
    report = preflight.run(write_recipe(root, "partly", "cumulative", targets, NCHW), root)
    result = by_target(report, "xnnpack-executorch")
    assert result["delegate"] == "xnnpack" and result["made"] == "built"
    assert result["delegation"]["delegated_calls"] == 1 and result["delegation"]["fallback_calls"] == 1
    (fallback,) = result["findings"]  # outside the delegate: it builds, loads and runs on the portable kernels
    assert fallback["kind"] == "fallback" and fallback["where"] == "aten::cumsum.out"
    assert report["exit_code"] == 0 and report["blocking"] == 0

    status, errors, executed = build(root, "verify:partly-xnnpack-executorch")
    assert status == 0, errors
    assert executed == ["verify:partly-xnnpack-executorch"]  # the check made the program: only verify is left


@pytest.mark.slow
def test_a_missing_kernel_blocks_as_the_build_refuses_the_program(root):
    targets = [{"backend": "xnnpack", "runtime": "executorch"}]
    report = preflight.run(write_recipe(root, "missing", "inverse_error", targets, NCHW), root)
    (fails,) = of_kind(by_target(report, "xnnpack-executorch"), "build-fails")
    assert fails["where"] == "lower:missing-xnnpack-executorch"
    assert fails["detail"].startswith("recipes/missing.yaml: targets[0]: the program cannot load: ExecuTorch's "
                                      "runtime has no kernel for aten::erfinv.out")
    assert report["exit_code"] == 1

    status, errors, _ = build(root, fails["where"])
    assert status != 0 and f"ERROR: {fails['where']}: {fails['detail']}" in errors.splitlines()


@pytest.mark.slow
def test_a_check_after_a_build_rebuilds_nothing_and_a_build_after_a_check_reuses_it(tmp_path, monkeypatch, capsys):
    project = Project(tmp_path)
    (project.root / "preflight_models.py").write_text(MODELS)
    targets = [{"backend": "xnnpack"}, {"backend": "qnnpack"}, {"backend": "onnx"}]
    first = write_recipe(project.root, "first", "clean", targets)
    second = write_recipe(project.root, "second", "relu6", targets)
    monkeypatch.chdir(project.root)

    assert preflight.check_command([str(first)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" in ")[0] for line in lines[3:6]] == [
        "xnnpack (xnnpack, pytorch-mobile, fp32): built", "qnnpack (qnnpack, pytorch-mobile, int8): built",
        "onnx (onnx, onnxruntime, fp32): built"]
    _, _, executed = build(project.root, "first")
    assert not [name for name in executed if name.split(":")[0] in ("checkpoint", "fuse", "quantize", "script",
                                                                     "optimize", "onnx")], executed

    status, errors, _ = build(project.root, "second")
    assert status == 0, errors
    assert preflight.check_command([str(second), "--json"]) == 0
    captured = capsys.readouterr()
    assert [result["made"] for result in json.loads(captured.out)["targets"]] == ["up to date"] * 3
    # with --json, the header (recipe, families, model) and the target lines go to stderr
    assert len(captured.err.splitlines()) == 6


@pytest.mark.slow
def test_a_clean_model_exits_0_with_a_line_per_target(root, monkeypatch, capsys):
    path = write_recipe(root, "clean", "clean", [{"backend": "xnnpack"}, {"backend": "qnnpack"},
                                                 {"backend": "nnapi"}, {"backend": "onnx"}])
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    for target, route in (("xnnpack", "pytorch-mobile, fp32"), ("qnnpack", "pytorch-mobile, int8"),
                          ("nnapi", "pytorch-mobile, fp32"), ("onnx", "onnxruntime, fp32")):
        assert any(line.startswith(f"{target} (") and route in line and line.endswith(": ok") for line in lines)
    assert "    note: not run here: it runs only on an Android 8.1+ device with NNAPI" in lines
    assert lines[-1] == f"0 blocking, 0 advice: no blocking findings ({command.STRUCTURE_ONLY}) (exit 0)"


@pytest.mark.slow
@pytest.mark.skipif(hasattr(torch.ops.vulkan_prepack, "create_conv2d_context"), reason="this torch exports Vulkan")
def test_pytorch_mobile_vulkan_needs_a_vulkan_build(root, monkeypatch, capsys):
    path = write_recipe(root, "gpu", "clean", [{"backend": "vulkan"}, {"backend": "vulkan", "runtime": "executorch",
                                                                        "name": "et-vulkan"}], NCHW)
    monkeypatch.chdir(root)
    assert preflight.check_command([str(path), "--json", "--target", "vulkan"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [result["target"] for result in report["targets"]] == ["vulkan"]  # --target: the one asked for
    (needs,) = report["targets"][0]["findings"]
    assert needs["kind"] == "build-fails" and needs["where"] == "optimize:gpu-vulkan"
    assert "USE_VULKAN=1" in needs["detail"]


@pytest.mark.slow
def test_what_the_nnapi_converter_and_the_onnx_exporter_refuse_blocks(root):
    report = preflight.run(write_recipe(root, "relu6_inplace", "relu6_inplace", [{"backend": "nnapi"}]), root)
    (fails,) = of_kind(by_target(report, "nnapi"), "build-fails")
    assert fails["where"] == "nnapi:relu6_inplace-nnapi" and "aten::hardtanh_" in fails["detail"]

    report = preflight.run(write_recipe(root, "branchy", "branchy", [{"backend": "onnx"}]), root)
    (fails,) = of_kind(by_target(report, "onnx"), "build-fails")
    assert fails["where"] == "onnx:branchy-onnx" and "torch.export cannot capture" in fails["detail"]
    assert report["exit_code"] == 1


@pytest.mark.slow
def test_int8_operations_without_a_quantized_kernel_go_to_fx_graph_mode(root):
    """Eager mode has no kernel for `+` on quantized tensors; the model has no stubs of its own, so the quantize
    stage quantizes it in FX graph mode instead, and the check says which operations stay float."""
    report = preflight.run(write_recipe(root, "plain_add", "plain_add", [{"backend": "qnnpack"}]), root)
    qnnpack = by_target(report, "qnnpack")
    assert qnnpack["findings"] == [] and report["exit_code"] == 0
    (note,) = qnnpack["notes"]
    assert note == ("int8: eager mode cannot quantize the model, so the build quantized it in FX graph mode; "
                    "operations kept float: none")


def test_a_wide_where_never_runs_into_its_detail():
    where = "features.5.block.0.0 and 15 more features.5.block.0.0 and 15 more"  # wider than the column
    finding = {"target": "et", "kind": "advice", "detail": "Hardswish does not fuse", "where": where}
    report = {"recipe": "r", "file": "recipes/r.yaml", "versions": {}, "model": {"findings": [], "notes": []},
              "targets": [{"target": "et", "findings": [finding], "notes": []}], "blocking": 0, "exit_code": 0}
    assert f"    advice         {where}  Hardswish does not fuse" in command.footer(report)


def test_conv_bn_pairs_are_checked_on_a_model_with_a_dict_output():
    """A transformers-style dict output: torch.jit.trace refuses it unless strict=False, and check said so."""
    from mobilebuild.preflight.structure import unfolded_batch_norms

    class DictOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return {"features": self.norm(self.conv(x))}

    spec = {"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}
    found, notes = unfolded_batch_norms(DictOut().eval(), [spec])
    assert notes == []
    (pair,) = found
    assert pair["where"] == "norm after conv" and "list [conv, norm] in the recipe's `fuse`" in pair["detail"]


@pytest.mark.slow  # importing transformers takes seconds
def test_a_transformers_model_is_traced_for_conv_bn_pairs():
    """An outside model whose output is a dict (a ModelOutput): traced, so no note says it could not be checked."""
    import transformers

    from mobilebuild.preflight.structure import unfolded_batch_norms

    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    model = transformers.AutoModel.from_config(config).eval()
    spec = {"name": "input_ids", "shape": [1, 8], "dtype": "int64", "range": [0, 64], "memory_format": "contiguous"}
    assert unfolded_batch_norms(model, [spec]) == ([], [])
