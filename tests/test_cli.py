"""The `mobilebuild` command: the same tasks as doit, and validation without a build."""

import subprocess
import sys
from pathlib import Path

from conftest import tiny_recipe

MOBILEBUILD = str(Path(sys.executable).with_name("mobilebuild"))


def mobilebuild(project, *args):
    return subprocess.run([MOBILEBUILD, *args], cwd=project.root, capture_output=True, text=True, timeout=600)


def test_validate_accepts_good_recipes(project):
    project.write_recipe(tiny_recipe())
    result = mobilebuild(project, "validate")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok recipes/tiny.yaml: tiny -> xnnpack, qnnpack"


def test_validate_reports_each_problem_in_one_line_without_a_traceback(project):
    bad = project.write_recipe({**tiny_recipe(), "targets": [{"backend": "xnnpak"}, {"backend": "vulkan"}]})
    project.write_recipe(tiny_recipe("other", script="compile"))
    result = mobilebuild(project, "validate", str(bad), "recipes/other.yaml")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        'recipes/tiny.yaml: targets[0].backend: expected one of "xnnpack", "qnnpack", "vulkan", "metal", "nnapi", '
        '"onnx", got "xnnpak"',
        'recipes/other.yaml: script: expected one of "script", "trace", got "compile"',
    ]


def test_validate_reports_unbuildable_targets(project):
    project.write_recipe({**tiny_recipe(), "targets": [{"backend": "vulkan"}]})
    result = mobilebuild(project, "validate")
    assert result.returncode == 1
    assert result.stderr.startswith("recipes/tiny.yaml: targets[0]: backend 'vulkan' with runtime 'pytorch-mobile' "
                                    "is not buildable")


def test_build_runs_the_doit_tasks(project):
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}]))
    first = mobilebuild(project, "build")
    assert first.returncode == 0, first.stdout + first.stderr
    assert ".  optimize:tiny-xnnpack" in first.stdout
    assert (project.root / "artifacts/tiny/tiny-xnnpack.ptl").is_file()
    again = mobilebuild(project, "build")
    assert "-- optimize:tiny-xnnpack" in again.stdout and ".  " not in again.stdout
    listed = mobilebuild(project, "list")
    assert "optimize:tiny-xnnpack" in listed.stdout
