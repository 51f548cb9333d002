import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import mobilebuild.routes  # noqa: F401 - the built-in route families, as mobilebuild.tasks and the CLI register them

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def private_artifact_cache(tmp_path_factory):
    """The tests' builds share one artifact cache of their own, never the user's (~/.cache/mobilebuild)."""
    if "MOBILEBUILD_CACHE" not in os.environ:
        os.environ["MOBILEBUILD_CACHE"] = str(tmp_path_factory.mktemp("artifact-cache"))

# A tiny model with the layout that trips optimize_for_mobile on traced modules: Conv(bias=False) then BatchNorm.
TINYNET = textwrap.dedent('''
    import torch
    from torch import nn


    class TinyNet(nn.Module):
        def __init__(self, width=4):
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.conv = nn.Conv2d(3, width, 3, bias=False)
            self.bn = nn.BatchNorm2d(width)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(width, width, 3, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.head = nn.Linear(width * 4 * 4, 5)
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x):
            x = self.bn2(self.conv2(self.relu(self.bn(self.conv(self.quant(x))))))
            return self.dequant(self.head(torch.flatten(x, 1)))


    def make(width=4):
        return TinyNet(width)
''')


def tiny_recipe(name="tiny", **overrides):
    recipe = {
        "name": name,
        "model": {"factory": "tinynet:make", "seed": 0, "batchnorm_stats": 2},
        "input": {"shape": [1, 3, 8, 8]},
        "quantize": {"calibration": {"source": "random", "batches": 16, "seed": 0}},
        "script": "trace",
        "benchmark": {"warmup": 1, "iters": 5},
        "targets": [{"backend": "xnnpack"}, {"backend": "qnnpack"}],
    }
    recipe.update(overrides)
    return recipe


class Project:
    """A throwaway repository with the real dodo.py, driven by real doit in a subprocess."""

    def __init__(self, root):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "dodo.py", root / "dodo.py")
        (root / "tinynet.py").write_text(TINYNET)
        (root / "recipes").mkdir()

    def write_recipe(self, recipe, file=None):
        path = self.root / "recipes" / (file or f"{recipe['name']}.yaml")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    def run(self, *args, env=None):
        return subprocess.run([sys.executable, "-m", "doit", *args], cwd=self.root, capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=600)

    def doit(self, *args):
        """Run doit with the JSON reporter; return the names of the tasks that actually executed."""
        result = self.run("-r", "json", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(result.stdout)
        return sorted(t["name"] for t in report["tasks"] if t["result"] == "success" and ":" in t["name"])

    def artifact(self, relative):
        return self.root / "artifacts" / relative


def checkouts(tmp_path, *names, recipe=None):
    """Projects side by side below tmp_path (checkouts of one repository), each with the same recipe."""
    projects = [Project(tmp_path / name) for name in names]
    for project in projects:
        project.write_recipe(recipe or tiny_recipe())
    return projects


@pytest.fixture
def project(tmp_path):
    return Project(tmp_path)


@pytest.fixture
def no_build(monkeypatch):
    """`mobilebuild check` with the build's tasks replaced by a stand-in that makes nothing: what is left is what the
    check computes itself (the model's structure and advice, the interface findings)."""
    from mobilebuild.preflight import shipped, whole_recipe

    def make(task_names, finished, verify_tasks=None):
        for name in task_names:
            finished(name, shipped.Outcome("failed", name, "not made: the build's tasks are not run in this test"))
        return 1

    monkeypatch.setattr(whole_recipe, "make", make)


@pytest.fixture
def poisoned_torch(tmp_path):
    """A PYTHONPATH entry whose `torch` raises on import: proves a command never imports it."""
    shim = tmp_path / "poison"
    (shim / "torch").mkdir(parents=True)
    (shim / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    return {"PYTHONPATH": str(shim)}
