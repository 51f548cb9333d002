"""The model zoo: architectures users ship, each built for the host targets (TARGETS), verified and benchmarked, in a
table.

Not part of the default build. For each model it writes a scratch project (dodo.py, the zoo's factories from
benchmarks/zoo/, the model's recipe), builds it (`mobilebuild build -n 1`, the shared artifact cache off so every
build is cold), one model at a time, reads the manifest and prints per target: verified (SQNR), FAILED verification
(the numbers) or refused (the one line the build gave), and the model's build time. The table goes to docs/zoo.md.

Nothing is downloaded: the image classifiers are trained briefly on scikit-learn's digits by the build itself
(`model.train`, zoo_models.train_on_digits); the other models keep seeded random weights, with batch-norm
statistics re-estimated on random batches.

    .venv/bin/python benchmarks/zoo.py [--only NAME[,NAME]] [--columns COLUMN[,COLUMN]] [--quick] [--keep DIR]
        [--no-docs] [--table]

--columns ncnn-fp32,... (ncnn's columns only, added after the page's rows were built) writes a table of its own,
the page's "ncnn columns" section, and leaves the rest of the page as it is.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import yaml
from _bench import REPO, bytecode_env

MOBILEBUILD = Path(sys.executable).with_name("mobilebuild")
FACTORIES = Path(__file__).with_name("zoo") / "zoo_models.py"
DOCS = REPO / "docs" / "zoo.md"
HUB_SECTION = "## Hub zoo"  # docs/zoo.md's section by benchmarks/hub_zoo.py, which this script's page keeps

TARGETS = {  # column -> target entry
    "xnnpack": {"backend": "xnnpack"},
    "qnnpack": {"backend": "qnnpack"},
    "et-fp32": {"backend": "xnnpack", "runtime": "executorch", "name": "et-fp32"},
    "et-int8": {"backend": "xnnpack", "runtime": "executorch", "precision": "int8", "name": "et-int8"},
    "onnx-fp32": {"backend": "onnx", "name": "onnx-fp32"},
    "onnx-int8": {"backend": "onnx", "precision": "int8", "name": "onnx-int8"},
    "litert-fp32": {"backend": "xnnpack", "runtime": "litert", "name": "litert-fp32"},
    "litert-int8": {"backend": "xnnpack", "runtime": "litert", "precision": "int8", "name": "litert-int8"},
    "ncnn-fp32": {"backend": "ncnn", "name": "ncnn-fp32"},
    "ncnn-fp16": {"backend": "ncnn", "precision": "fp16", "name": "ncnn-fp16"},
    "ncnn-int8": {"backend": "ncnn", "precision": "int8", "name": "ncnn-int8"},
    "vulkan-ncnn": {"backend": "vulkan", "runtime": "ncnn", "name": "vulkan-ncnn"},  # fp16 by default
}
NCNN = [column for column in TARGETS if "ncnn" in column]  # built alone: the "ncnn columns" sections
NCNN_HEADING = "## Model zoo: ncnn columns"  # this script's ncnn section, after the zoo's refusals

IMAGE = {"distribution": {"uniform": {"low": 0, "high": 1}}}
DYNAMIC = {"quantize": {"mode": "dynamic"}}
# ONNX Runtime runs an ONNX LSTM of any length; the TorchScript-based exporter writes one, torch.export unrolls it
TORCHSCRIPT_ONNX = {"onnx": {"exporter": "torchscript"}}
TEXT = {"dims": {"seq": {"min": 8, "max": 128, "example": 32}}, "outputs": ["scores"],
        # dynamic int8 (Linear/LSTM weights) on qnnpack, as PyTorch Mobile ships text models
        "own": {"qnnpack": DYNAMIC}}


def image(*shape, **extra):
    return {"input": {"shape": list(shape), **IMAGE, **extra}}


# Image classifiers taking one 1x3xSxS image are trained briefly on scikit-learn's digits, upscaled to S x S
# (zoo_models.train_on_digits): a randomly initialised batch-norm network amplifies any perturbation, int8 rounding
# among them, far beyond what a trained one does (see the docs' prose). The other models keep random weights.
TRAIN_STEPS = 100


def digits_classifier(model, size, optimizer="sgd"):
    """Recipe fields of an image classifier on one 1x3xSxS image, its weights trained on digits with `optimizer`
    (SGD for the convolutional networks, AdamW for those that need it)."""
    kwargs = {"size": size, "steps": TRAIN_STEPS, **({"optimizer": optimizer} if optimizer != "sgd" else {})}
    train = {"function": "zoo_models:train_on_digits", "kwargs": kwargs}
    # calibrated and verified on digits, which the trained model's outputs vary on (random images barely move them)
    digits = {"source": "function", "function": "zoo_models:digits_batches", "kwargs": {"size": size}}
    return {"model": {**model, "train": train}, **image(1, 3, size, size), "calibration": digits,
            "evaluation": "calibration-holdout"}


# name -> (what it is, recipe fields). Shared settings are added by recipes(); "own": {column: that target's own
# settings}.
ZOO = {
    "mobilenet_v3_small": ("torchvision MobileNetV3-Small, 1x3x112x112",
                           digits_classifier({"torchvision": "mobilenet_v3_small"}, 112)),
    "shufflenet_v2": ("torchvision ShuffleNetV2 x0.5, 1x3x112x112",
                      digits_classifier({"torchvision": "shufflenet_v2_x0_5"}, 112)),
    "efficientnet_b0": ("torchvision EfficientNet-B0 (SiLU, squeeze-excitation), 1x3x112x112",
                        digits_classifier({"torchvision": "efficientnet_b0"}, 112)),
    "resnet18": ("torchvision ResNet-18, 1x3x112x112", digits_classifier({"torchvision": "resnet18"}, 112)),
    "convnext_tiny": ("torchvision ConvNeXt-Tiny (LayerNorm, GELU, layer scale), 1x3x112x112",
                      digits_classifier({"torchvision": "convnext_tiny"}, 112, "adamw")),
    "vit_tiny": ("torchvision VisionTransformer, ViT-Tiny widths, 6 layers, patch 8, 1x3x64x64",
                 digits_classifier({"factory": "zoo_models:vit_tiny"}, 64, "adamw")),
    "lraspp": ("torchvision LR-ASPP MobileNetV3-Large segmentation, dict output, 1x3x128x128; `script: trace` "
               "(TorchScript cannot compile int8 dict outputs)",
               {"model": {"torchvision": "lraspp_mobilenet_v3_large"}, **image(1, 3, 128, 128), "outputs": ["out"],
                "script": "trace"}),
    "r3d_18": ("torchvision R3D-18 video classifier, 5-D input 1x3x8x64x64",
               {"model": {"torchvision": "r3d_18"}, **image(1, 3, 8, 64, 64, memory_format="contiguous")}),
    "raft_small": ("torchvision RAFT-small optical flow, two images 1x3x128x128 (its smallest), 12 flow updates "
                   "(12 outputs)",
                   {"model": {"torchvision": "raft_small"},
                    "inputs": [{"name": "image1", "shape": [1, 3, 128, 128], **IMAGE},
                               {"name": "image2", "shape": [1, 3, 128, 128], **IMAGE}]}),
    "text_transformer": ("nn.TransformerEncoder sentence classifier, 2 layers x 128, two inputs (ids, mask), "
                         "seq 8-128; `script: trace` (a dynamically quantized Transformer cannot be scripted); "
                         "int8: dynamic (qnnpack, et-int8, onnx-int8, litert-int8)",
                         {"model": {"factory": "zoo_models:text_transformer"},
                          "inputs": [{"name": "ids", "shape": [1, "seq"], "dtype": "int64", "range": [0, 1000]},
                                     {"name": "mask", "shape": [1, "seq"], "dtype": "int64", "range": [0, 2]}],
                          "script": "trace", **TEXT,
                          # dynamic int8 on every int8 route, as ONNX Runtime advises for Transformers (static:
                          # 11.6 dB on ExecuTorch; 3-7 dB on ONNX Runtime, 16-30 dB since its export keeps the
                          # attention mask's nodes float; calibrated on random token ids)
                          "own": {"qnnpack": DYNAMIC, "et-int8": DYNAMIC, "onnx-int8": DYNAMIC,
                                  "litert-int8": DYNAMIC}}),
    "lstm": ("nn.LSTM text classifier, 2 layers x 128, ids, seq 8-128; qnnpack, onnx-int8: dynamic int8; onnx: "
             "`onnx.exporter: torchscript` (torch.export unrolls nn.LSTM, pinning the length)",
             {"model": {"factory": "zoo_models:lstm_classifier"},
              "inputs": [{"name": "ids", "shape": [1, "seq"], "dtype": "int64", "range": [0, 1000]}], **TEXT,
              "own": {**TEXT["own"], "onnx-fp32": TORCHSCRIPT_ONNX, "onnx-int8": {**DYNAMIC, **TORCHSCRIPT_ONNX}}}),
    "m5_speech": ("M5 keyword spotting on raw 1-D audio, 1x1x8000 (0.5 s at 16 kHz)",
                  {"model": {"factory": "zoo_models:m5"},
                   "input": {"shape": [1, 1, 8000], "memory_format": "contiguous"}}),
    "image_metadata": ("two inputs: small CNN on a 1x3x64x64 image + MLP on 1x16 features, concatenated",
                       {"model": {"factory": "zoo_models:image_with_metadata"},
                        "inputs": [{"name": "image", "shape": [1, 3, 64, 64], **IMAGE},
                                   {"name": "metadata", "shape": [1, 16], "memory_format": "contiguous"}]}),
    "classify_locate": ("two outputs: MobileNetV3-Small features, class scores + box, 1x3x96x96",
                        {**digits_classifier({"factory": "zoo_models:classify_and_locate"}, 96),
                         "outputs": ["scores", "box"]}),
}

# What a refusal means: (a piece of its line, whose limit it is). Judged on the lines this zoo gave; a new line
# shows up as "not classified yet".
MEANINGS = [
    ("QNNPACK only supports conv2d", "QNNPACK: no 3-D convolution (its packed convolution weights are 2-D only)"),
    ("scale ratio must be in", "QNNPACK: its quantized add takes input-to-output scale ratios in [2^-14, 2^8) only; "
                               "ConvNeXt's layer scale (1e-6 at initialisation) is far below"),
    ("FX graph mode cannot trace", "PyTorch's FX graph-mode quantization: forward has Python control flow on "
                                   "tensor values (RAFT's iterations), and the model has no QuantStubs for eager mode"),
    ("in kernel_ops_util: Check failed", "ExecuTorch: its portable convolution kernel takes 3-D or 4-D input only, "
                                         "and the XNNPACK delegate takes no 3-D convolution"),
    ("left outside XNNPACK", "ExecuTorch: the XNNPACK quantizer quantizes 3-D convolutions, which the delegate then "
                             "does not take, and ExecuTorch has no kernel for the dequantize ops left around them"),
    ("found that the model fixes dim", "torch.export, which ExecuTorch has no alternative to: nn.LSTM is unrolled "
                                       "over the sequence, so its length cannot stay dynamic"),
    ("litert-torch cannot convert", "litert-torch: its torch.export, JAX lowering or MLIR converter has no path for "
                                    "an operation of the model (the line names it)"),
    ("not implemented for 'Long'", "litert-torch's PT2E quantizer annotates both operands of a float mul, a 0-dim "
                                   "int64 constant among them (RAFT's graph has such), and torchao's HistogramObserver "
                                   "cannot calibrate it (torch.histc has no int64 kernel); reproduced with "
                                   "litert-torch and torchao alone on `x * torch.tensor(2)`"),
    ("Tensor.reshape left as layers", "ncnn's runtime, whose blobs have at most 4 dims (w, h, d, c) beside the "
                                      "batch, which pnnx's converter then leaves as is: RAFT views its correlation "
                                      "volume as 1x16x16x1x16x16 before dividing it and reshaping it to 256x1x16x16 "
                                      "[`matmul, view(1, h, w, 1, h, w), / 8, reshape(h * w, 1, h, w)` alone leaves "
                                      "the same Tensor.reshape; with a 4-D view, or without the division between the "
                                      "two reshapes, which pnnx then folds into one, it converts]"),
    ("Tensor.masked_fill", "ncnn's layer set, so pnnx's converter leaves them as they are: ncnn has no layer for "
                           "torch.eq, bitwise_not or masked_fill (its BinaryOp has no comparisons), nor a cast of "
                           "integers to floats (its Cast knows fp32, fp16, bf16 and int8), which the padding mask is "
                           "computed with from the integer mask input [`x.masked_fill((mask == 0).unsqueeze(-1), 0.0)` "
                           "alone leaves torch.eq and Tensor.masked_fill, `x * mask.unsqueeze(-1).to(x.dtype)` leaves "
                           "Tensor.to]"),
    ("PythonAction Error", "mobilebuild: a stage crashed (traceback in the build output)"),
]


def recipes(name, quick, columns=tuple(TARGETS)):
    """{recipe name: recipe} for one zoo model, with the targets of `columns`."""
    fields = dict(ZOO[name][1])
    own = fields.pop("own", {})
    data = {"name": name, **fields}
    # training leaves batch-norm statistics of its own; random weights get them re-estimated on random batches
    stats = 0 if "train" in data["model"] else 1 if quick else 2
    data["model"] = {"seed": 0, "batchnorm_stats": stats, **data["model"]}
    calibration = data.pop("calibration", {"source": "random", "seed": 0})
    data["quantize"] = {"calibration": {**calibration, "batches": 2 if quick else 8}}
    evaluation = data.pop("evaluation", None)
    # Top-1 agreement between two sets of near-equal random scores (1000 classes, random weights) is a coin toss
    # whatever the artifact: with 4 inputs, fp32-exact int8 models "failed" it at 0.75. It is not judged for int8;
    # SQNR, cosine and the relative error are, at their defaults.
    data["verify"] = {"samples": 2 if quick else 8, "thresholds": {"int8": {"top1_agreement": 0}},
                      **({"evaluation": evaluation} if evaluation else {})}
    data["benchmark"] = {"warmup": 1 if quick else 2, "iters": 3 if quick else 10}
    data["targets"] = [{**target, **own.get(column, {})} for column, target in TARGETS.items() if column in columns]
    return {name: data}


def build(root, name, quick, env, written=None, files=(FACTORIES,), command=(str(MOBILEBUILD),)):
    """Build one model in a project of its own: (seconds, the build's output lines, {column: (kind, one line)}).
    `written`: its recipes ({name: recipe}; the zoo's by default), `files`: what the project imports, `command`:
    the mobilebuild to run (the hub zoo's)."""
    project = root / name
    (project / "recipes").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dodo.py", project / "dodo.py")
    for source in files:
        shutil.copy(source, project / source.name)
    written = written or recipes(name, quick)
    for recipe_name, data in written.items():
        (project / "recipes" / f"{recipe_name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    started = time.perf_counter()
    proc = subprocess.run([*command, "build", "-n", "1", *(f"recipes/{n}.yaml" for n in written)],
                          cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace")
    seconds = time.perf_counter() - started
    (project / "build.log").write_text(proc.stdout)
    lines = proc.stdout.splitlines()
    return seconds, lines, results(project, written, lines)


def results(project, recipe_names, lines):
    """{column: (kind, one line)} from the model's manifests; a target without one gets the build's first error."""
    found = {}
    for recipe_name in recipe_names:
        path = project / "artifacts" / recipe_name / "manifest.json"
        if path.exists():
            manifest = json.loads(path.read_text())
            for target in manifest["targets"]:
                found[target["target"]] = (target, manifest["verification"].get(target["target"]))
    crashes = crash_lines(lines)
    for column, (target, verification) in found.items():
        task = (target.get("reason") or "").split(":")[:2]
        if "PythonAction Error" in (target.get("reason") or "") and ":".join(task) in crashes:
            target["reason"] += f" (the traceback ends: {crashes[':'.join(task)]})"
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]

    def missing(column):  # the error of one of the target's own tasks ("litert:model-litert-int8: ..."), else the first
        own = [error for error in errors if error.split(": ", 1)[0].endswith(f"-{column}")]
        return "refused", f"not built: {(own or errors or lines[-1:] or ['no output'])[0]}"

    return {column: cell(*found[column]) if column in found else missing(column) for column in TARGETS}


def crash_lines(lines):
    """{task: the last exception line of its traceback} for each task doit reports as a PythonAction Error."""
    found, task = {}, None
    for line in lines:
        if line.startswith("TaskError - taskid:"):
            task = line.removeprefix("TaskError - taskid:").strip()
        elif task and (line.startswith(".  ") or line.startswith("skipped ") or line.startswith("ERROR")):
            task = None
        elif task and re.match(r"^[A-Za-z_][\w.]*: ", line) and "crashed in its worker" not in line:
            found[task] = line.strip()
    return found


def cell(target, verification):
    """(kind, one line): verified / FAILED verification / refused / whatever else the manifest says."""
    status, reason = target.get("status", "not verified"), target.get("reason")
    result = verification or {}
    metrics = result.get("metrics") or {}
    sqnr = f"SQNR {metrics['sqnr_db']:.1f} dB" if isinstance(metrics.get("sqnr_db"), (int, float)) else "no SQNR"
    worst = f", worst of {len(result['outputs'])} outputs: {result['worst_output']}" if "outputs" in result else ""
    if status.startswith("passed"):
        fixed = f"; {target['fixed_shape']}" if target.get("fixed_shape") else ""  # a dynamic dim the route kept fixed
        return "verified", f"verified ({sqnr}{worst}{', relaxed thresholds' if 'relaxed' in status else ''}{fixed})"
    if status == "failed" and reason:
        return "refused", f"refused: {reason}"
    if status == "failed":
        return "failed", f"FAILED verification ({'; '.join(result.get('failures') or []) or sqnr}{worst})"
    return status, status + (f": {reason}" if reason else "")


NATIVE_LOG = re.compile(r"^\[(?:[WEI]\d{4} |\w+\.(?:cpp|h):\d+\])")  # c10's and ExecuTorch's own log lines


def noise(lines):
    """What in the build's output is not mobilebuild's one line per thing: tracebacks, native log lines, warnings."""
    found = {"traceback(s)": sum("Traceback (most recent call last)" in line for line in lines),
             "native log lines": sum(bool(NATIVE_LOG.match(line)) for line in lines),
             "Python warnings": sum(bool(re.search(r"\w+Warning: ", line)) and not NATIVE_LOG.match(line)
                                    for line in lines)}
    return ", ".join([f"{len(lines)} lines"] + [f"{n} {what}" for what, n in found.items() if n])


def training_seconds(lines, name):
    """How long the model's train task took, from the line the build prints for its output; None: not trained."""
    found = re.search(rf"artifacts/{re.escape(name)}/trained\.pt \([^,]*, ([\d.]+) s\)", "\n".join(lines))
    return float(found.group(1)) if found else None


def training(seconds):
    return "" if seconds is None else f" (training {seconds:.0f} s)"


def meaning(line):
    return next((text for piece, text in MEANINGS if piece in line), "not classified yet")


def machine():
    """This host in words: cores, CPU model (with its family and model numbers where the name is only the brand,
    as in a virtual machine), system."""
    info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    info = {key.strip(): value.strip() for key, value in info.items()}
    cpu = info.get("model name") or platform.processor()
    numbers = f", family {info['cpu family']} model {info['model']}" if "cpu family" in info else ""
    return f"{os.cpu_count()}-core {cpu}{numbers} ({platform.system()} {platform.machine()}, no GPU)"


def markdown(rows, quick, total, note=None):
    """docs/zoo.md up to the hub zoo's section: what was run, the table (short cells), then every refusal and
    failure in full. `note`: how the rows were gathered, where not by one run (a kept rows.json's "note")."""
    versions = {package: version(package) for package in ("torch", "torchvision", "executorch", "onnxruntime",
                                                     "litert-torch", "ai-edge-litert")}
    kinds = [kind for _, _, cells, _, _, _ in rows for kind, _ in cells.values()]
    counts = ", ".join(f"{kinds.count(kind)} {kind}" for kind in sorted(set(kinds)))
    command = f"benchmarks/zoo.py{' --quick' if quick else ''}"
    samples, batches = (2, 2) if quick else (8, 8)
    runs = "1 warm-up and 3" if quick else "2 warm-ups and 10"
    trained = ", ".join(name for name in ZOO if "train" in ZOO[name][1]["model"])
    gathered = f"{note}\n\n" if note else ""
    out = [f"""# Model zoo

Architectures users ship, built by mobilebuild for the {len(TARGETS)} targets that run on this host, each verified
against the model's eager fp32 output and benchmarked. Generated by `.venv/bin/python {command}`
(not part of the default build; rerun it to refresh this page) on {datetime.date.today().isoformat()}, on a
{machine()} with
{', '.join(f'{k} {v}' for k, v in versions.items())}: {total / 60:.0f} minutes in all, each model built cold (shared
artifact cache off), one at a time, with `mobilebuild build -n 1`. The recipes are in `benchmarks/zoo.py`, the
models torchvision has no builder for in `benchmarks/zoo/zoo_models.py`.

- **Trained image classifiers, random weights for the rest.** Nothing is downloaded. The image classifiers on one
  1x3xHxW image ({trained})
  are trained by the build's own `model.train` task (`zoo_models:train_on_digits`): {TRAIN_STEPS} steps of batch 32 on
  scikit-learn's 8x8 digits, bilinearly upscaled to the input size and copied to 3 channels (SGD, lr 0.05,
  momentum 0.9; AdamW, lr 1e-3, for ViT and ConvNeXt, which SGD left untrained), then batch-norm statistics
  re-estimated on 8 batches of digits (without it MobileNetV3's slow running averages left an eval-mode model whose
  output hardly depended on its input); classify_locate's box head regresses the digit's ink box. Seeded, and the
  same bytes on every build; the seconds it takes are in the time column. The other models (segmentation, video,
  optical flow, text, speech, two inputs) keep random weights, seeded, with batch-norm statistics re-estimated on
  random batches.
- **Why train.** A randomly initialised batch-norm network amplifies any perturbation. Measured on the zoo's own
  models in fp32 (2026-11-24): rounding the [0, 1] input to 8-bit levels (x * 255 rounded, / 255: what camera
  images are anyway) changes the output of the random-weight ShuffleNetV2 by 21.4 dB SQNR, MobileNetV3-Small 34.8,
  EfficientNet-B0 35.7, classify_locate 35.1, ResNet-18 41.0 dB; after {TRAIN_STEPS} steps: 72.0, 77.6, 88.4, 85.4
  and 87.9 dB (digits test accuracy 83-96%; ViT 59%, ConvNeXt 69%). With random weights int8 missed 15 dB on ten
  cells of the first four (11.2-14.9 dB, the three independent int8 routes agreeing), and ConvNeXt's qnnpack was
  refused (QNNPACK's quantized add takes scale ratios of 2^-14 and up; the layer scale starts at 1e-6); trained,
  those cells verify.
- **Calibrated and verified on digits.** The trained classifiers are calibrated on the first {batches} digits of
  the training split (`quantize.calibration.source: function`, `zoo_models:digits_batches`) and verified on
  {samples} digits after them (`verify.evaluation: calibration-holdout`, never the calibration images). On random
  images a trained model's output hardly varies: the part that depends on the image is 29-46 dB below the whole
  (ViT and ConvNeXt 66 dB; 3-14 dB with random weights), so an int8 SQNR there mostly says the artifact keeps the
  model's common response (random images gave 24.0-48.5 dB on these rows, measured 2026-11-24). On digits that part
  is 2-16 dB below the whole: what these cells measure is the artifact following the model from image to image.
- **Verification:** each artifact is compared with the eager fp32 model on {samples} held-out inputs (digits for the
  trained classifiers, random inputs for the rest; per size, for text models: the shortest, example and longest
  sequence) at the default thresholds (fp32: SQNR 40 dB, int8: SQNR 15 dB, cosine 0.98, relative error 0.5),
  except top-1 agreement for int8 (hence "relaxed thresholds"): on random inputs the class scores of a random-weight
  model are near-equal, and which one is highest is a coin toss for any int8 model; on {samples} digits one
  disagreement moves it by {100 // samples} points. A model with several outputs is judged on its worst.
- **The text Transformer's int8 is dynamic** on all three int8 targets (`quantize.mode: dynamic`), as ONNX Runtime
  advises for Transformers. Static int8 fell short on it (2026-11-24, 8 random calibration batches): 11.6 dB on
  ExecuTorch, at the example length only; 3-7 dB on ONNX Runtime, whose calibration gave the attention's additive
  padding mask (0 and -inf) a scale of inf, so the masked scores were NaN. The export now keeps those nodes float
  (one line in the build says which): ONNX Runtime static, 16.0 / 29.8 / 29.2 dB at 8 / 32 / 128 tokens, verifies,
  still below dynamic. Dynamic: 38.2 dB on ExecuTorch, which keeps the dynamic length, and 35.8 dB on ONNX Runtime,
  beside qnnpack's 41.1 dB.
- **Targets:** `xnnpack`: PyTorch Mobile `.ptl`, fp32. `qnnpack`: PyTorch Mobile `.ptl`, int8 (static, calibrated
  on {batches} batches, digits or random as above; dynamic for the text models). `et-fp32`, `et-int8`: ExecuTorch
  `.pte`, XNNPACK delegate (int8: PT2E, per-channel; dynamic for the text Transformer). `onnx-fp32`, `onnx-int8`:
  ONNX Runtime (int8: its static QDQ quantization; dynamic, `quantize_dynamic`, for the text Transformer and the
  LSTM, whose ONNX export uses `onnx.exporter: torchscript`). `litert-fp32`, `litert-int8`: LiteRT `.tflite` by
  litert-torch, run by its interpreter's XNNPACK path (int8: PT2E static, float I/O; dynamic-range for the text
  Transformer); LiteRT takes fixed sizes only, so text models are verified at the example length.
- **Cells:** verified (lowest SQNR), FAILED verification (the thresholds missed), refused (the target's build
  stopped with one line; each is listed in full below the table with what it means). {counts}.
- **Time:** the whole model: training (in brackets, one thread), eight targets, verification, and a benchmark of
  each ({runs} timed runs, one thread). Benchmarks measure alone on the host, so other builds
  running at the time lengthen it.

{partial(rows)}{gathered}"""]
    lines, notes = table(rows, list(TARGETS))
    out[0] += "\n".join(lines)
    out += ["", "## Refusals, failures and fixed shapes", "", *listed(notes)]
    return "\n".join(out) + "\n"


def table(rows, columns):
    """The table's lines (short cells, each model's time) and what its cells point to, [(name, column, kind, line)]:
    refusals, failures and verified cells at a fixed shape, listed below it by listed()."""
    out, notes = [f"| model | {' | '.join(columns)} | time |", f"|---|{'---|' * len(columns)}---|"], []
    for name, about, cells, seconds, _, trained in rows:
        shown = []
        for column in columns:
            kind, text = cells[column]
            if kind == "verified":
                shown.append(text.replace("verified (SQNR ", "verified ").split(",")[0].split(";")[0].rstrip(")"))
                if "; " in text:  # verified at a shape the route fixed: said below the table
                    notes.append((name, column, kind, text))
                    shown[-1] += f" [{len(notes)}]"
            else:
                notes.append((name, column, kind, text))
                shown.append(f"{'refused' if kind == 'refused' else 'FAILED' if kind == 'failed' else kind} "
                             f"[{len(notes)}]")
        out.append(f"| **{name}**: {about} | {' | '.join(shown)} | {seconds:.0f} s{training(trained)} |")
    return out, notes


def listed(notes, meaning=meaning):
    """The numbered list of table()'s notes, each refusal with whose limit it is (`meaning`: of its line)."""
    return [f"{number}. {name} / {column}: `{text.replace('`', chr(39))}`"
            + (f" **Whose limit:** {meaning(text)}." if kind == "refused" else "")
            for number, (name, column, kind, text) in enumerate(notes, 1)]


def partial(rows):
    """The page's line saying which models the run did not reach; empty when it built them all."""
    missing = [name for name in ZOO if name not in {row[0] for row in rows}]
    return f"**Partial:** the run stopped before {', '.join(missing)}; their rows are missing.\n\n" if missing else ""


# What the ncnn sections' columns are (docs/ncnn.md says more), in both zoos' words
NCNN_COLUMNS = """\
`ncnn-fp32`: pnnx's conversion run on ncnn's CPU path. `ncnn-fp16`: pnnx's fp16 weights and ncnn's fp16 storage and
arithmetic (on this x86 host only `InnerProduct` computes in fp16), judged at the fp16 thresholds (SQNR 30 dB, cosine
0.999, top-1 agreement 0.98). `ncnn-int8`: ncnn's int8 convolutions and inner products, calibrated on the recipe's
`quantize.calibration` data, static on every model (the route has no dynamic mode). `vulkan-ncnn`: ncnn's Vulkan
path in fp16, here on Mesa's software driver llvmpipe (no GPU), at the fp16 thresholds; its time is a software
driver's and never ranked. pnnx converts at the example's sizes, so a dynamic dim is verified at its example size."""


def ncnn_markdown(rows, quick, total, run, note=None):
    """The zoo's ncnn section: how its rows were built, their table (the zoo's rows, ncnn's columns), and every
    refusal and failure in full."""
    rows = sorted(rows, key=lambda row: list(ZOO).index(row[0]))  # in the zoo's order, whatever --only's was
    lines, notes = table(rows, NCNN)
    missing = [name for name in ZOO if name not in {row[0] for row in rows}]
    return "\n".join([f"""{NCNN_HEADING}

The zoo's models, by the recipes above (the same training, calibration data and held-out inputs, {2 if quick else 8}
of each, the same thresholds: int8's top-1 agreement not judged) with ncnn's four targets instead ([ncnn.md](ncnn.md)).
{NCNN_COLUMNS}

A table of its own because the rows above were built before these targets existed, and their builds were not kept.
{how_built(run, total)} The time column is the model's build: training (in brackets), the four targets, verification
and benchmarks (1 thread, {'1 warm-up and 3' if quick else '2 warm-ups and 10'} runs).
{counted(rows, NCNN)}.
""", *([f"**Not built:** {', '.join(missing)}.", ""] if missing else []), *lines,
        *(["", "Refusals, failures and fixed shapes:", "", *listed(notes)] if notes else []),
        *(["", note] if note else [])]) + "\n"


def counted(rows, columns):
    """'1 refused, 13 verified': the cells of `columns` by kind."""
    kinds = [cells[column][0] for _, _, cells, *_ in rows for column in columns if column in cells]
    return ", ".join(f"{kinds.count(kind)} {kind}" for kind in sorted(set(kinds)))


def how_built(run, total):
    """The ncnn sections' sentence on how their rows were built: the command, when, on what, under what load."""
    loads = run["loads"]
    return (f"Built by `{run['command']}` on {run['started'][:10]}, {run['started'][11:16]}-{run['ended'][11:16]} UTC "
            f"({total / 60:.0f} min), one model at a time, each cold (shared artifact cache off, `mobilebuild build "
            f"-n 1`), with {', '.join(f'{p} {version(p)}' for p in ('torch', 'ncnn', 'pnnx'))}, on a {machine()} "
            f"shared with other work: one-minute load average {min(loads):.1f}-{max(loads):.1f}, read as the run "
            "started and as each model's build ended.")


def run_info():
    """This run's command line (nice included), its start, and the load average now, for how_built; main() adds to
    it as each model ends."""
    nice = f"nice -n {os.nice(0)} " if os.nice(0) else ""
    command = f"{nice}.venv/bin/python benchmarks/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}".strip()
    return {"command": command, "started": utc_now(), "ended": utc_now(), "loads": [os.getloadavg()[0]]}


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")


def write_section(section, end_of, docs=DOCS):
    """`docs` (docs/zoo.md) with `section` (its heading line, then its text) in place of the section of that heading,
    which runs to the next heading of its level or above; a new one goes at the end of the part under the heading
    `end_of` (the page's end where there is none). The rest of the page stays byte for byte as it is."""
    text = docs.read_text()
    heading = section.split("\n", 1)[0]

    def end(start, heading):  # where the part from `start`, under `heading`, ends: its next heading of that level
        found = re.compile(rf"^#{{1,{heading.index(' ')}}} ", re.M).search(text, start + 1)
        return found.start() if found else len(text)

    if f"\n{heading}\n" in text:
        start = text.index(f"\n{heading}\n") + 1
        stop = end(start, heading)
    else:
        parent = text.find(f"\n{end_of}\n")
        start = stop = end(parent + 1, end_of) if parent >= 0 else len(text)
    after = text[stop:]
    docs.write_text(text[:start].rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n" + ("\n" + after if after else ""))


def write_docs(rows, quick, total, note=None):
    """docs/zoo.md: the zoo's part rewritten, the hub zoo's section (benchmarks/hub_zoo.py) kept as it is."""
    text = DOCS.read_text() if DOCS.exists() else ""
    hub = text[text.find(HUB_SECTION):] if HUB_SECTION in text else ""
    DOCS.parent.mkdir(exist_ok=True)
    DOCS.write_text(markdown(rows, quick, total, note) + ("\n" + hub if hub else ""))


def arguments(description, known, **more):
    """(the command line's arguments, the model names it picks of `known`); `more`: further options by name, each
    argparse's keywords."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated model names: " + ", ".join(known))
    parser.add_argument("--quick", action="store_true", help="fewer calibration batches, samples and iterations")
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it (default: a temporary one)")
    parser.add_argument("--no-docs", action="store_true", help=f"do not write {DOCS.relative_to(REPO)}")
    for name, keywords in more.items():
        parser.add_argument(f"--{name}", **keywords)
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return args, names


def write_ncnn_docs(rows, quick, total, run, note=None):
    write_section(ncnn_markdown(rows, quick, total, run, note), "## Refusals, failures and fixed shapes")


def main():
    args, names = arguments(__doc__, ZOO, columns={
        "help": "comma-separated columns to build, all or ncnn's: " + ", ".join(TARGETS)}, table={
        "action": "store_true", "help": "write the page from the rows a --keep folder holds, building nothing"})
    if args.table:  # the page again from kept rows (an interrupted run's, runs merged, or its wording changed)
        kept = json.loads((args.keep / "rows.json").read_text())
        if "run" in kept:  # an ncnn columns run's
            write_ncnn_docs(kept["rows"], args.quick, kept["seconds"], kept["run"], kept.get("note"))
        else:
            write_docs(kept["rows"], args.quick, kept["seconds"], kept.get("note"))
        return
    columns = args.columns.split(",") if args.columns else list(TARGETS)
    if set(columns) - set(NCNN) and set(columns) != set(TARGETS):
        sys.exit(f"zoo.py: --columns takes ncnn's ({', '.join(NCNN)}), or all: the page's table needs every column")
    ncnn = not set(columns) - set(NCNN)
    run = run_info() if ncnn else None
    scratch = None if args.keep else tempfile.TemporaryDirectory(prefix="zoo-")
    root = args.keep.resolve() if args.keep else Path(scratch.name)
    env = {**bytecode_env(root), "MOBILEBUILD_CACHE": "off"}
    print(f"zoo: {len(names)} models x {len(columns)} targets in {root}", flush=True)
    rows, started = [], time.perf_counter()
    for name in names:
        seconds, lines, cells = build(root, name, args.quick, env, recipes(name, args.quick, columns))
        cells = {column: cells[column] for column in columns}
        rows.append((name, ZOO[name][0], cells, seconds, noise(lines), training_seconds(lines, name)))
        print(f"  {name}: {seconds:.0f} s{training(rows[-1][-1])} ({noise(lines)}): "
              + ", ".join(f"{column} {kind}" for column, (kind, _) in cells.items()), flush=True)
        # after each model: an interrupted run leaves the rows it has, for --table
        kept = {"rows": rows, "seconds": time.perf_counter() - started}
        if ncnn:
            run.update(ended=utc_now(), loads=[*run["loads"], os.getloadavg()[0]])
            kept["run"] = run
            if not args.no_docs:  # the section after each model, as the hub zoo's
                write_ncnn_docs(rows, args.quick, kept["seconds"], run)
        (root / "rows.json").write_text(json.dumps(kept))
    total = time.perf_counter() - started

    for name, about, cells, seconds, log, trained in rows:
        print(f"\n{name} ({about}): {seconds:.0f} s{training(trained)}, build output {log}")
        for column, (_, text) in cells.items():
            print(f"  {column:10} {text}")
    print(f"\ntotal {total / 60:.1f} min")
    if not args.no_docs and not ncnn:
        write_docs(rows, args.quick, total)
    if not args.no_docs:
        print(f"wrote {DOCS.relative_to(REPO)}")
    if scratch:
        scratch.cleanup()

if __name__ == "__main__":
    main()
