"""The hub zoo: timm and transformers models (random weights from their configurations, trained briefly), each
built for the zoo's host targets (zoo.TARGETS), verified at the default thresholds and benchmarked, in one table
(docs/zoo.md, its "Hub zoo" section). The models are ones nobody on the project wrote; the recipes use only the
README's grammar.

As benchmarks/zoo.py (whose build, results and refusal meanings it shares), one model at a time, cold (shared
artifact cache off), `mobilebuild build -n 1`. Image models train on scikit-learn's digits, text models on a
synthetic task (benchmarks/zoo/hub_models.py), the speech encoder on tones, so that an int8 verdict measures the
artifact. CPU-heavy: run it niced.

    nice -n 15 .venv/bin/python benchmarks/hub_zoo.py [--only NAME[,NAME]] [--columns COLUMN[,COLUMN]] [--quick]
        [--keep DIR] [--no-docs] [--minutes M] [--table [--merge ROWS_JSON[,ROWS_JSON]]]

--columns builds some of the targets only (e.g. columns added to zoo.TARGETS after a kept run); a model's rows from
several runs are shown as one row, with each build's time. --table --merge writes the page from the kept folder's
rows.json (its "note" says how the rows were gathered) and other runs' rows.json files after it. A run of ncnn's
columns only (zoo.NCNN) writes a table of its own instead, the section's "ncnn columns" subsection, and leaves the rest
of the page as it is.
"""

import datetime
import json
import os
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import zoo
from _bench import REPO, bytecode_env

HUB_MODELS = Path(__file__).with_name("zoo") / "hub_models.py"
SECTION = zoo.HUB_SECTION
NCNN_HEADING = "### Hub zoo: ncnn columns"  # the ncnn columns' own table, at the end of the hub zoo's section
IMAGE_SIZE = 64
TEXT = {"length": 16, "vocabulary": 100}
TEXT_INPUTS = [{"name": "input_ids", "shape": [1, TEXT["length"]], "dtype": "int64"}]
SMALL_TEXT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
              "vocab_size": TEXT["vocabulary"], "max_position_embeddings": 64}


def timm_image(name, optimizer="sgd", batchnorm_stats=0, **kwargs):
    """A timm classifier of 10 classes on one 1x3x64x64 image, trained on digits; `batchnorm_stats`: the recipe's
    model.batchnorm_stats (after training)."""
    train = {"function": "hub_models:train_image", "kwargs": {"size": IMAGE_SIZE, "optimizer": optimizer}}
    return {"model": {"timm": name, "kwargs": {"num_classes": 10, **kwargs}, "train": train,
                      **({"batchnorm_stats": batchnorm_stats} if batchnorm_stats else {})},
            "input": {"shape": [1, 3, IMAGE_SIZE, IMAGE_SIZE], "distribution": {"uniform": {"low": 0, "high": 1}}},
            "calibration": {"source": "function", "function": "zoo_models:digits_batches",
                            "kwargs": {"size": IMAGE_SIZE}}}


def text(model_class, config, task="majority"):
    """A transformers text model on input_ids (16 tokens of 100), trained on the synthetic `task`; int8 dynamic on
    the routes that quantize Transformers so (qnnpack, onnx-int8, litert-int8: as the zoo's text Transformer), as
    ONNX Runtime advises."""
    train = {"function": "hub_models:train_tokens", "kwargs": {"task": task, **TEXT}}
    return {"model": {"transformers": model_class, "config": config, "train": train}, "inputs": TEXT_INPUTS,
            "calibration": {"source": "function", "function": "hub_models:token_batches",
                            "kwargs": {"task": task, **TEXT}},
            "own": {"qnnpack": zoo.DYNAMIC, "onnx-int8": zoo.DYNAMIC, "litert-int8": zoo.DYNAMIC}}


