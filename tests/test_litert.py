"""The LiteRT route family: the litert stage (fp32, fp16 weights, int8 static with float or int8 I/O, int8 dynamic)
and the litert runtime, on tiny models: numerics against eager, what the file holds, one-line errors, quiet
conversion and reproducible bytes."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import tiny_models
import torch
from torch import nn

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.results import release
from mobilebuild.routes.litert import plan as litert_route
from mobilebuild.routes.litert.plan import ConvertConfig
from mobilebuild.routes.litert.worker import layers as litert_layers
from mobilebuild.routes.litert.worker import litert, runtime
from mobilebuild.worker import reproducible
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import fuse, modeling

REPO = Path(__file__).resolve().parents[1]
INPUT = {"name": "input", "shape": [1, 3, 16, 16], "dtype": "float32", "memory_format": "contiguous"}
CALIBRATION = {"source": "random", "batches": 8, "seed": 0}
FP32_DB = 60.0
FP16_DB = 45.0
INT8_DB = 15.0


def make(seed=0):
    torch.manual_seed(seed)
    return tiny_models.randomize_batchnorm(tiny_models.ConvNet(), seed=seed)


def convert_to(fused, folder, name, precision="fp32", options=None, **quantization):
    path, rebuild = fused
    output = Path(folder) / f"{name}.tflite"
    config = ConvertConfig(precision=precision, inputs=[INPUT], options=options or {},
                           calibration=CALIBRATION if precision == "int8" and quantization.get("mode") != "dynamic"
                           else None, **quantization, **rebuild)
    litert.run({"model": path}, config, output)
    return output


def run_tflite(path, *inputs, threads=1):
    return runtime.load(path, SimpleNamespace(timing={"threads": threads}))(*inputs)


class Conversions(dict):
    """The fixture's values; its "fp32" and "int8" conversions are made when a test first reads them (converting is
    the slow part, about a second each), so that no one test's setup pays for both."""

    def __missing__(self, precision):
        self[precision] = convert_to(self["fused"], self["folder"], precision, precision)
        return self[precision]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The model's eager outputs and its fp32 and int8 conversions."""
    folder = tmp_path_factory.mktemp("litert")
    model = make()
    x = modeling.example_inputs([INPUT], seed=100)[0]  # not one of the calibration batches
    with torch.no_grad():
        reference = model(x)
    path = folder / "fused.pt"
    fused = path, tiny_models.stored_fused(fuse.fuse(model, "auto")[0], path)
    return Conversions(x=x, reference=reference, fused=fused, folder=folder)


def test_fp32_conversion_matches_the_eager_model(converted):
    assert sqnr_db(converted["reference"], run_tflite(converted["fp32"], converted["x"])) > FP32_DB
    facts = runtime.inspect(converted["fp32"], None)
    assert facts["int8_operators"] == 0 and facts["constant_dtypes"].get("int8") is None
    assert facts["float_weight_share"] == 1.0 and "% of the weight bytes" not in litert_route.structure(facts)
    assert [(i["shape"], i["dtype"]) for i in facts["inputs"]] == [([1, 3, 16, 16], "float32")]
    assert [(o["shape"], o["dtype"]) for o in facts["outputs"]] == [([1, 10], "float32")]


def test_int8_static_is_fully_integer_with_float_io_by_default(converted):
    output = run_tflite(converted["int8"], converted["x"])
    assert INT8_DB < sqnr_db(converted["reference"], output) < FP32_DB  # close, yet really int8
    facts = runtime.inspect(converted["int8"], None)
    assert facts["inputs"][0]["dtype"] == facts["outputs"][0]["dtype"] == "float32"
    assert facts["op_types"]["QUANTIZE"] >= 1 and facts["op_types"]["DEQUANTIZE"] >= 1
    assert facts["int8_operators"] >= 3  # two convolutions and the classifier at least
    assert facts["float_weight_share"] == 0 and facts["weight_bytes"]["quantized"] > 16 * 8 * 9
    assert converted["int8"].stat().st_size < converted["fp32"].stat().st_size


