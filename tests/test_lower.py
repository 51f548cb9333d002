"""The ExecuTorch path: lowering tiny models to .pte for each delegate, running XNNPACK programs on the host, the
delegation summary read back from the file, reproducibility, and one-line errors."""

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tiny_models import conv_bn, stored_fused
from torch import nn

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.executorch.plan import LowerConfig
from mobilebuild.routes.executorch.worker import lower, pte
from mobilebuild.routes.executorch.worker import runtime as et_runtime
from mobilebuild.worker.metrics import sqnr_db
from mobilebuild.worker.stages import fuse, modeling

NCHW = {"name": "input", "shape": [1, 3, 16, 16], "dtype": "float32", "memory_format": "contiguous"}
NHWC = {**NCHW, "memory_format": "channels_last"}
RANDOM_CALIBRATION = {"source": "random", "batches": 8, "seed": 0}


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)  # the tiny models' initial weights


class StubbedConvNet(nn.Module):
    """Quantizable layout: QuantStub/DeQuantStub around Conv-BN-ReLU blocks and a classifier head."""

    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, stride=2, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, 10)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        return self.dequant(self.head(torch.flatten(self.pool(self.features(self.quant(x))), 1)))


class WithUnsupportedOps(nn.Module):
    """cumsum and flip have no XNNPACK kernel: they stay on ExecuTorch's portable kernels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return torch.cumsum(self.conv(x), dim=1) + torch.flip(x[:, :1, 1:-1, 1:-1], [3])


class OnlyUnsupported(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def fused(model):
    from tiny_models import randomize_batchnorm

    return fuse.fuse(randomize_batchnorm(model), "auto")[0].eval()


def lower_stage(tmp_path, model, delegate, precision="fp32", input_config=NCHW, calibration=None, options=None):
    """The stage as the build runs it: the fused model stored by the fuse stage, a .pte out."""
    model_path = tmp_path / "fused.pt"
    rebuild = stored_fused(model, model_path)
    output = tmp_path / f"{delegate}-{precision}.pte"
    config = LowerConfig(delegate=delegate, precision=precision, calibration=calibration, inputs=[input_config],
                         options=options or {}, **rebuild)
    message = lower.run({"model": model_path}, config, output)
    return output, message


def eager_and_program(tmp_path, model, input_config, **kwargs):
    path, message = lower_stage(tmp_path, model, "xnnpack", input_config=input_config, **kwargs)
    program = et_runtime.load(path, SimpleNamespace(inputs=[input_config], timing={"threads": 1}))
    example = modeling.example_inputs([input_config], seed=7)[0]
    with torch.no_grad():
        return model(example), program(example), path, message


def test_xnnpack_fp32_runs_on_host_and_matches_eager(tmp_path):
    reference, output, path, message = eager_and_program(tmp_path, fused(StubbedConvNet()), NCHW)
    assert message is None
    assert output.shape == reference.shape
    assert sqnr_db(reference, output) > 60
    summary = pte.read(path).delegation
    assert summary["delegates"] == {"XnnpackBackend": 1} and summary["fallback_calls"] == 0


class TalkingHeads(nn.Module):
    """A 1x1 convolution, then softmax over the last dim: the pattern of timm's EfficientFormerV2 attention."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.mix(x * 4).softmax(dim=-1)


class TimmAttention(nn.Module):
    """timm's EfficientFormerV2 attention block on 32 channels at 4x4 (fixed arguments: the stages rebuild it)."""

    def __init__(self):
        super().__init__()
        from timm.models.efficientformer_v2 import Attention2d

        self.attention = Attention2d(dim=32, key_dim=8, num_heads=4, attn_ratio=2, resolution=4)

    def forward(self, x):
        return self.attention(x)