HUB = {
    "lcnet_050": ("timm LCNet-0.5 (hard-swish, SE)", timm_image("lcnet_050")),
    "mobilenetv3_small_050": ("timm MobileNetV3-Small 0.5", timm_image("mobilenetv3_small_050")),
    "mobilenetv4_conv_small": ("timm MobileNetV4-Conv-Small", timm_image("mobilenetv4_conv_small")),
    "tinynet_e": ("timm TinyNet-E (EfficientNet family)", {
        **timm_image("tinynet_e"), "quantize": {"exclude": ["SqueezeExcite"]},
        "why": "int8 missed top-1 agreement only (6 of 8 held-out images, at 18-20 dB: two of them with the top two "
               "scores 0.08 and 0.17 apart); the per-layer diagnoses of onnx-int8 and litert-int8 ranked "
               "squeeze-excite layers worst (15.1-16.2 dB); torch's numeric suite on qnnpack puts the activations "
               "inside the squeeze-excite of blocks.3.0 and 4.0 at 12.4 and 14.6 dB, the layers around them at "
               "18-20 dB. On qnnpack, trained weights: 20.1 dB and 6 of 8 as is, 20.8 dB and 7 of 8 with every "
               "squeeze-excite float"}),
    "mnasnet_small": ("timm MnasNet-Small", {
        **timm_image("mnasnet_small"), "quantize": {"exclude": ["conv_stem", "blocks.0.0"]},
        "why": "its first depthwise convolution folds a batch norm of running variance 0 (a channel the stem's ReLU "
               "leaves dead on digits: gain 1623), named by the failed verification's note; ONNX's per-layer "
               "diagnosis ranked the convolution first (14.9 dB). On qnnpack, trained weights: 12.4 dB int8, 27.0 dB "
               "with that convolution float, 27.8 dB with the stem and the first block float. That convolution alone "
               "float gave et-int8 25.9 dB, onnx-int8 15.2 dB, but LiteRT's converter quantized it again (an op "
               "left float between quantized neighbours: litert-int8 13.9 dB either way); from the input on, "
               "nothing quantized comes before it"}),
    "ghostnet_050": ("timm GhostNet-0.5", timm_image("ghostnet_050")),
    "mobileone_s0": ("timm MobileOne-S0 (reparameterisable branches)", {
        **timm_image("mobileone_s0", batchnorm_stats=8), "quantize": {"exclude": ["stem", "stages.0"]},
        "why": "batch norm of channels that hardly varied on digits multiplies int8 rounding: in stage 0 (gains up "
               "to 973), which the failed verification's note named, and in the stem (gain 207, running variance "
               "3e-4: above the note's eps). On qnnpack, trained weights: "
               "2.9 dB as is, 1.9 dB with stages.0 float, 8.5 dB with the stem float too, 14.2 dB with the "
               "statistics re-estimated on the recipe's random inputs (8 batches), 20.6 dB with both"}),
    "regnetx_002": ("timm RegNetX-200MF", timm_image("regnetx_002")),
    "resnet10t": ("timm ResNet-10-T", timm_image("resnet10t")),
    "mobilevitv2_050": ("timm MobileViTv2-0.5 (separable attention)", timm_image("mobilevitv2_050", "adamw")),
    "edgenext_xx_small": ("timm EdgeNeXt-XXS (layer scale)", timm_image("edgenext_xx_small", "adamw")),
    "efficientformerv2_s0": ("timm EfficientFormerV2-S0", {
        **timm_image("efficientformerv2_s0", "adamw", img_size=IMAGE_SIZE),
        "own": {"qnnpack": {"quantize": {"exclude": ["stages.3.downsample.attn.q"]}}},
        "why": "QNNPACK's quantized average pooling refuses a 1x1 window, which the last downsampling's query "
               "(stages.3.downsample.attn.q.pool: AvgPool2d(1, 2)) has: the build was refused with QNNPACK's own "
               "'1x1 pooling is meaningless'. Excluding the pooling alone does not help (FX runs it on its quantized "
               "input still); the whole query float runs: 18.7 dB with torch.ao's FX alone on a random image, the "
               "build's trained weights; the build then verified at 28.9 dB"}),
    "convnextv2_atto": ("timm ConvNeXt-V2-Atto (GRN, layer scale)", timm_image("convnextv2_atto", "adamw")),
    "bert": ("transformers BERT encoder, sequence classifier, 2 layers x 64",
             text("AutoModelForSequenceClassification", {"model_type": "bert", **SMALL_TEXT})),
    "distilbert": ("transformers DistilBERT, sequence classifier, 2 layers x 64",
                   text("AutoModelForSequenceClassification",
                        {"model_type": "distilbert", "dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128,
                         "vocab_size": TEXT["vocabulary"], "max_position_embeddings": 64})),
    "mobilebert": ("transformers MobileBERT, sequence classifier, 2 layers",
                   text("AutoModelForSequenceClassification",
                        {"model_type": "mobilebert", **SMALL_TEXT, "embedding_size": 32, "intra_bottleneck_size": 32,
                         "true_hidden_size": 32, "num_feedforward_networks": 1})),
    "gpt2": ("transformers GPT-2 decoder, single pass (no cache), 2 layers x 64, trained to count on",
             text("AutoModelForCausalLM", {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2,
                                           "n_positions": 64, "vocab_size": TEXT["vocabulary"]}, task="count")),
    "vit": ("transformers ViT, 2 layers x 64, patch 8, 1x3x64x64, trained on digits",
            {"model": {"transformers": "AutoModelForImageClassification",
                       "config": {"model_type": "vit", **{k: v for k, v in SMALL_TEXT.items()
                                                          if k not in ("vocab_size", "max_position_embeddings")},
                                  "image_size": IMAGE_SIZE, "patch_size": 8, "num_labels": 10},
                       "train": {"function": "hub_models:train_image",
                                 "kwargs": {"size": IMAGE_SIZE, "optimizer": "adamw"}}},
             "input": {"shape": [1, 3, IMAGE_SIZE, IMAGE_SIZE], "distribution": {"uniform": {"low": 0, "high": 1}}},
             "calibration": {"source": "function", "function": "zoo_models:digits_batches",
                             "kwargs": {"size": IMAGE_SIZE}},
             # static ONNX int8 quantizes its layer norms and attention: 14.6 dB; dynamic 40.5 dB
             "own": {"qnnpack": zoo.DYNAMIC, "onnx-int8": zoo.DYNAMIC}}),
    "wav2vec2": ("transformers Wav2Vec2 speech encoder, audio classifier, 2 layers x 64, 1x4000 samples, trained "
                 "on four noisy tones",
                 {"model": {"transformers": "AutoModelForAudioClassification",
                            "config": {"model_type": "wav2vec2", **{k: v for k, v in SMALL_TEXT.items()
                                                                   if k != "max_position_embeddings"},
                                       "num_labels": 4, "conv_dim": [32, 32, 32], "conv_kernel": [10, 3, 3],
                                       "conv_stride": [5, 2, 2], "num_conv_pos_embeddings": 16,
                                       "num_conv_pos_embedding_groups": 4, "classifier_proj_size": 32},
                            "train": {"function": "hub_models:train_tones"}},
                  "inputs": [{"name": "input_values", "shape": [1, 4000]}],
                  "calibration": {"source": "function", "function": "hub_models:tone_batches"}}),
}