def test_int8_io_keeps_the_converters_int8_tensors_and_the_runtime_quantizes_them(converted, tmp_path):
    int8_io = convert_to(converted["fused"], tmp_path, "io", "int8", options={"io": "int8"})
    facts = runtime.inspect(int8_io, None)
    assert facts["inputs"][0]["dtype"] == "int8" and facts["inputs"][0]["scale"] > 0
    assert facts["outputs"][0]["dtype"] == "int8"
    floated = run_tflite(converted["int8"], converted["x"])
    assert sqnr_db(floated, run_tflite(int8_io, converted["x"])) > 40  # the same model, its I/O moved to the app


def test_fp16_weights_halve_the_file_and_stay_close(converted, tmp_path):
    half = convert_to(converted["fused"], tmp_path, "fp16", options={"weights": "fp16"})
    assert FP16_DB < sqnr_db(converted["reference"], run_tflite(half, converted["x"]))
    assert "float16" in runtime.inspect(half, None)["constant_dtypes"]
    assert half.stat().st_size < converted["fp32"].stat().st_size  # a tiny model: the file is mostly its structure


def test_int8_dynamic_quantizes_weights_without_calibration(converted, tmp_path):
    dynamic = convert_to(converted["fused"], tmp_path, "dynamic", "int8", mode="dynamic")
    assert INT8_DB < sqnr_db(converted["reference"], run_tflite(dynamic, converted["x"]))
    facts = runtime.inspect(dynamic, None)
    assert facts["constant_dtypes"].get("int8", 0) >= 3
    assert facts["inputs"][0]["dtype"] == "float32"


class Clip(nn.Module):
    """A Conv3d (litert-torch converts its PT2E-quantized form to a float CONV_3D) and an int8 classifier."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 16, 3)
        self.head = nn.Linear(16, 4)

    def forward(self, clip):
        return self.head(self.conv(clip).mean((2, 3, 4)))


def test_an_int8_file_that_keeps_most_weights_float_says_so(tmp_path, capfd):
    torch.manual_seed(0)
    path = tmp_path / "fused.pt"
    rebuild = tiny_models.stored_fused(Clip().eval(), path)
    clip = {**INPUT, "name": "clip", "shape": [1, 3, 4, 8, 8]}
    config = ConvertConfig(precision="int8", inputs=[clip], options={}, calibration=CALIBRATION, **rebuild)
    litert.run({"model": path}, config, tmp_path / "clip.tflite")
    printed = capfd.readouterr().out
    facts = runtime.inspect(tmp_path / "clip.tflite", None)
    assert facts["float_weight_share"] > 0.9 and next(iter(facts["float_weights_by_operator"])) == "CONV_3D", facts
    assert facts["weight_bytes"]["float"] > 16 * 3 * 27 * 4 > facts["weight_bytes"]["quantized"], facts
    assert [line.strip() for line in printed.splitlines()] == [
        f"warning: {round(100 * facts['float_weight_share'])}% of the int8 model's weight bytes stay float, read by "
        "CONV_3D (99%), ADD (1%); the converter left those operators float"], printed
    assert "% of the weight bytes float" in litert_route.structure(facts)


TOKENS = {"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100], "memory_format": "contiguous"}


def test_int8_dynamic_runs_a_transformer_with_its_token_embedding(tmp_path):
    """PT2E's dynamic conversion gave the embedding table a zero point LiteRT's EMBEDDING_LOOKUP refused at load;
    ai-edge-quantizer's dynamic-range recipe keeps it symmetric."""
    model = tiny_models.tiny_transformer()
    rebuild = tiny_models.stored_fused(model, tmp_path / "fused.pt", "tiny_models:tiny_transformer")
    config = ConvertConfig(precision="int8", inputs=[TOKENS], options={}, mode="dynamic", **rebuild)
    with reproducible.plain_attention():  # as every stage runs
        litert.run({"model": tmp_path / "fused.pt"}, config, tmp_path / "dynamic.tflite")
        ids = modeling.example_inputs([TOKENS], seed=5)[0]
        with torch.no_grad():
            expected = model.eval()(ids)
    assert sqnr_db(expected, run_tflite(tmp_path / "dynamic.tflite", ids)) > 25
    assert runtime.inspect(tmp_path / "dynamic.tflite", None)["constant_dtypes"]["int8"] >= 4


