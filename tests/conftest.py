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


@pytest.fixture(scope="session", autouse=True)
def no_arm64_environment(tmp_path_factory):
    """The tests' builds plan no node on emulated ARM CPUs, whatever `mobilebuild arm64 setup` made on this machine:
    the tests of those nodes make an environment of their own (tests/test_arm64.py)."""
    os.environ["MOBILEBUILD_ARM64_HOME"] = str(tmp_path_factory.mktemp("no-arm64"))


@pytest.fixture(scope="session", autouse=True)
def private_measure_lock(private_artifact_cache, tmp_path_factory):
    """The tests' stages and measurements take a measure-alone lock of their own (worker/measure_alone.py keeps it
    in the temporary folder, shared by every build of this user on this host): a benchmark of another checkout's
    build on the same machine would otherwise hold the tests' stages still for as long as it measures."""
    import tempfile

    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))  # the stage workers and subprocesses inherit it
    tempfile.tempdir = None  # read TMPDIR again
    yield
    if before is None:
        os.environ.pop("TMPDIR")
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Stages called in-process here compute on one thread, as the build's stage workers do (OMP_NUM_THREADS=1,
    engine/worker_pool.py). torch's default, a thread per core, makes the tiny models' operators wait on each other
    (ten times slower on a busy 2-core machine); timing.py sets the recipe's own count where a test measures."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

def pytest_collection_finish(session):
    """Each library's one-time start-up in this process, paid once before the first test, so that `--durations`
    charges no test with it: ExecuTorch's (its imports, torch.export's first capture, the XNNPACK pattern graphs it
    builds on its first lowering: about 7 s of CPU), LiteRT's (litert-torch's imports and first conversion) and ONNX
    Runtime's (torch.onnx's exporter, its first export and a first session), each only where a
    collected test module imports that route's stage."""
    import sys
    import tempfile

    warm = {"mobilebuild.routes.executorch.worker.lower": _lower_once,
            "mobilebuild.routes.litert.worker.litert": _convert_once,
            "mobilebuild.routes.onnx.worker.export": _export_once}
    wanted = [start for module, start in warm.items() if module in sys.modules]
    if wanted and session.items:
        with tempfile.TemporaryDirectory() as folder:
            for start in wanted:
                start(Path(folder))


TINY_IMAGE = {"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}


def _tiny_convnet():
    import torch

    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()


def _run_once(folder, suffix, data, runtime):
    """The artifact `data` written and run once by its runtime module (worker/runtimes)."""
    from types import SimpleNamespace

    from mobilebuild.worker.stages import modeling

    path = folder / f"warm{suffix}"
    path.write_bytes(data)
    program = runtime.load(path, SimpleNamespace(inputs=[TINY_IMAGE], timing={"threads": 1}))
    program(*modeling.example_inputs([TINY_IMAGE]))


def _lower_once(folder):
    from mobilebuild.routes.executorch.worker import lower
    from mobilebuild.routes.executorch.worker import runtime as executorch

    _run_once(folder, ".pte", lower.lower_to_bytes(_tiny_convnet(), [TINY_IMAGE], "xnnpack"), executorch)


def _export_once(folder):
    from mobilebuild.routes.onnx.worker import export
    from mobilebuild.routes.onnx.worker import runtime as onnxruntime

    _run_once(folder, ".onnx", export.export_float(_tiny_convnet(), [TINY_IMAGE]).SerializeToString(), onnxruntime)


def _convert_once(folder):
    from mobilebuild.routes.litert.worker import litert
    from mobilebuild.routes.litert.worker import runtime as litert_runtime

    with litert.converting():
        data = litert.convert(_tiny_convnet(), [TINY_IMAGE])
    _run_once(folder, ".tflite", data, litert_runtime)


# The token input of tiny_models' Transformers, as test_export, test_layers and test_layers_onnx declare it.
TOKENS = {"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100], "memory_format": "contiguous",
          "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}
TOKENS_AND_MASK = [{**TOKENS, "name": name, "range": [0, high]} for name, high in (("ids", 100), ("mask", 2))]


def _int8_onnx(tmp_path_factory, factory, mode):
    """An int8 ONNX export of tiny_models' `factory` by the export stage: a namespace of its folder (fused.pt in it,
    as the fuse stage stores the model), the settings that rebuild the model, the .onnx and what the stage printed.
    tiny_transformer takes TOKENS, tiny_encoder TOKENS_AND_MASK; static mode calibrates on 8 random batches."""
    import contextlib
    import io
    from types import SimpleNamespace

    import tiny_models

    from mobilebuild.routes.onnx.plan import ExportConfig
    from mobilebuild.routes.onnx.worker import export
    from mobilebuild.worker import reproducible

    folder = tmp_path_factory.mktemp(f"{factory}-{mode}")
    rebuild = tiny_models.stored_fused(getattr(tiny_models, factory)(), folder / "fused.pt", f"tiny_models:{factory}")
    inputs = TOKENS_AND_MASK if factory == "tiny_encoder" else [TOKENS]
    calibration = {"source": "random", "batches": 8, "seed": 0} if mode == "static" else None
    config = ExportConfig(precision="int8", inputs=inputs, options={}, mode=mode, calibration=calibration, **rebuild)
    printed = io.StringIO()
    with reproducible.plain_attention(), contextlib.redirect_stdout(printed):  # as every stage runs
        export.run({"model": folder / "fused.pt"}, config, folder / f"{mode}.onnx")
    return SimpleNamespace(folder=folder, rebuild=rebuild, path=folder / f"{mode}.onnx", printed=printed.getvalue())


# Int8 ONNX exports that several test files read, made once per test process (an export takes a second or more,
# whatever the model's size) and in a fixture's setup, so that no test's own time pays for one.
@pytest.fixture(scope="session")
def transformer_static_onnx(tmp_path_factory):
    return _int8_onnx(tmp_path_factory, "tiny_transformer", "static")


@pytest.fixture(scope="session")
def transformer_dynamic_onnx(tmp_path_factory):
    return _int8_onnx(tmp_path_factory, "tiny_transformer", "dynamic")


@pytest.fixture(scope="session")
def encoder_static_onnx(tmp_path_factory):
    return _int8_onnx(tmp_path_factory, "tiny_encoder", "static")


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
