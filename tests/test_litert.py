"""The LiteRT route family: the litert stage (fp32, fp16 weights, int8 static with float or int8 I/O, int8 dynamic)
and the litert runtime, on tiny models: numerics against eager, what the file holds, one-line errors, quiet
conversion and reproducible bytes."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import tiny_models
import torch
from torch import nn

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.litert import ConvertConfig
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.runtimes import litert as runtime
from mobilebuild.worker.stages import fuse, litert, modeling

REPO = Path(__file__).resolve().parents[1]
INPUT = {"name": "input", "shape": [1, 3, 16, 16], "dtype": "float32", "memory_format": "contiguous"}
CALIBRATION = {"source": "random", "batches": 8, "seed": 0}
FP32_DB = 60.0
FP16_DB = 45.0
INT8_DB = 15.0


class ConvNet(nn.Module):
    """Conv-BN-ReLU twice, global pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def make(seed=0):
    torch.manual_seed(seed)
    return tiny_models.randomize_batchnorm(ConvNet(), seed=seed)


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


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The model's eager outputs and its fp32 and int8 conversions (converting is the slow part: seconds each)."""
    folder = tmp_path_factory.mktemp("litert")
    model = make()
    x = modeling.example_inputs([INPUT], seed=100)[0]  # not one of the calibration batches
    with torch.no_grad():
        reference = model(x)
    path = folder / "fused.pt"
    fused = path, tiny_models.stored_fused(fuse.fuse(model, "auto")[0], path)
    return {"x": x, "reference": reference, "fused": fused, "folder": folder,
            "fp32": convert_to(fused, folder, "fp32"), "int8": convert_to(fused, folder, "int8", "int8")}


def test_fp32_conversion_matches_the_eager_model(converted):
    assert sqnr_db(converted["reference"], run_tflite(converted["fp32"], converted["x"])) > FP32_DB
    facts = runtime.inspect(converted["fp32"], None)
    assert facts["int8_operators"] == 0 and facts["constant_dtypes"].get("int8") is None
    assert [(i["shape"], i["dtype"]) for i in facts["inputs"]] == [([1, 3, 16, 16], "float32")]
    assert [(o["shape"], o["dtype"]) for o in facts["outputs"]] == [([1, 10], "float32")]


def test_int8_static_is_fully_integer_with_float_io_by_default(converted):
    output = run_tflite(converted["int8"], converted["x"])
    assert INT8_DB < sqnr_db(converted["reference"], output) < FP32_DB  # close, yet really int8
    facts = runtime.inspect(converted["int8"], None)
    assert facts["inputs"][0]["dtype"] == facts["outputs"][0]["dtype"] == "float32"
    assert facts["op_types"]["QUANTIZE"] >= 1 and facts["op_types"]["DEQUANTIZE"] >= 1
    assert facts["int8_operators"] >= 3  # two convolutions and the classifier at least
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


def test_exclude_keeps_a_module_float(converted, tmp_path):
    kept = convert_to(converted["fused"], tmp_path, "kept", "int8", exclude=["head"])
    facts, whole = runtime.inspect(kept, None), runtime.inspect(converted["int8"], None)
    assert facts["constant_dtypes"].get("float32", 0) > whole["constant_dtypes"].get("float32", 0)
    assert facts["int8_operators"] < whole["int8_operators"]


def test_conversion_is_quiet_and_byte_identical_from_run_to_run(converted, tmp_path, capfd):
    again = convert_to(converted["fused"], tmp_path, "again")
    printed = capfd.readouterr()
    assert again.read_bytes() == converted["fp32"].read_bytes()
    assert "LiteRT-Torch Convert" not in printed.out and "I0000" not in printed.err, printed


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
    assert runtime.inspect(tmp_path / "two.tflite", None)["inputs"][1]["dtype"] == "int32"  # narrowed by the converter
