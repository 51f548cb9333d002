"""ONNX, run by ONNX Runtime: the fused model exported by torch.onnx (.onnx), int8 through onnxruntime's quantize_static
(QDQ, calibrated) or quantize_dynamic, as the deployment talk quantizes on the ONNX side; and language models as
onnxruntime-genai runs them (its model builder's folder, zipped). Its worker half (stages, runtimes, per-layer
method, emulated-ARM runner) is worker/, beside this module."""

from dataclasses import dataclass

from mobilebuild.plan import generation, stages
from mobilebuild.plan.routes import Arm64, Checks, Generation, Int8, Route, Runtime, Section, register, text
from mobilebuild.plan.settings import Fusion, ModelSource
from mobilebuild.plan.stages import when_set

PACKAGES = ("onnx", "onnxscript", "onnxruntime")
# onnxruntime's CalibrationMethod MinMax (moving_average: with CalibMovingAverage) and Percentile. Not its Entropy:
# quantize_static gives it 128 histogram bins for 128 quantized bins, which leaves one candidate range, MinMax's
# (identical scales, measured); nor Distribution, which it computes for float8 types (0.6 dB where MinMax gave 4.7
# on an int8 model)
ORT_OBSERVERS = ("minmax", "moving_average", "percentile")
MODES = ("static", "dynamic")  # quantize_static, quantize_dynamic
EXPORTER = (
    "Which torch.onnx exporter makes the model; absent means dynamo. dynamo: torch.export-based (torch's default), "
    "refuses forward code with control flow on tensor values, and unrolls nn.LSTM over its steps, so a dynamic dim "
    "through an LSTM is refused. torchscript: the deprecated TorchScript-based exporter (torch.onnx.export("
    "dynamo=False)) with the recipe's dims as dynamic_axes; it keeps nn.LSTM/GRU whole (one ONNX LSTM of any length) "
    "but it traces: control flow on tensor values is recorded for the example input only, without an error (the "
    "build names such lines), and verify's checks at each dim's smallest, example and largest size are what catch a "
    "wrong trace.")
SCHEMA = {
    "description": "ONNX export options.",
    "type": "object", "additionalProperties": False, "default": {},
    "properties": {
        "opset": {"description": "The ai.onnx opset to write; default: the exporter's own (20). dynamo writes 18 and "
                                 "up, torchscript 20 and below.", "type": "integer", "minimum": 13, "maximum": 23},
        "exporter": {"description": EXPORTER, "enum": ["dynamo", "torchscript"]},
    },
}


@dataclass(frozen=True)
class ExportConfig:
    precision: str
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    options: dict  # targets.onnx: opset, exporter (each only where set: other recipes keep their keys)
    model: ModelSource  # the model source and fusion the fused model is rebuilt from: it is stored as weights only
    fuse: Fusion
    calibration: dict | None = None  # int8, static
    weights: str | None = None
    outputs: list | None = None  # the ONNX output names
    exclude: list | None = when_set()  # int8: quantize.exclude
    observer: str | None = when_set()  # int8: quantize.observer (onnxruntime's calibration method)
    mode: str = when_set("static")  # int8: quantize.mode, static (quantize_static) or dynamic (quantize_dynamic)


def export(chain):
    quantization, files = chain.final_quantization()
    options = chain.settings
    if options.get("exporter") == "dynamo":  # the default, written out: the same node as a recipe without it
        del options["exporter"]
    config = ExportConfig(precision=chain.precision, inputs=chain.recipe.inputs, options=options, model=chain.source,
                          fuse=chain.recipe.fuse, outputs=chain.recipe.outputs, **quantization)
    return chain.shipped("onnx", config, {"model": chain.nodes["fuse"]}, files=files)


def node_layers(chain, common, files):
    """Each quantized node of the shipped QDQ model against the float model's, node by node in ONNX Runtime."""
    final = chain.nodes[chain.route.final_stage]
    settings = stages.LayersConfig(method="mobilebuild.routes.onnx.worker.layers", options=final.settings.options,
                                   outputs=chain.recipe.outputs, **common)
    return chain.layers_node(settings, {}, files)


def structure(facts):
    if facts.get("quantized_nodes") is None:
        return ""
    return f"{text(facts.get('quantized_nodes'))} of {text(facts.get('nodes'))} nodes quantized"


def preflight(check):
    """Loading the exported model in ONNX Runtime, the host run every check makes, is all there is to check."""


