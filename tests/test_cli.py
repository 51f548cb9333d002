"""The `mobilebuild` command: the same tasks as doit, and validation without a build."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, Project, tiny_recipe

from mobilebuild import cli
from mobilebuild.plan import routes

pytestmark = pytest.mark.slow  # the mobilebuild command building through doit

MOBILEBUILD = str(Path(sys.executable).with_name("mobilebuild"))


def mobilebuild(project, *args):
    return subprocess.run([MOBILEBUILD, *args], cwd=project.root, capture_output=True, text=True, timeout=600)


def test_validate_accepts_good_recipes(project):
    project.write_recipe(tiny_recipe())
    result = mobilebuild(project, "validate")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ok recipes/tiny.yaml: tiny -> xnnpack, qnnpack", cli.GRAMMAR_ONLY]


def test_validate_reports_each_problem_in_one_line_without_a_traceback(project):
    bad = project.write_recipe({**tiny_recipe(), "targets": [{"backend": "xnnpak"}, {"backend": "vulkan"}]})
    project.write_recipe(tiny_recipe("other", script="compile"))
    result = mobilebuild(project, "validate", str(bad), "recipes/other.yaml")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    backends = ", ".join(f'"{backend}"' for backend in routes.backends())  # the registered families'
    assert result.stderr.splitlines() == [
        f'recipes/tiny.yaml: targets[0].backend: expected one of {backends}, got "xnnpak"; did you mean "xnnpack"?',
        'recipes/other.yaml: script: expected one of "script", "trace", got "compile"',
    ]


def test_validate_reports_unbuildable_targets(project):
    project.write_recipe({**tiny_recipe(), "targets": [{"backend": "nnapi", "runtime": "executorch"}]})
    result = mobilebuild(project, "validate")
    assert result.returncode == 1
    assert result.stderr.startswith("recipes/tiny.yaml: targets[0]: backend 'nnapi' with runtime 'executorch' "
                                    "is not buildable")


def test_build_runs_the_doit_tasks(project):
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}]))
    first = mobilebuild(project, "build")
    assert first.returncode == 0, first.stdout + first.stderr
    assert ".  optimize:tiny-xnnpack" in first.stdout
    assert (project.root / "artifacts/tiny/tiny-xnnpack.ptl").is_file()
    again = mobilebuild(project, "build")
    assert again.stdout.splitlines()[-1].startswith("all ") and again.stdout.splitlines()[-1].endswith(
        " tasks up to date: nothing to do") and ".  " not in again.stdout and "-- " not in again.stdout
    assert "-- optimize:tiny-xnnpack" in mobilebuild(project, "build", "-r", "verbose").stdout
    listed = mobilebuild(project, "list")
    assert "optimize:tiny-xnnpack" in listed.stdout
    assert mobilebuild(project, "graph").returncode == 0
    built = len([p for p in (project.root / "artifacts").rglob("*") if p.is_file()])
    cleaned = mobilebuild(project, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.splitlines() == [f"removed {built} files (artifacts/, release/)"]
    assert not (project.root / "artifacts").exists()  # the graph's files too


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One tiny project, built once, for the commands that read what a build left."""
    project = Project(tmp_path_factory.mktemp("built"))
    project.write_recipe(tiny_recipe())
    project.doit()
    return project


def test_report_rewrites_the_report_without_building(built):
    (built.root / "artifacts" / "report.md").unlink()
    result = mobilebuild(built, "report")
    assert result.returncode == 0, result.stderr
    assert ".  " not in result.stdout  # no task ran
    report = (built.root / "artifacts" / "report.md").read_text()
    assert "## tiny" in report and "| xnnpack | passed | PyTorch Mobile, xnnpack, fp32 |" in report
    assert (built.root / "artifacts" / "plots" / "tiny.png").is_file()


def test_graph_writes_dot_with_the_dependencies(built):
    result = mobilebuild(built, "graph", "-o", "graph.dot")
    assert result.returncode == 0, result.stderr
    dot = (built.root / "graph.dot").read_text()
    assert dot.startswith("digraph mobilebuild {")
    for edge in ['"fuse:tiny" -> "script:tiny-fp32"', '"optimize:tiny-xnnpack" -> "verify:tiny-xnnpack"',
                 '"checkpoint:tiny" -> "bench:tiny-eager"', '"quantize:tiny-qnnpack" -> "script:tiny-int8-qnnpack"']:
        assert edge in dot


def test_report_and_graph_are_doit_commands_through_pyproject(built):
    (built.root / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    result = built.run("graph", "-o", "from-doit.dot")
    assert result.returncode == 0, result.stderr
    assert (built.root / "from-doit.dot").read_text().startswith("digraph")
    assert built.run("report").returncode == 0


def test_bench_gate_passes_on_its_own_baseline_and_fails_on_a_faster_one(built):
    saved = built.root / "baseline.json"
    assert mobilebuild(built, "bench", "--save-baseline", str(saved)).returncode == 0
    medians = json.loads(saved.read_text())["median_ms"]
    assert set(medians) == {"tiny/eager", "tiny/xnnpack", "tiny/qnnpack"}
    assert mobilebuild(built, "bench", "--baseline", str(saved), "--tolerance", "5").returncode == 0
    saved.write_text(json.dumps({"median_ms": {key: value / 100 for key, value in medians.items()}}))
    result = mobilebuild(built, "bench", "--baseline", str(saved))
    assert result.returncode == 1
    assert "3 target(s) slower than the baseline by more than 10%: tiny/eager" in result.stderr


def test_build_by_recipe_file_or_folder_and_a_task_per_recipe(project):
    one_target = {"targets": [{"backend": "xnnpack"}]}
    project.write_recipe(tiny_recipe("solo", **one_target))
    project.write_recipe(tiny_recipe("team_a", **one_target), file="team/a.yaml")
    project.write_recipe(tiny_recipe("team_b", **one_target), file="team/b.yaml")
    project.write_recipe({"name": "broken", "model": {"factory": "tinynet:make"}}, file="team/broken.yaml")

    folder = mobilebuild(project, "build", "recipes/team")

    assert folder.returncode != 0  # for the broken recipe, the one line naming it
    errors = [line for line in folder.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith("ERROR: invalid:recipes/team/broken.yaml: ")
    built = sorted(p.parent.name for p in (project.root / "artifacts").glob("*/verify-xnnpack.json"))
    assert built == ["team_a", "team_b"]  # verified, and benchmarked:
    assert (project.root / "artifacts/team_b/bench-xnnpack.json").is_file()
    assert not (project.root / "artifacts/solo").exists()

    by_task = project.run("solo")  # doit <recipe>
    assert by_task.returncode == 0, by_task.stderr
    assert (project.root / "artifacts/solo/manifest.json").is_file()
    again = mobilebuild(project, "build", "recipes/solo.yaml")
    assert again.returncode == 0 and again.stdout.strip().startswith("all ")

    wrong = mobilebuild(project, "build", "README.yaml")
    assert wrong.returncode == 2
    assert wrong.stderr == ("mobilebuild build: README.yaml is not a recipe of this repository (recipes live in "
                            "recipes/ as .yaml files)\n")
