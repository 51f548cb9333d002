"""ncnn: the fused float model to ncnn's .param and .bin, converted by pnnx (ncnn's PyTorch converter), shipped as one
zip.

The model is traced (torch.jit.trace, at the example's sizes with a batch of one: ncnn's blobs have no batch axis,
and the runtime feeds a batch one sample at a time) with its outputs as a flat tuple (a transformers model returns a
dict, which the tracer refuses), saved as TorchScript in a scratch folder, and converted there by the pnnx binary
itself. Its Python wrapper (pnnx.convert) ignores the binary's exit code, lets its 35-55 lines of log through to the
build's stderr, drops fp16=0 on its shapes-only path and imports the Python file it generates, which is not always
valid Python (`self.0 = ...` for an nn.Sequential). Here the log is captured: on failure the build gets one line
naming pnnx with its last line that says something, and the node's log gets all of it. pnnx's own side files
(its .pnnx.param, .pnnx.bin, .pnnx.onnx, the generated Python) stay in the scratch folder.

A model pnnx converts only in part keeps the operations it could not map as layers ncnn has no kernel for
(`pnnx.Expression`, `aten::argsort`, `torch.fft.rfft`): they are named in one line. The converted model is then
loaded and run once on ncnn's CPU path, on the example's first sample, in a process of its own (first_run).

pnnx's output is byte-identical from run to run; the zip holds model.ncnn.param and model.ncnn.bin, sorted, stored,
with fixed times and modes (as lm_genai's), so the same conversion gives the same bytes.
"""

import collections
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy
import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.ncnn import plan
from mobilebuild.routes.ncnn.worker import int8, runtime
from mobilebuild.worker import archive, capture_root, failures, outputs, progress
from mobilebuild.worker.stages import calibration, exclusion, fuse, modeling

PARAM, BIN = runtime.PARAM, runtime.BIN
# pnnx's input type suffixes (inputshape=[1,3,224,224]f32,[1,16]i64)
TYPES = {torch.float32: "f32", torch.float16: "f16", torch.float64: "f64", torch.int64: "i64", torch.int32: "i32",
         torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "u8"}
# Log lines that say nothing about a failure: pnnx's pass banners and its closing statistics
NOT_SAYING = ("#####", "inputshape", "model inputshape", "FLOPS", "memory OPS", "pnnxparam", "pnnxbin", "pnnxpy",
              "pnnxonnx", "ncnnparam", "ncnnbin", "ncnnpy", "fp16", "optlevel", "device", "inputshape2", "customop",
              "moduleop", "get inline")
FIRST_RUN_LIMIT_S = 600  # the converted model's first run (the stage's own time limit bounds the whole)


def pnnx_binary():
    import pnnx

    return Path(pnnx.__file__).resolve().parent / "pnnx"


class Flat(torch.nn.Module):
    """The model with its outputs as a flat tuple of tensors, in the order verification names them
    (worker.outputs.leaves): ncnn's out0, out1... A model's dict (a transformers output) or nested structure traces
    as such."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return tuple(value for _, value in outputs.leaves(self.model(*inputs)))


def examples_of(specs):
    """The example inputs with a batch of one, as ncnn's blobs take each sample."""
    return tuple(x[:1].contiguous() for x in modeling.example_inputs(specs))


def input_shapes(examples):
    """pnnx's inputshape= value: each input's shape and type."""
    return ",".join(f"[{','.join(str(int(n)) for n in x.shape)}]{TYPES[x.dtype]}" for x in examples)


def trace(model, examples, path):
    """The model traced with flat outputs, saved as TorchScript at `path`."""
    flat = Flat(model).eval()
    with torch.no_grad():
        produced = outputs.leaves(model(*examples))
        if not produced:
            raise MobileBuildError("the model returns no tensor: ncnn's outputs are tensors", field="model")
        held = outputs.held_objects(model, examples)
        if held:
            raise MobileBuildError(f"the model returns {held}: pnnx converts a traced model, whose outputs are "
                                   f"tensors: {outputs.object_advice(held)}", field="model")
        try:
            traced = torch.jit.trace(flat, examples, check_trace=False)
        except Exception as exc:  # the tracer raises many types
            raise MobileBuildError(f"torch.jit.trace failed ({modeling.first_line(exc)}); pnnx converts a traced "
                                   "model: forward must record tensor operations only", field="model") from None
    traced.save(str(path))
    return [name for name, _ in produced]