# What a refusal here means, each reproduced with the library alone (how: in brackets); zoo.MEANINGS after these.
MEANINGS = [
    ("FX graph mode cannot trace", "PyTorch's FX graph-mode quantization cannot trace the model, which has no "
                                   "QuantStubs for eager mode [torch.fx.symbolic_trace(model) raises TraceError: "
                                   "transformers' ViT 'Proxy object cannot be iterated', timm's MobileViTv2 "
                                   "'symbolically traced variables cannot be used as inputs to control flow']"),
    ("only works for Conv1d but got: ParametrizedConv1d",
     "torch.ao's eager quantization has no quantized form of a weight-normed Conv1d (Wav2Vec2's positional "
     "convolution) [prepare and convert of QuantStub, weight_norm(Conv1d), DeQuantStub raise the same "
     "AssertionError]"),
    ("has no attribute 'device'",
     "torch.ao's FX graph-mode quantization: EdgeNeXt's positional encoding reads token_projection.weight.device, "
     "which FX records as an attribute read; convert_fx swaps that convolution for a quantized one whose weight is a "
     "method, so the converted model fails on its first run [timm's edgenext_xx_small with the weights this build "
     "trained, prepare_fx with torch.ao's qnnpack default qconfig mapping, one calibration call, convert_fx and one "
     "run raise the same AttributeError; with untrained weights that run fails earlier, in QNNPACK's add: a layer "
     "scale of 1e-6 gives a scale ratio below 2^-14]"),
    ("not implemented for 'Long'",
     "litert-torch's PT2E quantizer annotates both operands of a float mul, one an int64 tensor constant (EdgeNeXt "
     "makes int64 tensors only in its Fourier positional encoding), and torchao's HistogramObserver cannot calibrate "
     "it (torch.histc has no int64 kernel) [torch.export of timm's edgenext_xx_small, prepare_pt2e with litert-torch's "
     "PT2EQuantizer (symmetric, per channel) and one calibration call raise the same NotImplementedError at the same "
     "observer, activation_post_process_58, on an int64 _tensor_constant feeding aten.mul]"),
    ("op operands don't have broadcast-compatible shapes",
     "litert-torch: its MLIR converter makes a tfl.mul of incompatible shapes from timm's MobileViTv2 linear attention "
     "(LinearSelfAttention: relu(value) * context_vector.expand_as(value), between 1x1 convolutions) [litert_torch."
     "convert of timm's LinearSelfAttention(embed_dim=64) alone raises the same ValueError on 1x64x4x16 and 1x64x4x4 "
     "inputs (1x64x4x1 converts), and of the whole mobilevitv2_050, random weights, at 64x64 and 128x128]"),
    ("Output shape must be broadcastable from input shape",
     "litert-torch: its int8 conversion of timm's MobileViTv2 linear attention goes through, but makes a BROADCAST_TO "
     "that LiteRT's interpreter refuses to prepare [timm's LinearSelfAttention(embed_dim=64) alone on 1x64x4x16, and "
     "the whole mobilevitv2_050 (random weights, 64x64 and 128x128): torch.export, prepare_pt2e with litert-torch's "
     "PT2EQuantizer (symmetric, per channel), one calibration call, convert_pt2e, litert_torch.convert with that "
     "quantizer and Interpreter.allocate_tensors raise the same RuntimeError]"),
    ("Tensor.reshape (3) left as layers",
     "ncnn's runtime, whose blobs have at most 4 dims (w, h, d, c) beside the batch, which pnnx's converter then "
     "leaves as is: MobileViTv2 unfolds its feature maps into 2x2 patches through 6-D views (1x64x8x8 to "
     "1x64x4x2x4x2, permuted, to 1x64x4x16) [`x.reshape(1, 64, 4, 2, 4, 2).permute(0, 1, 3, 5, 2, 4).reshape(1, 64, 4, "
     "16) * 2` alone on 1x64x8x8 leaves the same Tensor.reshape]"),
    ("torch.unbind (3) left as layers",
     "pnnx's converter: EdgeNeXt's cross-covariance attention unbinds q, k and v from axis 0 of a 5-D tensor whose "
     "batch axis it moved to axis 1 (`reshape(B, N, 3, heads, -1).permute(2, 0, 3, 4, 1).unbind(0)`), which pnnx "
     "leaves as is [timm's CrossCovarianceAttn(dim=32, num_heads=4) alone on 1x16x32 leaves torch.unbind, and the "
     "reshape before it; the same without the heads axis, 4-D, converts]"),
    ("aten::addcmul",
     "pnnx's converter, which has no conversion for torch.addcmul (ConvNeXt-V2's global response norm: "
     "`x + torch.addcmul(bias, weight, x * nx)`), though ncnn's BinaryOp layers could compute it [`torch.addcmul(bias, "
     "weight, x)` alone, and timm's GlobalResponseNorm(8, channels_last=True) alone, leave pnnx.Expression and "
     "aten::addcmul]"),
    ("gpt2.yaml: ncnn:gpt2-",  # the ncnn stage's process ended (a signal)
     "pnnx's converter and ncnn's runtime: the stage's run of the converted model on ncnn corrupts the heap "
     "('malloc_consolidate(): invalid chunk size', 'pool allocator destroyed too early'), in the SDPA layer pnnx "
     "writes for GPT-2's attention with its constant boolean causal mask, a MemoryData of one byte an element "
     "(`21=3`); pnnx also writes GPT-2's tied head as an InnerProduct over the embedding table with the final layer "
     "norm's output added as its bias [`F.scaled_dot_product_attention(x, x * 0.5, x * 2, attn_mask=torch.ones(16, 16, "
     "dtype=torch.bool).tril())` alone on 1x2x16x32, converted and run once on ncnn's CPU path in a child process: it "
     "ends with SIGSEGV after 'FATAL ERROR! pool allocator destroyed too early', its output 1.2 off torch's; without "
     "the mask it matches torch to 4e-7]"),
]


