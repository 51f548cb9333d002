"""The export stage (ONNX, fp32 and int8 through ONNX Runtime quantization) and the onnxruntime runtime, on tiny
models: numerics against eager, reproducible bytes, one-line errors, and the runtime's thread setting."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
import tiny_models
import torch
from torch import nn

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.onnx.plan import ExportConfig
from mobilebuild.routes.onnx.worker import export
from mobilebuild.routes.onnx.worker import runtime as ort_runtime
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import calibration, fuse, modeling

REPO = Path(__file__).resolve().parents[1]
INPUT = {"name": "input", "shape": [1, 3, 16, 16], "dtype": "float32", "memory_format": "contiguous"}
CALIBRATION = {"source": "random", "batches": 8, "seed": 0}
FP32_DB = 60.0  # the same function, computed in another order
INT8_DB = 15.0  # int8 activations and weights


class ConvBnReluLinear(nn.Module):
    """Conv-BN-ReLU twice, then a classifier, between quantization stubs (identities in a float model)."""

    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.head = nn.Linear(16 * 12 * 12, 10)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        return self.dequant(self.head(torch.flatten(self.features(self.quant(x)), 1)))


class Residual(nn.Module):
    """A residual add (skip connection), global pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        x = torch.relu(x + self.body(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class DataDependent(nn.Module):
    """Control flow on a tensor's value: torch.export refuses it (the TorchScript exporter would record one branch)."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class NoTranslation(nn.Module):
    """An operation with no ONNX translation."""

    def forward(self, x):
        return torch.kthvalue(x.flatten(1), 3).values


def make(factory, seed=0):
    torch.manual_seed(seed)
    return tiny_models.randomize_batchnorm(factory(), seed=seed)


MODELS = {"conv_bn_relu_linear": ConvBnReluLinear, "residual": Residual}


def config(precision, rebuild, calibration=CALIBRATION, weights=None, opset=None, options=None):
    return ExportConfig(precision=precision, calibration=calibration, weights=weights, inputs=[INPUT],
                        options=options if options is not None else {"opset": opset}, **rebuild)


def fused_file(model, folder):
    """The fused model as the fuse stage stores it, with the config fields that rebuild it."""
    path = Path(folder) / "fused.pt"
    fused, _ = fuse.fuse(model, "auto")
    return path, tiny_models.stored_fused(fused, path)


def export_to(fused, folder, **settings):
    path, rebuild = fused
    output = Path(folder) / f"{settings.get('precision', 'fp32')}.onnx"
    export.run({"model": path}, config(**{"precision": "fp32", **settings}, rebuild=rebuild), output)
    return output


# the second model's variants are slow: five exports more, of a second layout of the same operators
@pytest.fixture(scope="module", params=["conv_bn_relu_linear", pytest.param("residual", marks=pytest.mark.slow)])
def exported(request, tmp_path_factory):
    """One model's eager outputs and its fp32 and int8 exports (exporting is the slow part)."""
    folder = tmp_path_factory.mktemp(request.param)
    model = make(MODELS[request.param])
    x = modeling.example_inputs([INPUT], seed=100)[0]  # not one of the calibration batches
    with torch.no_grad():
        reference = model(x)
    fused = fused_file(model, folder)
    return {"x": x, "reference": reference, "fused": fused, "folder": folder,
            "fp32": export_to(fused, folder, precision="fp32"), "int8": export_to(fused, folder, precision="int8")}


def run_onnx(path, x, threads=1):
    return ort_runtime.load(path, SimpleNamespace(timing={"threads": threads}))(x)


def test_fp32_export_matches_the_eager_model(exported):
    assert sqnr_db(exported["reference"], run_onnx(exported["fp32"], exported["x"])) > FP32_DB
    facts = ort_runtime.inspect(exported["fp32"], {})
    assert facts["quantized_nodes"] == 0
    assert facts["inputs"] == [{"name": "input", "shape": INPUT["shape"], "dtype": "float32"}]
    assert facts["outputs"] == [{"name": "output", "shape": [1, 10], "dtype": "float32"}]
    assert "BatchNormalization" not in facts["op_types"]


def test_int8_export_is_quantized_smaller_and_close_to_the_eager_model(exported):
    output = run_onnx(exported["int8"], exported["x"])
    assert INT8_DB < sqnr_db(exported["reference"], output) < FP32_DB  # close, yet really int8
    assert exported["int8"].stat().st_size < exported["fp32"].stat().st_size
    facts = ort_runtime.inspect(exported["int8"], {})
    compute = sum(facts["op_types"].get(op, 0) for op in ("Conv", "Gemm"))
    assert facts["int8_compute_nodes"] >= compute > 0
    assert facts["qdq_nodes"] > 0


def test_per_tensor_weights_quantize_each_weight_with_one_scale(exported, tmp_path):
    per_tensor = export_to(exported["fused"], tmp_path, precision="int8", weights="per_tensor")
    assert sqnr_db(exported["reference"], run_onnx(per_tensor, exported["x"])) > INT8_DB

    def weight_scales(path):
        model = onnx.load(str(path))
        sizes = {t.name: int(torch.tensor(t.dims).prod()) for t in model.graph.initializer}
        dequantized = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
        return [sizes[n.input[1]] for n in dequantized if n.input[0].endswith("weight_quantized")]

    assert set(weight_scales(per_tensor)) == {1}
    assert max(weight_scales(exported["int8"])) > 1  # per channel by default


def test_exports_are_byte_identical_from_run_to_run(exported, tmp_path):
    assert export_to(exported["fused"], tmp_path, precision="fp32").read_bytes() == exported["fp32"].read_bytes()
    assert export_to(exported["fused"], tmp_path, precision="int8").read_bytes() == exported["int8"].read_bytes()


def test_the_exporter_embeds_source_paths_that_the_stage_strips(tmp_path):
    """What makes the checkouts test below meaningful: torch.onnx.export records stack traces."""
    model, _ = fuse.fuse(make(ConvBnReluLinear), "auto")
    raw = torch.onnx.export(model, modeling.example_inputs([INPUT]), dynamo=True, verbose=False).model_proto
    here = str(Path(__file__).resolve()).encode()
    assert here in raw.SerializeToString()
    assert here not in export.reproducible(raw).SerializeToString()


CHECKOUT_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path

    import mobilebuild
    assert Path(mobilebuild.__file__).resolve().is_relative_to(Path.cwd().resolve()), mobilebuild.__file__
    import test_export
    from test_export import fused_file, export_to, make

    fused = fused_file(make(test_export.ConvBnReluLinear), ".")
    for precision in ("fp32", "int8"):
        export_to(fused, ".", precision=precision)
""")


@pytest.mark.slow
def test_exports_are_byte_identical_across_checkouts(tmp_path):
    """Two copies of the code (package, model source) at different absolute paths, run from their own folders."""
    runs = []
    for checkout in (tmp_path / "a", tmp_path / "elsewhere" / "checkout-b"):
        shutil.copytree(REPO / "mobilebuild", checkout / "mobilebuild", ignore=shutil.ignore_patterns("__pycache__"))
        for module in ("test_export.py", "tiny_models.py"):
            shutil.copy(REPO / "tests" / module, checkout / module)
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        runs.append((checkout, subprocess.Popen([sys.executable, "-c", CHECKOUT_SCRIPT], cwd=checkout, env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for checkout, process in runs:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    (a, _), (b, _) = runs
    for precision in ("fp32", "int8"):
        assert (a / f"{precision}.onnx").read_bytes() == (b / f"{precision}.onnx").read_bytes(), precision


@pytest.mark.parametrize("model, expected", [
    (DataDependent, r"torch\.export cannot capture the model .* at test_export\.py:\d+ `if x\.sum\(\) > 0:`"),
    (NoTranslation, r"no ONNX translation for aten\.kthvalue"),
])
def test_an_unexportable_model_is_one_line_naming_the_target(model, expected, tmp_path):
    with pytest.raises(MobileBuildError, match=expected) as caught:
        export_to(fused_file(model(), tmp_path), tmp_path)
    assert caught.value.field == "targets"
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "fp32.onnx").exists()


def test_the_opset_option_is_honoured_and_checked(tmp_path):
    fused = fused_file(make(ConvBnReluLinear), tmp_path)
    assert ort_runtime.inspect(export_to(fused, tmp_path, opset=18), {})["opset"] == 18
    with pytest.raises(MobileBuildError, match=r"opset 13 is out of range") as caught:
        export_to(fused, tmp_path, opset=13)
    assert caught.value.field == "targets.onnx.opset"


def wrong_shape_batches():
    """A recipe calibration function (named as test_export:wrong_shape_batches) yielding the wrong input shape."""
    yield torch.randn(1, 3, 8, 8)


@pytest.mark.parametrize("calibration, message, field", [
    (None, r"needs calibration batches", "quantize.calibration"),
    ({"source": "function", "function": "test_export:wrong_shape_batches", "kwargs": {}, "batches": 2},
     r"input input has shape \[1, 3, 8, 8\]: expected \[1, 3, 16, 16\]",
     "quantize.calibration.function"),
])
def test_bad_calibration_is_the_calibration_settings_fault(calibration, message, field, tmp_path):
    with pytest.raises(MobileBuildError, match=message) as caught:
        export_to(fused_file(make(ConvBnReluLinear), tmp_path), tmp_path, precision="int8", calibration=calibration)
    assert caught.value.field == field


def os_threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through Linux's /proc")
def test_the_runtime_runs_with_the_thread_count_asked_for(exported):
    for threads, extra_os_threads in ((1, 0), (3, 2)):  # ONNX Runtime's pool: the caller's thread and n-1 workers
        before = os_threads()
        model = ort_runtime.load(exported["fp32"], SimpleNamespace(timing={"threads": threads}))
        assert os_threads() - before == extra_os_threads
        assert model.session.get_session_options().intra_op_num_threads == threads
        assert sqnr_db(exported["reference"], model(exported["x"])) > FP32_DB
        del model
    default = ort_runtime.load(exported["fp32"], SimpleNamespace())
    assert default.session.get_session_options().intra_op_num_threads == 1


def test_the_runtime_reports_a_file_it_cannot_load_as_the_targets_problem(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    with pytest.raises(MobileBuildError, match=r"ONNX Runtime .* cannot load") as caught:
        ort_runtime.load(broken, SimpleNamespace())
    assert caught.value.field == "targets"
    assert "\n" not in str(caught.value)


# --- dynamic int8 (quantize.mode: dynamic) -------------------------------------------------------------------------

TOKENS = {"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100], "memory_format": "contiguous",
          "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}


def export_text(folder, mode, name=None, **settings):
    model = tiny_models.tiny_transformer()
    rebuild = tiny_models.stored_fused(model, Path(folder) / "fused.pt", "tiny_models:tiny_transformer")
    output = Path(folder) / f"{name or mode}.onnx"
    export.run({"model": Path(folder) / "fused.pt"},
               ExportConfig(precision="int8", inputs=[TOKENS], options={}, mode=mode,
                            calibration=CALIBRATION if mode == "static" else None, **rebuild, **settings), output)
    return model, output


def text_sqnr(model, path, length):
    """SQNR of the ONNX model against the eager one on 8 random sentences of `length` tokens."""
    sentences = [modeling.example_inputs([{**TOKENS, "shape": [1, length]}], seed=100 + i)[0] for i in range(8)]
    with torch.no_grad():
        return sqnr_db(torch.cat([model(x) for x in sentences]), torch.cat([run_onnx(path, x) for x in sentences]))


@pytest.fixture(scope="module")
def text_exports(transformer_static_onnx, transformer_dynamic_onnx):
    """A tiny Transformer's int8 ONNX models: static (calibrated QDQ) and dynamic (conftest's, as export_text makes
    them)."""
    static, dynamic = transformer_static_onnx, transformer_dynamic_onnx
    return tiny_models.tiny_transformer(), static.path, dynamic.path, dynamic.folder


def test_dynamic_int8_is_onnxruntimes_dynamic_quantization_and_beats_static_on_a_transformer(text_exports):
    model, static, dynamic, _ = text_exports
    # measured: static 14.9 / 35.9 / 35.9 dB at 4 / 16 / 32 tokens; dynamic 40.4 / 43.1 / 45.4 dB
    static_worst = min(text_sqnr(model, static, length) for length in (4, 16, 32))
    dynamic_worst = min(text_sqnr(model, dynamic, length) for length in (4, 16, 32))  # its dims stay dynamic
    assert dynamic_worst > max(35.0, static_worst + 10)
    facts = ort_runtime.inspect(dynamic, {})
    ops = facts["op_types"]
    assert ops.get("MatMulInteger") == 5 and ops.get("DynamicQuantizeLinear") == 5  # qkv, proj, mlp x2, head
    assert "QuantizeLinear" not in ops and facts["int8_compute_nodes"] >= 10
    assert facts["inputs"] == [{"name": "ids", "shape": [1, "seq"], "dtype": "int64"}]


def test_dynamic_int8_is_reproducible(text_exports, tmp_path):
    _, _, dynamic, _ = text_exports
    _, again = export_text(tmp_path, "dynamic")
    assert again.read_bytes() == dynamic.read_bytes()


def test_dynamic_int8_keeps_excluded_modules_float(tmp_path):
    _, kept = export_text(tmp_path, "dynamic", name="kept", exclude=["head", "mlp"])  # nodes_to_exclude
    assert ort_runtime.inspect(kept, {})["op_types"].get("MatMulInteger") == 2  # qkv, proj


def test_dynamic_int8_excluding_every_linear_and_embedding_is_as_exact_as_float(text_exports, tmp_path):
    model, _, dynamic, _ = text_exports
    _, none = export_text(tmp_path, "dynamic", name="none", exclude=["Linear", "Embedding"])
    assert text_sqnr(model, none, 16) > FP32_DB > text_sqnr(model, dynamic, 16)


def test_percentile_calibration_takes_batches_of_a_dynamic_dims_sizes(tmp_path):
    """Random calibration batches take a dynamic dim at its example, smallest and largest size in turn; ONNX Runtime's
    percentile (histogram) calibrator stacked each tensor's data from all batches into one array and raised
    ValueError "inhomogeneous shape". The batches are now given to it one at a time: 14.9 / 34.9 / 35.2 dB at
    4 / 16 / 32 tokens (minmax: 14.9 / 35.9 / 35.9)."""
    model, output = export_text(tmp_path, "static", name="percentile", observer="percentile")
    facts = ort_runtime.inspect(output, {})
    assert facts["op_types"].get("QuantizeLinear") and facts["inputs"][0]["shape"] == [1, "seq"]
    results = [text_sqnr(model, output, length) for length in (4, 16, 32)]
    assert min(results) > 14 and min(results[1:]) > 30, results


# --- static int8 of a Transformer with a padding mask ---------------------------------------------------------------

TOKENS_AND_MASK = [{**TOKENS, "name": name, "range": [0, high]} for name, high in (("ids", 100), ("mask", 2))]


def encoder_sqnr(model, path, length):
    """SQNR of the ONNX model against the eager one on 8 random sentences of `length` tokens, with padding masks;
    and whether the ONNX model gave a NaN."""
    sentences = [modeling.example_inputs([{**spec, "shape": [1, length]} for spec in TOKENS_AND_MASK], seed=100 + i)
                 for i in range(8)]
    run = ort_runtime.load(path, SimpleNamespace(timing={"threads": 1}))
    with torch.no_grad():
        reference = torch.cat([model(*x) for x in sentences])
        output = torch.cat([torch.as_tensor(run(*x)) for x in sentences])
    return sqnr_db(reference, output), bool(torch.isnan(output).any())


def test_static_int8_keeps_an_attention_masks_infinite_tensors_float(encoder_static_onnx):
    """nn.TransformerEncoder's padding mask becomes an additive mask of 0 and -inf: quantize_static calibrated it
    and the masked scores to a scale of inf, so the shipped model's masked attention scores were all NaN
    (val_114_DequantizeLinear_Output) and attention added nothing: 11.1 / 11.4 / 10.2 dB at 4 / 16 / 32 tokens.
    The nodes making or taking those tensors stay float, said in one line: 15.5 / 33.3 / 32.3 dB."""
    from onnx import numpy_helper

    model = tiny_models.tiny_encoder()
    # the stage's export of it (TOKENS_AND_MASK, CALIBRATION) under plain_attention, as every stage runs
    # (reproducible.stage_session), with what it printed: conftest's, shared with test_layers_onnx
    exported = encoder_static_onnx
    output = exported.path

    said = [line for line in exported.printed.splitlines() if "kept float" in line]
    assert len(said) == 1 and "reaches -inf" in said[0] and "Softmax" in said[0], said
    assert "encoder.layers.0.self_attn: " in said[0]
    proto = onnx.load(output)
    scales = {init.name: numpy_helper.to_array(init) for init in proto.graph.initializer}
    assert all(torch.isfinite(torch.as_tensor(scales[node.input[1]])).all() for node in proto.graph.node
               if node.op_type == "QuantizeLinear"), "a quantization scale is not finite"
    assert any(node.op_type == "QuantizeLinear" for node in proto.graph.node)  # the rest is int8 still
    results = [encoder_sqnr(model, output, length) for length in (4, 16, 32)]
    assert not any(nan for _, nan in results)
    assert min(sqnr for sqnr, _ in results) > 14 and results[1][0] > 28, results


def test_the_percentile_observer_refuses_an_attention_masks_infinite_values_in_one_line(tmp_path):
    """ONNX Runtime's histogram (percentile) calibrator stops at the mask's -inf ("autodetected range of [0.0, inf]
    is not finite"), before the ranges that would keep those nodes float exist."""
    from mobilebuild.worker import reproducible

    model = tiny_models.tiny_encoder()
    rebuild = tiny_models.stored_fused(model, tmp_path / "fused.pt", "tiny_models:tiny_encoder")
    with reproducible.plain_attention(), pytest.raises(MobileBuildError) as refused:
        export.run({"model": tmp_path / "fused.pt"},
                   ExportConfig(precision="int8", inputs=TOKENS_AND_MASK, options={}, calibration=CALIBRATION,
                                observer="percentile", **rebuild), tmp_path / "percentile.onnx")
    assert refused.value.field == "quantize.observer"
    assert "use observer minmax" in refused.value.message and "\n" not in refused.value.message
    assert not (tmp_path / "percentile.onnx").exists()


def test_static_int8_of_a_model_with_finite_ranges_is_quantize_static_as_it_was(tmp_path, capsys):
    """Ranges are kept (quantize_static's calibration cache) to find the infinite ones; a model without any is
    quantized once, byte for byte as the plain quantize_static call made it, and nothing is said."""
    from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_static

    model = make(Residual)
    fused, _ = fuse.fuse(model, "auto")
    proto = export.export_float(fused, [INPUT])
    shipped = export.reproducible(export.quantize_int8(proto, CALIBRATION, [INPUT])).SerializeToString()
    quant_pre_process(proto, tmp_path / "prepared.onnx", skip_optimization=True, skip_symbolic_shape=True)
    reader = export._CalibrationReader(calibration.batches(CALIBRATION, [INPUT]), [INPUT], "quantize.calibration")
    quantize_static(tmp_path / "prepared.onnx", tmp_path / "plain.onnx", reader, quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    plain = export.reproducible(onnx.load(tmp_path / "plain.onnx")).SerializeToString()

    assert shipped == plain
    assert "kept float" not in capsys.readouterr().out


# --- onnx.exporter: torchscript (an LSTM whose sequence stays dynamic) ---------------------------------------------

SEQUENCE = {**TOKENS, "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}  # example 16
TORCHSCRIPT = {"exporter": "torchscript"}


def export_lstm(folder, precision="fp32", mode="static", name=None, options=TORCHSCRIPT, **settings):
    model = tiny_models.tiny_lstm()
    rebuild = tiny_models.stored_fused(model, Path(folder) / "fused.pt", "tiny_models:tiny_lstm")
    output = Path(folder) / f"{name or precision + '-' + mode}.onnx"
    export.run({"model": Path(folder) / "fused.pt"},
               ExportConfig(precision=precision, inputs=[SEQUENCE], options=options, mode=mode, outputs=["scores"],
                            calibration=CALIBRATION if precision == "int8" and mode == "static" else None,
                            **rebuild, **settings), output)
    return model, output


def lstm_sqnr(model, path, lengths=(4, 16, 32)):
    """SQNR of the ONNX model against the eager one on 8 random sentences at each of `lengths`."""
    return [text_sqnr(model, path, length) for length in lengths]


@pytest.fixture(scope="module")
def lstm_exports(tmp_path_factory):
    """The tiny LSTM exported with the TorchScript exporter: fp32, dynamic int8 and static int8."""
    folder = tmp_path_factory.mktemp("lstm")
    model, fp32 = export_lstm(folder)
    _, dynamic = export_lstm(folder, "int8", "dynamic")
    return model, fp32, dynamic, folder


def test_the_torchscript_exporter_keeps_an_lstms_sequence_dynamic(lstm_exports, tmp_path):
    """torch.export unrolls the LSTM over the example's 16 steps (refused, see test_multi_input); the TorchScript
    exporter writes one ONNX LSTM per layer, which ONNX Runtime runs at any length: 135.6 / 136.3 / 136.2 dB at
    4 / 16 / 32 tokens."""
    model, fp32, _, _ = lstm_exports
    assert min(lstm_sqnr(model, fp32)) > FP32_DB
    facts = ort_runtime.inspect(fp32, {})
    assert facts["op_types"].get("LSTM") == 2
    assert facts["inputs"] == [{"name": "ids", "shape": [1, "seq"], "dtype": "int64"}]
    assert [output["name"] for output in facts["outputs"]] == ["scores"]
    _, again = export_lstm(tmp_path)
    assert again.read_bytes() == fp32.read_bytes()  # reproducible, and no path of this checkout inside
    assert str(Path(__file__).resolve().parent).encode() not in fp32.read_bytes()
    assert not any(node.metadata_props for node in onnx.load(fp32).graph.node)


def test_dynamic_int8_quantizes_the_lstm_and_keeps_its_sequence_dynamic(lstm_exports, tmp_path):
    """quantize_dynamic turns each ONNX LSTM into DynamicQuantizeLSTM (int8 weights); quantize.exclude keeps it float
    through the module paths read from the TorchScript exporter's node names. Measured 42.4 / 40.6 / 44.0 dB at
    4 / 16 / 32 tokens, 70.7 -> 29.0 kB."""
    model, fp32, dynamic, _ = lstm_exports
    results = lstm_sqnr(model, dynamic)
    assert 30 < min(results) and max(results) < FP32_DB, results  # int8, and close
    facts = ort_runtime.inspect(dynamic, {})
    assert facts["op_types"].get("DynamicQuantizeLSTM") == 2 and "LSTM" not in facts["op_types"]
    assert facts["op_types"].get("MatMulInteger") == 1  # the head
    assert facts["inputs"] == [{"name": "ids", "shape": [1, "seq"], "dtype": "int64"}]
    assert dynamic.stat().st_size < fp32.stat().st_size / 2
    _, kept = export_lstm(tmp_path, "int8", "dynamic", name="kept", exclude=["lstm"])
    ops = ort_runtime.inspect(kept, {})["op_types"]
    assert ops.get("LSTM") == 2 and "DynamicQuantizeLSTM" not in ops and ops.get("MatMulInteger") == 1


def test_static_int8_keeps_the_lstm_float_and_says_so_in_one_line(tmp_path, capsys):
    """quantize_static has no int8 LSTM: the ONNX LSTMs stay float (correct, its embedding and head int8), and the
    build says so, pointing at dynamic mode. Measured 31.4 / 33.6 / 38.5 dB at 4 / 16 / 32 tokens."""
    model, static = export_lstm(tmp_path, "int8", "static")
    said = [line for line in capsys.readouterr().out.splitlines() if "kept float" in line]
    assert len(said) == 1 and "2 ONNX LSTM node(s) (/lstm/LSTM, /lstm/LSTM_1)" in said[0], said
    assert "quantize.mode: dynamic quantizes LSTM" in said[0]
    ops = ort_runtime.inspect(static, {})["op_types"]
    assert ops.get("LSTM") == 2 and ops.get("QuantizeLinear")
    assert min(lstm_sqnr(model, static)) > INT8_DB


def test_the_torchscript_exporter_names_what_its_trace_recorded_and_fails_in_one_line(tmp_path, capfd):
    """It records the branch the example took (torch.export refuses such a model): the build names the line; an
    operation without a translation is one line, and the graph it dumps on failure stays out of the output."""
    fused = fused_file(DataDependent(), tmp_path)
    export_to(fused, tmp_path, options=TORCHSCRIPT)
    out, err = capfd.readouterr()
    said = [line for line in out.splitlines() if "traced" in line]
    assert len(said) == 1 and "test_export.py:" in said[0] and "`if x.sum() > 0:`" in said[0], out
    assert "Warning" not in out + err and "rnn.py" not in out + err  # deprecation, and torch's own trace warnings
    with pytest.raises(MobileBuildError, match=r"no ONNX translation for aten::kthvalue in the TorchScript") as caught:
        export_to(fused_file(NoTranslation(), tmp_path), tmp_path, options=TORCHSCRIPT)
    assert caught.value.field == "targets" and "\n" not in str(caught.value)
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err and "Warning" not in out + err


def test_the_torchscript_exporter_honours_the_opset_and_checks_its_range(tmp_path):
    fused = fused_file(make(ConvBnReluLinear), tmp_path)
    assert ort_runtime.inspect(export_to(fused, tmp_path, options={**TORCHSCRIPT, "opset": 13}), {})["opset"] == 13
    assert ort_runtime.inspect(export_to(fused, tmp_path, options=TORCHSCRIPT), {})["opset"] == 20  # its default
    with pytest.raises(MobileBuildError, match=r"opset 21 is out of range: the TorchScript exporter .* 7 to 20") \
            as caught:
        export_to(fused, tmp_path, options={**TORCHSCRIPT, "opset": 21})
    assert caught.value.field == "targets.onnx.opset"