def outputs(found):
    """ONNX has flat, named outputs (preflight.interface.Outputs)."""
    if not found.flat:
        return found.say(f"ONNX has {len(found.names)} flat outputs, named {', '.join(found.names)} (the recipe's "
                         "`outputs` renames them)")
    return []


stages.register(stages.Stage(
    "onnx", ExportConfig, {"model": ("fuse",)},
    "ONNX models (.onnx), int8 through onnxruntime's static or dynamic quantization.", "#a2c4c9", plan=export,
    module="mobilebuild.routes.onnx.worker.export",
    recipe_fields={"options": "targets.onnx", "mode": "quantize.mode"}))

def lm_export(chain):
    return chain.shipped("lm_onnx", generation.export_config(chain), {"checkpoint": chain.nodes["checkpoint"]},
                         files=chain.source_files)


# A language model (generate:): one step of the model with its static KV cache as inputs and outputs (worker side:
# mobilebuild.routes.onnx.worker.lm_onnx); int8: onnxruntime's dynamic quantization of its weights; int4: its
# MatMulNBits
stages.register(stages.Stage(
    "lm_onnx", generation.LMExportConfig, {"checkpoint": ("checkpoint",)},
    "Language models as ONNX (.onnx) with past key/values as inputs and outputs.", "#a2c4c9", plan=lm_export,
    module="mobilebuild.routes.onnx.worker.lm_onnx",
    recipe_fields=generation.recipe_fields(generation.LMExportConfig)))

register(Route("onnx", "onnxruntime", ("fp32", "int8"), ("onnx",), ".onnx",
               "ONNX, run by ONNX Runtime (int8: static QDQ or dynamic quantization with onnxruntime's tools)",
               Runtime("onnxruntime", "ONNX Runtime", module="mobilebuild.routes.onnx.worker.runtime",
                       packages=PACKAGES, package="onnxruntime", structure=structure, extra="onnx",
                       arm64=Arm64("mobilebuild.routes.onnx.worker.guest", ("onnxruntime",))),
               int8=Int8("final", observers=ORT_OBSERVERS, modes=MODES), section=Section("onnx", SCHEMA),
               default=True,
               generation=Generation("lm_onnx", ("fp32", "int8", "int4"),
                                     layers="mobilebuild.routes.onnx.worker.lm_layers"),
               checks=Checks(preflight=preflight, outputs=outputs, layers=node_layers, layer_methods={
                   "onnx": "ONNX Runtime, node by node",
                   "lm_onnx": "each layer's nodes alone quantized by onnxruntime, logits at the prefill"})))


def lm_genai(chain):
    """onnxruntime-genai's model folder of the target's language model, the recipe's tokenizer.json inside."""
    if chain.excluded:
        raise chain.error("onnxruntime-genai's model builder quantizes every MatMul it makes: leave quantize.exclude "
                          "out, or build with runtime onnxruntime", "quantize.exclude")
    tokenizer = chain.nodes.get(generation.TOKENIZER)
    if tokenizer is None or not tokenizer.output.endswith(".json"):
        raise chain.error("onnxruntime-genai's model folder carries the model's tokenizer.json (its builder fails "
                          "without one): name it in generate.tokenizer", "generate.tokenizer")
    return chain.shipped("lm_genai", generation.export_config(chain),
                         {"checkpoint": chain.nodes["checkpoint"], "tokenizer": tokenizer}, files=chain.source_files)


# A language model as onnxruntime-genai's model builder makes it for the CPU (worker side:
# mobilebuild.routes.onnx.worker.lm_genai): model.onnx with its weights, genai_config.json, the tokenizer, zipped
stages.register(stages.Stage(
    "lm_genai", generation.LMExportConfig, {"checkpoint": ("checkpoint",), "tokenizer": (generation.TOKENIZER,)},
    "Language models as onnxruntime-genai model folders (model builder; zipped).", "#a2c4c9", plan=lm_genai,
    module="mobilebuild.routes.onnx.worker.lm_genai",
    recipe_fields=generation.recipe_fields(generation.LMExportConfig)))

register(Route("onnx", "onnxruntime-genai", (), (), ".zip",
               "Language models as onnxruntime-genai runs them: its model builder's folder for the CPU, zipped",
               Runtime("onnxruntime-genai", "onnxruntime-genai", module="mobilebuild.routes.onnx.worker.genai_runtime",
                       packages=(*PACKAGES, "onnxruntime-genai"), package="onnxruntime-genai", extra="onnx"),
               generation=Generation("lm_genai", ("fp32", "int8", "int4"))))