def meaning(line):
    return next((text for piece, text in MEANINGS if piece in line), None) or zoo.meaning(line)


def recipes(name, quick, columns=tuple(zoo.TARGETS)):
    """{name: recipe} as zoo.recipes makes them (calibration, verification on held-out data, benchmark), with the
    targets of `columns`."""
    fields = dict(HUB[name][1])
    own = fields.pop("own", {})
    fields.pop("why", None)
    data = {"name": name, **fields}
    data["model"] = {"seed": 0, **data["model"]}
    data["quantize"] = {"calibration": {**data.pop("calibration"), "batches": 2 if quick else 8},
                        **data.get("quantize", {})}
    data["verify"] = {"samples": 2 if quick else 8, "evaluation": "calibration-holdout"}
    data["benchmark"] = {"warmup": 1 if quick else 2, "iters": 3 if quick else 10}
    data["targets"] = [{**target, **own.get(column, {})} for column, target in zoo.TARGETS.items()
                       if column in columns]
    return {name: data}


def build(root, name, quick, env, columns=tuple(zoo.TARGETS)):
    """zoo.build with the hub zoo's recipes and training functions, by this checkout's mobilebuild (PYTHONPATH in
    main's environment), whichever checkout the console script was installed from; the cells of `columns`."""
    seconds, lines, cells = zoo.build(root, name, quick, env, recipes(name, quick, columns),
                                      (zoo.FACTORIES, HUB_MODELS), (sys.executable, "-m", "mobilebuild.cli"))
    return seconds, lines, {column: cells[column] for column in columns}