def test_softmax_after_a_convolution_normalises_the_last_dim_not_the_channels(tmp_path):
    """ExecuTorch's XNNPACK delegate keeps a convolution's output NHWC through softmax unless told otherwise
    (executorch_setup.softmax_in_nchw): then it normalised over the channels, and its rows did not sum to 1."""
    reference, output, _, _ = eager_and_program(tmp_path, TalkingHeads().eval(), NCHW)
    assert torch.allclose(output.sum(-1), torch.ones(1, 3, 16), atol=1e-5)
    assert sqnr_db(reference, output) > 60


@pytest.mark.slow  # timm imported, a larger lowering
def test_timm_efficientformer_v2_attention_keeps_fp32_precision_on_xnnpack(tmp_path):
    """Its talking heads (a 1x1 convolution before softmax) hit the layout bug above once attention is sharp, as
    after training: the hub zoo's trained EfficientFormerV2-S0 was at 32.8 dB on ExecuTorch fp32."""
    model = TimmAttention()
    for projection in (model.attention.q, model.attention.k):
        nn.init.normal_(projection.conv.weight)  # sharp attention, as a trained model's
    reference, output, _, _ = eager_and_program(tmp_path, fused(model), {**NCHW, "shape": [1, 32, 4, 4]})
    assert sqnr_db(reference, output) > 60


RUN_IN_A_FRESH_PROCESS = textwrap.dedent("""
    import os, sys, torch
    from types import SimpleNamespace
    from mobilebuild.routes.executorch.worker import runtime as et_runtime
    program = et_runtime.load(sys.argv[1], SimpleNamespace())  # the thread pool as verification leaves it
    print(tuple(program(torch.zeros(1, 3, 8, 8)).shape))
    with et_runtime.without_cpuinfo_notes():
        os.write(2, b"[cpuinfo_utils.cpp:87] Failed to open midr file\\nthe runtime's own error\\n")
""")