def last_saying(log):
    """The last line of pnnx's log that says something (not a pass banner or its closing statistics)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    saying = [line for line in lines if not line.startswith(NOT_SAYING)]
    return (saying or lines or ["no output"])[-1]


def convert(traced, folder, examples, weights):
    """pnnx on the TorchScript file `traced`, with `weights` fp32 or fp16, writing everything into `folder`: (the
    .param, the .bin)."""
    folder = Path(folder)
    param, binary = folder / PARAM, folder / BIN
    argv = [str(pnnx_binary()), str(traced), f"inputshape={input_shapes(examples)}",
            f"fp16={int(weights == 'fp16')}", "optlevel=2", "device=cpu",
            f"pnnxparam={folder / 'model.pnnx.param'}", f"pnnxbin={folder / 'model.pnnx.bin'}",
            f"pnnxpy={folder / 'model_pnnx.py'}", f"pnnxonnx={folder / 'model.pnnx.onnx'}",
            f"ncnnparam={param}", f"ncnnbin={binary}", f"ncnnpy={folder / 'model_ncnn.py'}"]
    ran = subprocess.run(argv, capture_output=True, text=True, cwd=folder)
    if ran.returncode != 0 or not (param.is_file() and binary.is_file()):
        what = (f"exit {ran.returncode}" if ran.returncode >= 0 else f"signal {-ran.returncode}") \
            if ran.returncode != 0 else "no .param and .bin written"
        raise failures.Failed({"raised_by": "pnnx", "part": None,
                               "error": f"{last_saying(ran.stderr + ran.stdout)} ({what})",
                               "traceback": f"$ {' '.join(argv)}\n{ran.stdout}\n{ran.stderr}"})
    return param, binary


def unconverted(param_text):
    """{layer type: count} of the .param's layers ncnn has no kernel for: operations pnnx could not map."""
    import ncnn

    found = collections.Counter()
    for line in param_text.splitlines()[2:]:
        kind = line.split(maxsplit=1)[0] if line.strip() else None
        if kind and ncnn.layer_to_index(kind) < 0:
            found[kind] += 1
    return dict(found)


def check_converted(param, names):
    left = unconverted(param.read_text())
    if left:
        kinds = ", ".join(f"{kind}" + (f" ({count})" if count > 1 else "") for kind, count in left.items())
        raise MobileBuildError(f"pnnx could not convert every operation to an ncnn layer: {kinds} left as layers "
                               "ncnn has no kernel for; replace them in the model, or choose a target whose runtime "
                               "has them (onnx, executorch)", field="model")
    blobs = runtime.output_blobs(param.read_text())
    if len(blobs) != len(names):
        raise MobileBuildError(f"pnnx wrote {len(blobs)} output blob(s) for the model's {len(names)} output tensor(s) "
                               f"({', '.join(names)})", field="model")


def write_zip(files, output, precision):
    """The files ({name: bytes}) in one zip (worker/archive.py), its comment naming the precision the runtime sets
    ncnn's fp16 options for (guest.read)."""
    archive.write_zip(files, output, comment=f"{runtime.guest.PRECISION}{precision}".encode())


def converted(model, examples, weights):
    """pnnx's conversion of `model` (traced at `examples`) with fp32 or fp16 `weights`: {PARAM: bytes, BIN: bytes}."""
    with tempfile.TemporaryDirectory(prefix="mobilebuild-ncnn-") as scratch:
        traced = Path(scratch, "model.pt")
        names = trace(model, examples, traced)
        param, binary = convert(traced, scratch, examples, weights)
        check_converted(param, names)
        return {PARAM: param.read_bytes(), BIN: binary.read_bytes()}


def quantize(files, model, captured, config):
    """pnnx's fp32 files rewritten as ncnn's int8 model (int8.quantized), calibrated on the recipe's batches."""
    param = files[PARAM].decode()
    named = int8.layer_modules(model, lambda: captured(*examples_of(config.inputs)), int8.parse(param))
    kept = int8.kept_float(exclusion.resolve(model, config.exclude), named)
    batches = calibration.at_example_sizes(config.calibration, config.inputs, "pnnx's conversion at them takes")
    return int8.quantized(files, batches, config.observer or plan.OBSERVERS[0], kept, config.weights == "per_tensor")


def first_run(files, precision, examples, what="pnnx's conversion"):
    """The model's `files` run once on ncnn's CPU path, on the example's first sample, in a process of its own (the
    guest runner, by its path), before ncnn runs them in the stage's (int8's calibration) or the file is written: on
    some of pnnx's conversions ncnn corrupts its heap (a scaled dot-product attention with a boolean mask, as
    GPT-2's), which would end the stage's process with a signal and glibc's last words on the console. Here that is
    one line naming ncnn, and the node's log has what it wrote."""
    with tempfile.TemporaryDirectory(prefix="mobilebuild-ncnn-") as scratch:
        model, inputs = Path(scratch, "model.ncnn.zip"), Path(scratch, "inputs.npz")
        write_zip(files, model, precision)
        numpy.savez(inputs, *(x.numpy() for x in examples))
        argv = [sys.executable, runtime.guest.__file__, str(model), str(inputs)]
        try:
            ran = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=FIRST_RUN_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise MobileBuildError(f"ncnn ran {what} on the example's first sample for {FIRST_RUN_LIMIT_S} s without a "
                                   "result", field="model") from None
    if ran.returncode != 0:
        how = f"signal {signal.Signals(-ran.returncode).name}" if ran.returncode < 0 else f"exit {ran.returncode}"
        raise failures.Failed({"raised_by": "ncnn", "part": None,
                               "error": f"its run of {what} on the example's first sample ended ({how}): "
                                        f"{last_saying(ran.stderr)}",
                               "traceback": f"$ {' '.join(argv)}\n{ran.stdout}\n{ran.stderr}"})


def run(inputs, config, output):
    model = fuse.load(inputs["model"], config)
    captured = capture_root.nested(model, len(config.inputs))
    examples = examples_of(config.inputs)
    weights = "fp16" if config.precision == "fp16" else "fp32"
    progress.note(f"pnnx ({weights} weights)")
    files = converted(captured, examples, weights)
    first_run(files, weights, examples)
    if config.precision == "int8":
        files = quantize(files, model, captured, config)
        first_run(files, config.precision, examples, "the int8 model")
    write_zip(files, output, config.precision)