def merged(rows):
    """[(name, about, {column: cell}, [(columns, seconds, log, trained) per build])] in HUB's order: a model's rows
    from several runs (--columns) as one; a later build of all an earlier build's columns replaces it (a rebuilt
    row)."""
    found = {}
    for name, about, cells, seconds, log, trained in rows:
        row = found.setdefault(name, (name, about, {}, []))
        row[2].update(cells)
        row[3][:] = [build for build in row[3] if not set(build[0]) <= set(cells)]
        row[3].append((list(cells), seconds, log, trained))
    return [found[name] for name in HUB if name in found]


def beyond_defaults(entry):
    """What a HUB entry's recipe sets beyond timm_image's (model.batchnorm_stats, quantize's own settings, and where
    it says why, its targets' own), and its `why`; None for an entry that sets nothing more. (The text models' own
    dynamic int8 is the section's paragraph.)"""
    model = entry["model"]
    said = [f"`model.batchnorm_stats: {model['batchnorm_stats']}`"] if "batchnorm_stats" in model else []
    said += [f"`quantize.{key}: {json.dumps(value)}`" for key, value in entry.get("quantize", {}).items()]
    own = entry.get("own", {}) if "why" in entry else {}
    said += [f"`{column}` target's `quantize.{key}: {json.dumps(value)}`" for column, fields in own.items()
             for key, value in fields.get("quantize", {}).items()]
    return f"{', '.join(said)}: {entry['why']}" if said else None


def build_times(builds):
    """The time column: each build's wall time, training and output; which columns, where several builds."""
    return " + ".join((f"{', '.join(columns)}: " if len(builds) > 1 else "")
                      + f"{seconds:.0f} s{zoo.training(trained)}; {log}" for columns, seconds, log, trained in builds)