@pytest.mark.slow
def test_the_runtimes_cpu_probing_notes_stay_out_of_the_logs_and_the_rest_does_not(tmp_path):
    """ExecuTorch notes what it found of the CPU once per process, when a method first loads on its default thread
    pool (verification leaves it so): only a fresh process shows whether that reaches the build's log."""
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval(), tmp_path / "model.pt")
    (tmp_path / "model.pte").write_bytes(lower.lower_to_bytes(torch.load(tmp_path / "model.pt", weights_only=False),
                                                            [{**NCHW, "shape": [1, 3, 8, 8]}], "xnnpack"))
    result = subprocess.run([sys.executable, "-c", RUN_IN_A_FRESH_PROCESS, str(tmp_path / "model.pte")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(1, 4, 6, 6)"
    assert "cpuinfo_utils" not in result.stderr
    assert "the runtime's own error\n" in result.stderr


def test_a_channels_last_input_config_still_gives_an_nchw_program_fully_delegated(tmp_path):
    model = fused(conv_bn())
    reference, output, path, _ = eager_and_program(tmp_path, model, NHWC)
    dim_orders = pte.read(path).input_dim_orders
    assert dim_orders == [[0, 1, 2, 3]]
    assert pte.read(path).delegation["fallback_calls"] == 0
    assert sqnr_db(reference, output) > 60
    # the runtime converts whatever layout it is given: a channels_last tensor gives the same numbers
    program = et_runtime.load(path, SimpleNamespace(inputs=[NHWC]))
    assert sqnr_db(reference, program(*modeling.example_inputs([NHWC], seed=7))) > 60


@pytest.mark.slow  # an int8 lowering: XNNPACK's quantizer takes seconds on any model
def test_xnnpack_int8_with_calibration_matches_reasonably(tmp_path):
    reference, output, path, _ = eager_and_program(tmp_path, fused(StubbedConvNet()), NCHW, precision="int8",
                                                   calibration=RANDOM_CALIBRATION)
    assert sqnr_db(reference, output) > 15
    assert pte.read(path).delegation["delegates"] == {"XnnpackBackend": 1}


def test_int8_calibration_batches_of_the_wrong_shape_name_the_calibration(tmp_path, monkeypatch):
    monkeypatch.setattr(lower.calibration, "batches", lambda calibration, specs: [(torch.randn(1, 3, 8, 8),)])
    with pytest.raises(MobileBuildError) as caught:
        lower_stage(tmp_path, fused(conv_bn()), "xnnpack", "int8", calibration=RANDOM_CALIBRATION)
    assert caught.value.field == "quantize.calibration"
    assert "[1, 3, 8, 8]" in caught.value.message and "[1, 3, 16, 16]" in caught.value.message


@pytest.mark.parametrize(("delegate", "backend", "options"), [
    # the Vulkan partitioner traces its fusable patterns (RoPE's among them) on every lowering: seconds on any model
    pytest.param("vulkan", "VulkanBackend", {}, marks=pytest.mark.slow),
    # coremltools (imported for it alone) converts the model: seconds on any model
    pytest.param("coreml", "CoreMLBackend", {"compute_units": "cpu_and_ne", "compute_precision": "fp16"},
                 marks=pytest.mark.slow),
    # MPS lowers on Linux too (the partitioner only serializes an MPSGraph); upstream deprecated it for Core ML
    ("mps", "MPSBackend", {}),
])
def test_gpu_and_apple_delegates_lower_and_are_refused_on_the_host(tmp_path, delegate, backend, options):
    path, message = lower_stage(tmp_path, fused(conv_bn()), delegate, options=options)
    assert message is None
    summary = et_runtime.inspect(path, {})
    assert summary["delegation"]["delegates"] == {backend: 1}
    assert summary["bytes"] == path.stat().st_size
    with pytest.raises(MobileBuildError) as caught:
        et_runtime.load(path, SimpleNamespace(inputs=[NCHW]))
    assert caught.value.field == "targets" and backend in caught.value.message


def test_delegation_counts_fallback_operators(tmp_path):
    path, message = lower_stage(tmp_path, WithUnsupportedOps().eval(), "xnnpack")
    summary = pte.read(path).delegation
    assert summary["delegated_calls"] >= 1 and summary["delegates"].keys() == {"XnnpackBackend"}
    assert summary["fallback_ops"]["aten::cumsum.out"] == 1
    assert summary["fallback_ops"]["aten::flip.out"] == 1
    assert summary["fallback_calls"] == sum(summary["fallback_ops"].values())
    assert message is None  # partly delegated is a result, not a failure


@pytest.mark.slow  # a second lowering of the model above
def test_the_preflight_check_counts_the_fallback_operators_as_the_stage_does(tmp_path):
    summary = pte.read(lower_stage(tmp_path, WithUnsupportedOps().eval(), "xnnpack")[0]).delegation
    # the pre-flight check lowers in memory and sees the same, and that the program loads (no kernel missing)
    assert lower.preflight_delegation(WithUnsupportedOps().eval(), [NCHW], "xnnpack") == {**summary, "run_error": None}


def test_a_program_with_nothing_delegated_is_flagged(tmp_path):
    path, message = lower_stage(tmp_path, OnlyUnsupported().eval(), "xnnpack")
    assert path.is_file()
    assert message.startswith("nothing was delegated to XNNPACK") and "\n" not in message


SUBPROCESS_LOWERING = textwrap.dedent("""
    import os, torch
    from pathlib import Path
    from torch import nn
    from mobilebuild.routes.executorch.worker import lower
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5)).eval()
    specs = [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}]
    for delegate in ("xnnpack", "coreml"):
        Path(delegate + ".pte").write_bytes(lower.lower_to_bytes(model, specs, delegate))
    print(os.environ.get("FLATC_EXECUTABLE", ""))
""")


@pytest.mark.slow
def test_flatc_workaround_with_the_variable_unset_and_byte_identical_across_processes_and_directories(tmp_path):
    """Two builds in two processes, from two directories. Core ML's spec metadata is a protobuf map written in a
    per-process order: only separate processes show that."""
    env = {k: v for k, v in os.environ.items() if k != "FLATC_EXECUTABLE"}
    directories = [tmp_path / name / "checkout" for name in ("one", "two")]
    processes = []
    for cwd in directories:
        cwd.mkdir(parents=True)
        processes.append(subprocess.Popen([sys.executable, "-c", SUBPROCESS_LOWERING], cwd=cwd, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for process in processes:
        stdout, stderr = process.communicate()
        assert process.returncode == 0, stderr[-2000:]
        assert stdout.strip().endswith(os.path.join("executorch", "data", "bin", "flatc"))
    for delegate in ("xnnpack", "coreml"):
        first, second = ((cwd / f"{delegate}.pte").read_bytes() for cwd in directories)
        assert len(first) > 1000 and first == second


@pytest.mark.slow
def test_core_ml_lowerings_of_one_model_never_share_a_scratch_directory(monkeypatch, tmp_path):
    """ExecuTorch names its Core ML scratch directory after the model identifier, which we derive from the model: two
    processes lowering one model (doit -n 2, two checkouts) shared it and deleted it under each other."""
    from executorch.backends.apple.coreml.compiler import coreml_preprocess

    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    backend = coreml_preprocess.CoreMLBackend
    save_metadata = backend.save_model_metadata
    scratch = []

    def recording(model_metadata, model_dir_path):
        scratch.append(Path(model_dir_path))
        assert not (shared_tmp / Path(model_dir_path).parent.name).exists()
        return save_metadata(model_metadata=model_metadata, model_dir_path=model_dir_path)

    monkeypatch.setattr(backend, "save_model_metadata", staticmethod(recording))
    programs = [lower.lower_to_bytes(conv_bn(), [NCHW], "coreml") for _ in range(2)]
    assert programs[0] == programs[1]
    assert len(scratch) == 2 and scratch[0] != scratch[1]
    assert not any(path.exists() for path in scratch)


def test_a_user_flatc_setting_is_kept(monkeypatch):
    from mobilebuild.routes.executorch.worker import setup as executorch_setup

    monkeypatch.setenv("FLATC_EXECUTABLE", "/opt/my/flatc")
    assert executorch_setup.ensure_flatc() == "/opt/my/flatc"
    assert os.environ["FLATC_EXECUTABLE"] == "/opt/my/flatc"
    monkeypatch.delenv("FLATC_EXECUTABLE")
    assert executorch_setup.ensure_flatc() == str(executorch_setup.shipped_flatc())


def test_an_unexportable_model_is_one_line_naming_the_target(tmp_path):
    with pytest.raises(MobileBuildError) as caught:
        lower_stage(tmp_path, DataDependent().eval(), "xnnpack")
    assert caught.value.field == "targets"
    assert "torch.export cannot capture the model" in caught.value.message
    assert "torch.cond" in caught.value.message and "\n" not in str(caught.value)


@pytest.mark.parametrize(("delegate", "precision", "options", "words"), [
    ("vulkan", "int8", {}, "int8 lowering is supported for xnnpack and coreml"),
    ("coreml", "fp32", {"compute_units": "gpu"}, "compute_units: 'gpu' is not one of"),
    ("xnnpack", "fp32", {"threads": 2}, "xnnpack has no option 'threads'"),
    ("tflite", "fp32", {}, "unknown ExecuTorch delegate"),
])
def test_bad_settings_are_refused_before_lowering(delegate, precision, options, words):
    with pytest.raises(MobileBuildError) as caught:
        lower.lower_to_bytes(conv_bn(), [NCHW], delegate, precision, options)
    assert caught.value.field == "targets" and words in caught.value.message


def test_core_ml_int8_with_per_tensor_weights_names_the_weights_setting():
    with pytest.raises(MobileBuildError) as caught:
        lower.lower_to_bytes(conv_bn(), [NCHW], "coreml", "int8", weights="per_tensor")
    assert caught.value.field == "quantize.weights"


# --- dynamic int8 (quantize.mode: dynamic) -------------------------------------------------------------------------

TOKENS = {"name": "ids", "shape": [1, 16], "dtype": "int64", "range": [0, 100], "memory_format": "contiguous",
          "dynamic": [{"axis": 1, "dim": "seq", "min": 4, "max": 32}]}


def text_sqnr(model, program, length):
    """SQNR of `program` against the eager model on 8 random sentences of `length` tokens."""
    sentences = [modeling.example_inputs([{**TOKENS, "shape": [1, length]}], seed=100 + i)[0] for i in range(8)]
    with torch.no_grad():
        return sqnr_db(torch.cat([model(x) for x in sentences]), torch.cat([program(x) for x in sentences]))


def lower_text(folder, mode, **settings):
    from tiny_models import tiny_transformer

    model = tiny_transformer()
    rebuild = stored_fused(model, folder / "fused.pt", "tiny_models:tiny_transformer")
    config = LowerConfig(precision="int8", inputs=[TOKENS], delegate="xnnpack", options={}, mode=mode,
                         calibration=RANDOM_CALIBRATION if mode == "static" else None, **rebuild, **settings)
    path = folder / f"{mode}-{len(settings)}.pte"
    lower.run({"model": folder / "fused.pt"}, config, path)
    return model, et_runtime.load(path, SimpleNamespace(inputs=[TOKENS], timing={"threads": 1})), path


@pytest.fixture(scope="module")
def text_programs(tmp_path_factory):
    """A tiny Transformer lowered to XNNPACK int8, statically (calibrated) and dynamically."""
    folder = tmp_path_factory.mktemp("text")
    model, static, _ = lower_text(folder, "static")
    _, dynamic, path = lower_text(folder, "dynamic")
    return model, static, dynamic, path


@pytest.mark.slow  # two int8 lowerings of a Transformer
def test_dynamic_int8_beats_static_on_a_transformer_and_keeps_its_dynamic_dims(text_programs):
    model, static, dynamic, path = text_programs
    # measured: static 23.8 dB at the example length (and no other length runs); dynamic 44.1 / 44.5 / 46.5 dB
    assert text_sqnr(model, dynamic, 16) > max(35.0, text_sqnr(model, static, 16) + 10)
    for length in (4, 32):  # the dims' smallest and largest: dynamic int8 keeps them (its own capture)
        assert text_sqnr(model, dynamic, length) > 35.0
        with pytest.raises(Exception):  # noqa: B017 - static int8 is fixed at the example's sizes
            text_sqnr(model, static, length)
    assert pte.read(path).delegation["delegates"] == {"XnnpackBackend": 11}  # its Linears, quantized, delegated


@pytest.mark.slow  # a third int8 lowering of it
def test_dynamic_int8_keeps_excluded_modules_float(tmp_path, text_programs):
    model, _, dynamic, _ = text_programs
    kept, program, _ = lower_text(tmp_path, "dynamic", exclude=["Linear"])  # every Linear float: nothing quantized
    assert text_sqnr(kept, program, 16) > 80.0 > text_sqnr(model, dynamic, 16)


@pytest.mark.parametrize(("delegate", "weights", "field", "words"), [
    ("xnnpack", "per_tensor", "quantize.weights", "ExecuTorch's dynamic int8 recipe (XNNPACK) quantizes weights per "
                                                  "channel only"),
    ("coreml", None, "quantize.mode", "Core ML's int8 recipe is static (calibrated): mode 'dynamic' is XNNPACK's"),
])
def test_dynamic_int8_settings_no_recipe_has_are_one_line_naming_the_field(delegate, weights, field, words):
    with pytest.raises(MobileBuildError) as caught:
        lower.lower_to_bytes(conv_bn(), [NCHW], delegate, "int8", weights=weights, mode="dynamic")
    assert caught.value.field == field and words in caught.value.message and "\n" not in str(caught.value)
