"""GPU targets of PyTorch Mobile on a stock torch, and a target built by another interpreter (`toolchain:`)."""

import json
import stat
import sys

import pytest
from conftest import Project, tiny_recipe

from mobilebuild.results import release

pytestmark = pytest.mark.slow  # builds through real doit with another interpreter


@pytest.mark.parametrize(("backend", "build"), [("vulkan", "USE_VULKAN=1"), ("metal", "Metal export ops")])
def test_gpu_optimize_on_a_stock_torch_fails_in_one_line_naming_the_build(project, backend, build):
    project.write_recipe(tiny_recipe(targets=[{"backend": backend}]))
    result = project.run(f"optimize:tiny-{backend}", env={"MOBILEBUILD_CACHE": "off"})
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert result.returncode != 0 and "Traceback" not in result.stdout + result.stderr
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"ERROR: optimize:tiny-{backend}: recipes/tiny.yaml: targets[0]: "
                                f"optimize_for_mobile(backend='{backend}') needs a torch built with")
    assert build in errors[0] and "`runtime: executorch`" in errors[0] and "toolchain:" in errors[0]
    assert not project.artifact(f"tiny/tiny-{backend}.ptl").exists()


def interpreter_wrapper(path, marker, site=None):
    """An interpreter of its own for the test: this Python behind a script that leaves a mark when it starts, with
    `site` (distributions of other versions) first on its path."""
    prefix = f"PYTHONPATH={site}:$PYTHONPATH " if site else ""
    path.write_text(f"#!/bin/sh\necho started >> {marker}\n{prefix}exec {sys.executable} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_toolchain_interpreter_runs_the_targets_final_stage(tmp_path):
    project = Project(tmp_path / "repo")
    marker = tmp_path / "marks"
    interpreter_wrapper(tmp_path / "python-vulkan", marker)
    target = {"backend": "xnnpack", "toolchain": str(tmp_path / "python-vulkan")}
    project.write_recipe(tiny_recipe(targets=[target]))

    result = project.run("optimize", env={"MOBILEBUILD_CACHE": "off"})

    assert result.returncode == 0, result.stdout + result.stderr
    assert project.artifact("tiny/tiny-xnnpack.ptl").stat().st_size > 0
    # started once to read its versions (at task loading) and once as the stage worker
    assert marker.read_text().count("started") >= 2
    assert project.run("optimize", env={"MOBILEBUILD_CACHE": "off"}).stdout.count(".  ") == 0


def test_a_toolchain_that_is_not_an_interpreter_is_one_line(project, tmp_path):
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack", "toolchain": "../no/python"}]))
    result = project.run("invalid")  # the recipe alone: listing the others works
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "recipes/tiny.yaml: targets[0].toolchain: ../no/python is not an executable Python interpreter" in \
        result.stderr


def test_the_manifest_and_the_release_name_the_toolchain_that_built_a_target(tmp_path):
    """The toolchain's own versions, told apart here by an onnx distribution of version 99.0 only it can see."""
    project = Project(tmp_path / "repo")
    site = tmp_path / "other-site"
    (site / "onnx-99.0.dist-info").mkdir(parents=True)
    (site / "onnx-99.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: onnx\nVersion: 99.0\n")
    interpreter_wrapper(tmp_path / "python-other", tmp_path / "marks", site)
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack", "toolchain": str(tmp_path / "python-other")},
                                              {"backend": "qnnpack"}]))
    result = project.run(env={"MOBILEBUILD_CACHE": "off"})
    assert result.returncode == 0, result.stdout + result.stderr

    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    targets = {t["target"]: t for t in manifest["targets"]}
    assert targets["xnnpack"]["toolchain"]["onnx"] == "99.0"
    assert "toolchain" not in targets["qnnpack"] and manifest["toolchain"]["onnx"] != "99.0"
    assert str(tmp_path) not in project.artifact("tiny/manifest.json").read_text()
    files = release.collect(project.root, tmp_path / "release")["files"]
    assert files["tiny/tiny-xnnpack.ptl"]["toolchain"] == targets["xnnpack"]["toolchain"]
    assert files["tiny/tiny-qnnpack.ptl"]["toolchain"] == manifest["toolchain"]