def markdown(rows, quick, total, note=None):
    """The hub zoo's section of docs/zoo.md. `note`: how the rows were gathered, where not by one run (a kept
    rows.json's "note")."""
    versions = {package: version(package) for package in ("torch", "timm", "transformers", "executorch",
                                                          "onnxruntime", "litert-torch", "ai-edge-litert")}
    rows = merged(rows)
    # the columns any build had, in zoo.TARGETS' order; a cell no build made is "not run"
    columns = [column for column in zoo.TARGETS if any(column in cells for _, _, cells, _ in rows)]
    kinds = [cells[column][0] if column in cells else "not run" for _, _, cells, _ in rows for column in columns]
    counts = ", ".join(f"{kinds.count(kind)} {kind}" for kind in sorted(set(kinds)))
    missing = [name for name in HUB if name not in {row[0] for row in rows}]
    out = [f"""{SECTION}

Models from timm and transformers, random weights from their configurations (nothing downloaded), trained briefly
by the build's own `model.train` (`benchmarks/zoo/hub_models.py`: image models 100 steps on digits at 64x64,
text models 150 steps of a synthetic task on 16 tokens of 100, the speech encoder 100 steps on four noisy tones),
calibrated on the first {2 if quick else 8} samples of that data and verified on the ones after them at the default
thresholds. Generated by `nice -n 15 .venv/bin/python benchmarks/hub_zoo.py{' --quick' if quick else ''}` on
{datetime.date.today().isoformat()} with {', '.join(f'{k} {v}' for k, v in versions.items())}, on a {zoo.machine()}
shared with other work: {total / 60:.0f} minutes for the rows below (times are wall times under that load). Text
models' int8 is dynamic on qnnpack, onnx-int8 and litert-int8, ViT's on qnnpack and onnx-int8; on et-int8 it is what
the build records (torchao's dynamic int8 where PT2E fails on transformers' mask code). {counts}.
"""]
    if missing:
        out.append(f"**Partial:** no build of {', '.join(missing)} finished; their rows are missing.\n")
    if note:
        out.append(f"{note}\n")
    return "\n".join(out + table(rows, columns)) + "\n"


def table(rows, columns, settings=True):
    """The table of merged `rows` (short cells), the settings of their recipes beyond the defaults (unless said
    above), and every refusal and failure in full: the section's lines after its paragraphs."""
    out = [f"| model | {' | '.join(columns)} | time |", f"|---|{'---|' * len(columns)}---|"]
    notes = []
    for name, about, cells, builds in rows:
        shown = []
        for column in columns:
            kind, line = cells.get(column, ("not run", ""))
            if kind == "not run":
                shown.append(kind)
            elif kind == "verified":
                shown.append(line.replace("verified (SQNR ", "verified ").split(",")[0].split(";")[0].rstrip(")"))
            else:
                notes.append((name, column, kind, line))
                shown.append(f"{'FAILED' if kind == 'failed' else kind} [{len(notes)}]")
        out.append(f"| **{name}**: {about} | {' | '.join(shown)} | {build_times(builds)} |")
    settings = [(name, beyond_defaults(HUB[name][1])) for name, *_ in rows] if settings else []
    if any(said for _, said in settings):
        out += ["", "Settings beyond the image models' defaults (the recipe's model and quantize sections), and why:",
                ""]
        out += [f"- {name}: {said}." for name, said in settings if said]
    if notes:
        out += ["", "Refusals and failures:", "", *zoo.listed(notes, meaning)]
    return out


def ncnn_markdown(rows, quick, total, run, note=None):
    """The hub zoo's ncnn subsection: how its rows were built, and table() of ncnn's columns."""
    rows = merged(rows)
    missing = [name for name in HUB if name not in {row[0] for row in rows}]
    text = f"""{NCNN_HEADING}

The hub zoo's models, by the recipes above (the same training, calibration data and held-out inputs, {2 if quick else 8}
of each, the same thresholds, the settings listed above: tinynet_e's, mnasnet_small's and mobileone_s0's
`quantize.exclude` keep those layers float on ncnn-int8 too) with ncnn's four targets instead ([ncnn.md](ncnn.md)).
{zoo.NCNN_COLUMNS}
The text models' int8 is static here, calibrated on their synthetic task's token ids.

A table of its own because the rows above were built before these targets existed, and their builds were not kept.
{zoo.how_built(run, total)} Times are each model's build (training in brackets, four targets, verification and
benchmarks) and its output. {zoo.counted(rows, zoo.NCNN)}.
"""
    skipped = [f"**Not built:** {', '.join(missing)}.", ""] if missing else []
    return "\n".join([text, *skipped, *table(rows, zoo.NCNN, settings=False), *(["", note] if note else [])]) + "\n"