@pytest.mark.parametrize("excluded", ["head", "features.3"])  # the classifier; a convolution in the middle
def test_exclude_keeps_a_module_float(converted, tmp_path, excluded):
    kept = convert_to(converted["fused"], tmp_path, "kept", "int8", exclude=[excluded])
    facts, whole = runtime.inspect(kept, None), runtime.inspect(converted["int8"], None)
    assert facts["constant_dtypes"].get("float32", 0) > whole["constant_dtypes"].get("float32", 0)
    assert facts["int8_operators"] < whole["int8_operators"]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_conversion_is_quiet_and_byte_identical_from_run_to_run(converted, tmp_path, capfd, precision):
    again = convert_to(converted["fused"], tmp_path, "again", precision)
    printed = capfd.readouterr()
    assert again.read_bytes() == converted[precision].read_bytes()
    assert "LiteRT-Torch Convert" not in printed.out and "I0000" not in printed.err, printed
    assert "" not in (printed.out + printed.err).splitlines(), printed  # not even an empty line



CHECKOUT_SCRIPT = textwrap.dedent("""
    from pathlib import Path

    import mobilebuild
    assert Path(mobilebuild.__file__).resolve().is_relative_to(Path.cwd().resolve()), mobilebuild.__file__
    import tiny_models
    from test_litert import convert_to, fuse, make

    fused = Path("fused.pt"), tiny_models.stored_fused(fuse.fuse(make(), "auto")[0], Path("fused.pt"))
    convert_to(fused, ".", "fp32")
    convert_to(fused, ".", "int8", "int8")
""")