def write_docs(section):
    """docs/zoo.md with its hub zoo section replaced (or added at the end)."""
    text = zoo.DOCS.read_text() if zoo.DOCS.exists() else ""
    before, _, after = text.partition(SECTION)
    rest = after[after.find("\n## "):] if "\n## " in after else ""
    zoo.DOCS.write_text(before.rstrip("\n") + "\n\n" + section + rest)


def main():
    args, names = zoo.arguments(__doc__, HUB, columns={
        "help": "comma-separated columns to build: " + ", ".join(zoo.TARGETS)}, minutes={
        "type": float, "help": "start no model after this many minutes (the page says it is partial)"}, table={
        "action": "store_true", "help": "write the page from the rows a --keep folder holds, building nothing"}, merge={
        "help": "with --table: comma-separated rows.json files of other runs whose rows are added after the kept "
                "ones (a model's rebuilt columns replace its earlier build's)"})
    if args.table:  # the page again from kept runs' rows (its wording changed, not its numbers)
        kept = json.loads((args.keep / "rows.json").read_text())
        if "run" in kept:  # an ncnn columns run's
            zoo.write_section(ncnn_markdown(kept["rows"], args.quick, kept["seconds"], kept["run"], kept.get("note")),
                              SECTION)
            return
        rows = kept["rows"] + [row for path in (args.merge.split(",") if args.merge else [])
                               for row in json.loads(Path(path).read_text())["rows"]]
        # the rows' own builds' wall times: runs that were stopped, or builds a rebuild replaced, do not count
        total = sum(build[1] for row in merged(rows) for build in row[3]) if args.merge else kept["seconds"]
        write_docs(markdown(rows, args.quick, total, kept.get("note")))
        return
    columns = args.columns.split(",") if args.columns else list(zoo.TARGETS)
    unknown = [column for column in columns if column not in zoo.TARGETS]
    if unknown:
        sys.exit(f"hub_zoo.py: unknown column(s) {', '.join(unknown)}; known: {', '.join(zoo.TARGETS)}")
    run = None if set(columns) - set(zoo.NCNN) else zoo.run_info()  # an ncnn columns run: how_built's facts
    scratch = None if args.keep else tempfile.TemporaryDirectory(prefix="hub-zoo-")
    root = args.keep.resolve() if args.keep else Path(scratch.name)
    env = {**bytecode_env(root), "MOBILEBUILD_CACHE": "off", "PYTHONPATH": str(REPO)}
    print(f"hub zoo: {len(names)} models x {len(columns)} targets in {root}", flush=True)
    rows, started = [], time.perf_counter()
    for name in names:
        if args.minutes and time.perf_counter() - started > args.minutes * 60:
            break
        seconds, lines, cells = build(root, name, args.quick, env, columns)
        rows.append((name, HUB[name][0], cells, seconds, zoo.noise(lines), zoo.training_seconds(lines, name)))
        print(f"  {name}: {seconds:.0f} s{zoo.training(rows[-1][-1])} ({rows[-1][4]}): "
              + "; ".join(f"{column} {line}" for column, (_, line) in cells.items()), flush=True)
        kept = {"rows": rows, "seconds": time.perf_counter() - started}
        if run:
            run.update(ended=zoo.utc_now(), loads=[*run["loads"], os.getloadavg()[0]])
            kept["run"] = run
        (root / "rows.json").write_text(json.dumps(kept))
        if not args.no_docs and run:  # after each model: an interrupted run leaves the rows it has
            zoo.write_section(ncnn_markdown(rows, args.quick, kept["seconds"], run), SECTION)
        elif not args.no_docs:
            write_docs(markdown(rows, args.quick, kept["seconds"]))
    print(f"\ntotal {(time.perf_counter() - started) / 60:.1f} min")
    if scratch:
        scratch.cleanup()


if __name__ == "__main__":
    main()