@pytest.mark.slow
def test_conversions_are_byte_identical_across_checkouts(tmp_path):
    """Two copies of the code (package, model source) at different absolute paths, run from their own folders: the
    converter records module class names and attribute paths, no file path and no time."""
    runs = []
    for checkout in (tmp_path / "a", tmp_path / "elsewhere" / "checkout-b"):
        shutil.copytree(REPO / "mobilebuild", checkout / "mobilebuild", ignore=shutil.ignore_patterns("__pycache__"))
        for module in ("test_litert.py", "tiny_models.py"):
            shutil.copy(REPO / "tests" / module, checkout / module)
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        runs.append((checkout, subprocess.Popen([sys.executable, "-c", CHECKOUT_SCRIPT], cwd=checkout, env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for checkout, process in runs:
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output
    (a, _), (b, _) = runs
    for name in ("fp32", "int8"):
        assert (a / f"{name}.tflite").read_bytes() == (b / f"{name}.tflite").read_bytes(), name
        assert str(a).encode() not in (a / f"{name}.tflite").read_bytes()

class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_a_model_torch_export_refuses_is_one_line(tmp_path):
    path = tmp_path / "fused.pt"
    fused = path, tiny_models.stored_fused(DataDependent(), path)
    with pytest.raises(MobileBuildError) as caught:
        convert_to(fused, tmp_path, "refused")
    assert "\n" not in caught.value.message and "LiteRT" in caught.value.message
    assert not (tmp_path / "refused.tflite").exists()


class TwoInputs(nn.Module):
    """Two typed inputs (an image and token ids) and a structured output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.embed = nn.Embedding(20, 4)

    def forward(self, image, ids):
        pooled = self.conv(image).mean((2, 3))
        return {"score": pooled + self.embed(ids).mean(1), "parts": (pooled, self.embed(ids).sum(1))}


def test_several_typed_inputs_and_a_structured_output(tmp_path):
    torch.manual_seed(0)
    model = TwoInputs().eval()
    specs = [{**INPUT, "name": "image"}, {"name": "ids", "shape": [1, 6], "dtype": "int64", "range": [0, 20],
                                          "memory_format": "contiguous"}]
    path = tmp_path / "fused.pt"
    rebuild = tiny_models.stored_fused(model, path)
    config = ConvertConfig(precision="fp32", inputs=specs, options={}, **rebuild)
    litert.run({"model": path}, config, tmp_path / "two.tflite")
    examples = modeling.example_inputs(specs, seed=3)
    produced = run_tflite(tmp_path / "two.tflite", *examples)
    with torch.no_grad():
        expected = model(*examples)
    for found, wanted in zip(produced, (expected["score"], *expected["parts"]), strict=True):
        assert sqnr_db(wanted, found) > FP32_DB
    facts = runtime.inspect(tmp_path / "two.tflite", None)
    assert facts["inputs"][1]["dtype"] == "int32"  # narrowed by the converter
    # the recipe's input names, in the signature an app calls by name and in the input tensors
    assert [found["name"] for found in facts["inputs"]] == ["serving_default_image", "serving_default_ids"]
    named = runtime.interpreter(tmp_path / "two.tflite").get_signature_runner()
    by_name = named(image=examples[0].numpy(), ids=examples[1].numpy().astype("int32"))
    assert sqnr_db(expected["score"], torch.from_numpy(by_name["score"])) > FP32_DB


# --- the per-layer comparison ------------------------------------------------------------------------------------

def test_the_converters_tensor_names_map_back_to_module_paths():
    model = fuse.fuse(make(), "auto")[0]
    known = litert_layers.locations(model)
    conv = next(name for name in known if name.endswith("_0") and "features" in name)
    assert litert_layers.module_of(f"{conv};1", known)[0] == "features.0"
    assert litert_layers.module_of(f"somewhere.else.Wrapper;1;;{conv};2", known) is None  # the first location counts


def test_layers_compares_each_int8_tensor_with_the_float_module_it_names(converted):
    model = fuse.load(converted["fused"][0], SimpleNamespace(**converted["fused"][1]))
    config = SimpleNamespace(**converted["fused"][1])
    chunks = [modeling.example_inputs([INPUT], seed=200 + i) for i in range(4)]
    errors, method, detail = litert_layers.compare({"model": converted["fused"][0], "artifact": converted["int8"]},
                                                   config, chunks)
    ranked, _ = errors.results()
    assert method == "litert" and "cumulative" in detail
    names = {row["name"] for row in ranked}
    assert names & {path for path, _ in model.named_modules() if path.startswith("features")}, ranked
    assert all(INT8_DB < row["sqnr_db"] < FP32_DB for row in ranked), ranked


class TorchvisionBlocks(nn.Module):
    """torchvision's own Conv-BN-Hardswish blocks, whose activation runs in place on the convolution's output (as in
    MobileNetV3), with a squeeze-excitation (float hard-sigmoid between QUANTIZE and DEQUANTIZE in LiteRT) between."""

    def __init__(self):
        super().__init__()
        from torchvision.ops.misc import Conv2dNormActivation, SqueezeExcitation

        self.features = nn.Sequential(Conv2dNormActivation(3, 8, activation_layer=nn.Hardswish),
                                      SqueezeExcitation(8, 4, scale_activation=nn.Hardsigmoid),
                                      Conv2dNormActivation(8, 16, activation_layer=nn.Hardswish))
        nn.init.constant_(self.features[1].fc1.bias, 1.0)  # random weights all but kill its ReLU's output
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def layers_and_whole(path, config, artifact, specs, batches=4):
    """The per-layer comparison's rows (and its method detail) and the whole model's SQNR, on the same batches."""
    chunks = [modeling.example_inputs(specs, seed=200 + i) for i in range(batches)]
    errors, _, detail = litert_layers.compare({"model": path, "artifact": artifact}, config, chunks)
    model = fuse.load(path, config).eval()
    with torch.no_grad():
        whole = min(sqnr_db(model(*chunk), run_tflite(artifact, *chunk)) for chunk in chunks)
    return errors.results()[0], detail, whole


@pytest.mark.slow
def test_layers_compare_a_convolution_before_its_in_place_activation(tmp_path):
    """The float model's output of a module is read before an in-place activation after it overwrites it: torchvision's
    Conv2d ahead of a Hardswish(inplace=True) read as the Hardswish's output gave about 0 dB on every such layer while
    the whole model kept its SQNR. And the quantized output of a float-computed activation maps to its module. (Slow:
    its int8 conversion alone takes about 2.8 s on an idle core.)"""
    torch.manual_seed(0)
    model = tiny_models.randomize_batchnorm(TorchvisionBlocks())
    path = tmp_path / "fused.pt"
    fused = path, tiny_models.stored_fused(fuse.fuse(model, "auto")[0], path)
    artifact = convert_to(fused, tmp_path, "int8", "int8")
    rows, detail, whole = layers_and_whole(path, SimpleNamespace(**fused[1]), artifact, [INPUT])
    compared = {row["name"]: row["sqnr_db"] for row in rows}
    assert {"features.0.0", "features.2.0", "features.1.scale_activation"} <= compared.keys(), rows
    assert all(compared[conv] > whole - 6 for conv in ("features.0.0", "features.2.0")), (whole, rows)
    assert min(compared.values()) > INT8_DB, rows  # the squeeze-excitation's 4-value tensors lose the most
    assert "map to no module" in detail and "QUANTIZE" in detail, detail  # the model input's, named by operator


@pytest.mark.slow
def test_layers_of_torchvisions_mobilenet_v3_stay_near_the_whole_models_sqnr(tmp_path):
    """torchvision's MobileNetV3-Small (random weights, batch-norm statistics re-estimated), int8: before the float
    outputs were copied, its Conv2d layers ahead of in-place Hardswish read -1.4 to -0.2 dB with the whole model at
    14 dB (the zoo showed the same at 24 dB); the squeeze-excitations' float Hardsigmoid had no row."""
    from mobilebuild.worker.stages import checkpoint

    spec = {**INPUT, "shape": [1, 3, 64, 64]}
    rebuild = {"model": {"torchvision": "mobilenet_v3_small"}, "fuse": "auto"}
    model = modeling.build_model(rebuild["model"], seed=0)
    checkpoint.reestimate_batchnorm(model, [spec], 2, 0)
    path = tmp_path / "fused.pt"
    modeling.save(fuse.fuse(model.eval(), "auto")[0].state_dict(), path)
    config = ConvertConfig(precision="int8", inputs=[spec], options={}, calibration=CALIBRATION, **rebuild)
    litert.run({"model": path}, config, tmp_path / "int8.tflite")
    rows, _, whole = layers_and_whole(path, SimpleNamespace(**rebuild), tmp_path / "int8.tflite", [spec], batches=2)
    assert len(rows) > 50 and any(row["op"] == "Hardsigmoid" for row in rows), rows
    assert min(row["sqnr_db"] for row in rows) > whole - 6, (whole, rows[:5])


# --- whole builds ------------------------------------------------------------------------------------------------

TWO_INPUTS = textwrap.dedent('''
    import torch
    from torch import nn


    class TwoInputs(nn.Module):
        """An image and token ids in, a dict with a nested tuple out."""

        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
            self.embed = nn.Embedding(50, 8)

        def forward(self, image, ids):
            pooled = self.conv(image).mean((2, 3))
            return {"score": pooled + self.embed(ids).mean(1), "parts": (pooled, self.embed(ids).sum(1))}
''')


@pytest.mark.slow
def test_outside_models_build_verify_bench_and_report_through_litert(project):
    """torchvision's MobileNetV2 (random weights, batch-norm statistics re-estimated) in fp32 and static int8, and a
    two-input model with a structured output whose sequence dim is dynamic (LiteRT fixes it, and says so)."""
    (project.root / "twoinputs.py").write_text(TWO_INPUTS)
    project.write_recipe({
        "name": "mnv2", "model": {"torchvision": "mobilenet_v2", "batchnorm_stats": 2},
        "input": {"shape": [1, 3, 64, 64]}, "benchmark": {"warmup": 1, "iters": 5},
        "quantize": {"calibration": {"source": "random", "batches": 8, "seed": 0}},
        # relaxed for int8: see below
        "verify": {"thresholds": {"int8": {"sqnr_db": 3, "cosine": 0.5, "max_rel_error": 1, "top1_agreement": 0}}},
        "targets": [{"backend": "xnnpack", "runtime": "litert"},
                    {"backend": "xnnpack", "runtime": "litert", "precision": "int8", "name": "litert-int8"}]})
    project.write_recipe({
        "name": "two", "model": {"factory": "twoinputs:TwoInputs"},
        "inputs": [{"name": "image", "shape": [1, 3, 16, 16]},
                   {"name": "ids", "shape": [1, "seq"], "dtype": "int64", "range": [0, 50]}],
        "dims": {"seq": {"min": 2, "max": 16, "example": 6}}, "benchmark": {"warmup": 1, "iters": 5},
        "targets": [{"backend": "xnnpack", "runtime": "litert"}, {"backend": "gpu-delegate"}]})
    built = project.run()
    assert built.returncode == 0, built.stdout + built.stderr
    assert "LiteRT-Torch Convert" not in built.stdout + built.stderr and "I0000" not in built.stdout + built.stderr
    assert "dim seq fixed at the example size: litert-torch" in built.stdout
    for recipe, target in (("mnv2", "xnnpack-litert"), ("mnv2", "litert-int8"), ("two", "xnnpack-litert")):
        assert json.loads(project.artifact(f"{recipe}/bench-{target}.json").read_text())["status"] == "ran"
    for recipe, target in (("mnv2", "xnnpack-litert"), ("two", "xnnpack-litert")):
        verification = json.loads(project.artifact(f"{recipe}/verify-{target}.json").read_text())
        assert verification["status"] == "passed" and verification["metrics"]["sqnr_db"] > 60, verification
    # a random-weight MobileNetV2 calibrated on random data loses most of its signal in int8 on every route (6.6 dB
    # for ExecuTorch's XNNPACK int8 of this very recipe, measured): int8 is judged on digits, a trained model
    int8 = json.loads(project.artifact("mnv2/verify-litert-int8.json").read_text())
    assert int8["status"] == "passed" and int8["relaxed"] and int8["artifact"]["int8_operators"] > 50, int8
    two = json.loads(project.artifact("two/verify-xnnpack-litert.json").read_text())
    assert len(two["outputs"]) == 3
    gpu = json.loads(project.artifact("two/verify-gpu-delegate.json").read_text())
    assert gpu["status"] == "not run on host" and "float16" in gpu["artifact"]["constant_dtypes"]
    layers = json.loads(project.artifact("mnv2/layers-litert-int8.json").read_text())
    assert layers["method"] == "litert" and layers["layers"], layers
    report = project.artifact("report.md").read_text()
    assert "LiteRT, xnnpack, int8" in report and "LiteRT, gpu-delegate, fp32" in report
    assert project.doit() == []  # up to date: nothing runs again


@pytest.mark.slow
def test_a_release_ships_the_tflite_files_and_verify_release_rebuilds_them_byte_for_byte(project, tmp_path, capsys):
    """`mobilebuild release` of a built LiteRT fp32 and int8 target: release.json lists each .tflite as verified on
    the host, the copies are the build's, and verify-release converts both again in a scratch checkout and gets
    the same bytes."""
    from conftest import tiny_recipe  # here: the cross-checkout test copies this module without conftest

    project.write_recipe(tiny_recipe(targets=[
        {"backend": "xnnpack", "runtime": "litert"},
        {"backend": "xnnpack", "runtime": "litert", "precision": "int8", "name": "litert-int8"}]))
    subprocess.run(["git", "init", "-q"], cwd=project.root, check=True)
    (project.root / ".gitignore").write_text("artifacts/\n.doit.db*\n.mobilebuild/\n/release*/\n")
    project.doit()
    out = project.root / "release"
    document = release.collect(project.root, out)
    shipped = {"tiny/tiny-xnnpack-litert.tflite": "fp32", "tiny/tiny-litert-int8.tflite": "int8"}
    assert sorted(document["files"]) == sorted(shipped), document["files"]
    x = modeling.example_inputs([{**INPUT, "shape": [1, 3, 8, 8]}], seed=7)[0]
    for path, precision in shipped.items():
        entry = document["files"][path]
        assert (entry["runtime"], entry["precision"]) == ("litert", precision), entry
        assert entry["verification"]["status"] == "passed", entry["verification"]
        assert entry["sha256"] == store.sha256_file(out / path) == store.sha256_file(project.artifact(path))
        assert run_tflite(out / path, x).shape == (1, 5)  # the released file runs in LiteRT's interpreter
    assert release.verify(project.root, out, scratch=tmp_path / "scratch") == []  # rebuilt byte for byte
    progress = capsys.readouterr().err
    for task in ("litert:tiny-litert-int8", "litert:tiny-xnnpack-litert"):  # converted again, from scratch
        assert f": {task}\n" in progress, progress
