"""LiteRT (formerly TensorFlow Lite): the fused model converted by litert-torch to a .tflite, run by LiteRT's
interpreter. CPU through XNNPACK (fp32, fp16 weights, int8 static through PT2E or dynamic-range), and two device-only
routes: the GPU delegate (fp16 weights by default) and the NPU accelerators (a fully integer model). Its worker half
(stages, runtime, per-layer method, emulated-ARM runner) is worker/, beside this module."""

from dataclasses import dataclass

from mobilebuild.plan import generation, stages
from mobilebuild.plan.routes import Arm64, Checks, Generation, Int8, Route, Runtime, Section, mapping, register, text
from mobilebuild.plan.settings import Fusion, ModelSource
from mobilebuild.plan.stages import when_set
from mobilebuild.routes.torchscript.plan import TORCH_OBSERVERS

FAMILY = "LiteRT"
# what converts (litert-torch lowers through JAX to litert-converter), quantizes (torchao's PT2E, ai-edge-quantizer)
# and runs (ai-edge-litert): the versions that key this family's nodes
PACKAGES = ("litert-torch", "ai-edge-litert", "litert-converter", "ai-edge-quantizer", "torchao", "jax", "jaxlib")
# measured with litert-torch 0.10.0: a Linear on a 3-D input and an Embedding with a symbolic sequence length both
# fail in its JAX lowering ("reshape new_sizes must all be positive", "Shapes must be 1D sequences of concrete values")
FIXED = "litert-torch 0.10 converts at fixed sizes (its JAX lowering fails on a symbolic size)"
MODES = ("static", "dynamic")  # PT2E static (calibrated); dynamic-range (ai-edge-quantizer: weights int8)
IO = ("float", "int8")
WEIGHTS = ("fp32", "fp16")
SCHEMA = {
    "description": "LiteRT conversion options.",
    "type": "object", "additionalProperties": False, "default": {},
    "properties": {
        "io": {"description": "int8 static: the model's input and output tensors. float (default): the model "
                              "quantizes its inputs and dequantizes its outputs itself, so an app feeds and reads "
                              "floats; int8: the app quantizes with the tensors' scale and zero point.", "enum": IO},
        "weights": {"description": "float targets: fp16 stores the weights as float16 (half the size; what LiteRT's "
                                   "GPU delegate computes in; the CPU dequantizes them as the model loads). Default: "
                                   "fp32, and fp16 for the gpu-delegate backend.", "enum": WEIGHTS},
    },
}


@dataclass(frozen=True)
class ConvertConfig:
    precision: str
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    options: dict  # targets.litert: io, weights (each only where it is not the default)
    model: ModelSource  # the model source and fusion the fused model is rebuilt from: it is stored as weights only
    fuse: Fusion
    calibration: dict | None = None  # int8, static
    weights: str | None = None  # int8: quantize.weights
    exclude: list | None = when_set()  # int8: quantize.exclude
    observer: str | None = when_set()  # int8: quantize.observer
    mode: str = when_set("static")  # int8: quantize.mode, static (calibrated) or dynamic (dynamic-range kernels)


DEFAULT_WEIGHTS = {"gpu-delegate": "fp16"}  # by backend: the GPU delegate's usual input


def plan(chain):
    quantization, files = chain.final_quantization()
    options = chain.settings
    where = f"{chain.fields['targets']}.litert"
    weights = options.get("weights", DEFAULT_WEIGHTS.get(chain.route.backend, "fp32"))
    options.pop("weights", None)
    if weights != "fp32":
        if chain.precision == "int8":
            raise chain.error("weights: fp16 is for float targets; an int8 target's weights are int8: leave it out",
                              f"{where}.weights")
        options["weights"] = weights
    if quantization.get("mode") == "dynamic" and quantization.get("exclude"):
        raise chain.error("LiteRT's dynamic-range int8 (ai-edge-quantizer) picks operators by tensor-name patterns, "
                          "not modules: quantize.exclude works with mode 'static' only; leave it out",
                          "quantize.exclude")
    if options.get("io", "float") == "float":
        options.pop("io", None)
    elif chain.precision != "int8" or quantization.get("mode") == "dynamic":
        raise chain.error("io: int8 is for static int8 targets (a float or dynamic-range model takes and gives "
                          "floats): leave it out", f"{where}.io")
    config = ConvertConfig(precision=chain.precision, inputs=chain.recipe.inputs, options=options, model=chain.source,
                           fuse=chain.recipe.fuse, **quantization)
    return chain.shipped("litert", config, {"model": chain.nodes["fuse"]}, files=files)



def tensor_layers(chain, common, files):
    """Each int8 tensor of the shipped model, read back from LiteRT's interpreter, against the float model's output
    of the module the converter named it after."""
    final = chain.nodes[chain.route.final_stage]
    settings = stages.LayersConfig(method="mobilebuild.routes.litert.worker.layers", options=final.settings.options,
                                   **common)
    return chain.layers_node(settings, {}, files)


def structure(facts):
    if facts.get("operators") is None:
        return ""
    weights = ", ".join(f"{count} {dtype}" for dtype, count in mapping(facts.get("constant_dtypes")).items())
    # a quantized file's float weights: what quantize.exclude kept, or operators the converter left float (CONV_3D)
    share = facts.get("float_weight_share")
    kept = (f"; {100 * share:.0f}% of the weight bytes float"
            if mapping(facts.get("weight_bytes")).get("quantized") and isinstance(share, float) else "")
    return (f"{text(facts.get('int8_operators'))} of {text(facts.get('operators'))} operators on integers; "
            f"constants: {weights or 'none'}{kept}")


# --- mobilebuild check ------------------------------------------------------------------------------------------

# Operators XNNPACK, LiteRT's CPU path, leaves to LiteRT's reference kernels: the converter's StableHLO fallbacks and
# custom operators (measured: none in the examples; torchvision's MobileNetV2 converts to builtins only)
OUTSIDE_XNNPACK = ("STABLEHLO_", "CUSTOM")


def preflight(check):
    """What the .tflite holds (read by the build's verify where it read these bytes): operators outside LiteRT's
    builtin set, and for int8 how many operators compute on integers."""
    if not check.built:
        return
    facts = check.artifact_facts("op_types")
    check.facts["litert"] = {key: facts.get(key) for key in ("operators", "int8_operators", "op_types")}
    if check.route.precision(check.target) == "int8":
        check.notes.append(f"int8: {text(facts.get('int8_operators'))} of {text(facts.get('operators'))} operators "
                           "compute on integers (the rest, float: quantize and dequantize, moves, what stayed float)")
    for kind, count in mapping(facts.get("op_types")).items():
        if kind.startswith(OUTSIDE_XNNPACK):
            check.add("fallback", f"{count} {kind} operator(s): no XNNPACK or GPU delegate kernel; they run on "
                                  "LiteRT's reference CPU kernels", kind)


def outputs(found):
    """litert-torch flattens the returned structure into the signature's outputs (preflight.interface.Outputs)."""
    if not found.flat:
        return found.say(f"LiteRT returns {len(found.names)} flat outputs, in this order: {', '.join(found.names)} "
                         "(the signature names them after their path in the structure)")
    return []


stages.register(stages.Stage(
    "litert", ConvertConfig, {"model": ("fuse",)},
    "LiteRT models (.tflite) converted by litert-torch: fp32, fp16 weights, int8 (PT2E static or dynamic-range).",
    "#b6d7a8", plan=plan, module="mobilebuild.routes.litert.worker.litert",
    recipe_fields={"options": "targets.litert", "mode": "quantize.mode"}))


# --- language models (generate:): litert-torch's generative path --------------------------------------------------

# litert-torch's dynamic-range int4 recipes (generative.utilities.converter.QuantizationName): blocks of 32 or 128
INT4_BLOCKS = (32, 128)
LM_PRECISIONS = ("fp32", "int8", "int4")  # int8, int4: dynamic-range (weights int8 or int4, activations float)
# the transformers architectures the worker maps onto litert-torch's re-authored decoder
# (routes/litert/worker/lm_litert.py, which also checks a pretrained folder's or a factory's model): its exporter for
# the others (export_hf) imports TensorFlow, which the toolchain does not install
ARCHITECTURES = ("llama", "qwen2")
NOT_MAPPED = ("LiteRT's generative path takes model_type 'llama' or 'qwen2' only (litert-torch's export_hf needs "
              "TensorFlow)")


@dataclass(frozen=True)
class LMConvertConfig:
    """A causal LM as litert-torch's generative converter makes it: a prefill signature per prompt length (its
    prefills take fixed lengths) and a decode signature, the static KV cache of max_context as their inputs and
    outputs."""

    model: ModelSource
    precision: str
    max_context: int
    prompt_lengths: list
    group_size: int | None = None  # int4 only
    exclude: list | None = when_set()  # quantize.exclude: parts of the decoder the quantizer leaves float


def lm_convert(chain):
    return chain.shipped("lm_litert", convert_config(chain), {"checkpoint": chain.nodes["checkpoint"]},
                         files=chain.source_files)


def convert_config(chain):
    exported = generation.export_config(chain)
    model_type = (exported.model.get("config") or {}).get("model_type")
    if model_type not in (None, *ARCHITECTURES):
        raise chain.error(f"model_type {model_type!r}: {NOT_MAPPED}", "model.config.model_type")
    if chain.precision == "int4" and exported.group_size not in INT4_BLOCKS:
        raise chain.error(f"LiteRT's int4 (litert-torch's dynamic_int4 recipes) takes blocks of "
                          f"{' or '.join(map(str, INT4_BLOCKS))} weights, not {exported.group_size}: set "
                          f"generate.group_size to one of them or use int8", "generate.group_size")
    return LMConvertConfig(model=exported.model, precision=exported.precision, max_context=exported.max_context,
                           prompt_lengths=chain.recipe.generate["prompt_lengths"], group_size=exported.group_size,
                           exclude=exported.exclude)


# worker side: mobilebuild.routes.litert.worker.lm_litert
stages.register(stages.Stage(
    "lm_litert", LMConvertConfig, {"checkpoint": ("checkpoint",)},
    "Language models as LiteRT models (.tflite): prefill and decode signatures with a static KV cache.", "#d9ead3",
    plan=lm_convert, module="mobilebuild.routes.litert.worker.lm_litert",
    recipe_fields=generation.recipe_fields(LMConvertConfig)))

def lm_bundle(chain):
    """A LiteRT-LM bundle: the converter's .tflite (as lm_convert makes it) with the recipe's tokenizer."""
    tokenizer = chain.nodes.get(generation.TOKENIZER)
    if tokenizer is None:
        raise chain.error("a LiteRT-LM bundle carries the model's tokenizer: name it in generate.tokenizer (a "
                          "tokenizer.json or a SentencePiece model)", "generate.tokenizer")
    return chain.shipped("lm_litertlm", convert_config(chain),
                         {"checkpoint": chain.nodes["checkpoint"], "tokenizer": tokenizer}, files=chain.source_files)


# worker side: mobilebuild.routes.litert.worker.lm_litertlm
stages.register(stages.Stage(
    "lm_litertlm", LMConvertConfig, {"checkpoint": ("checkpoint",), "tokenizer": (generation.TOKENIZER,)},
    "Language models as LiteRT-LM bundles (.litertlm): the .tflite, its tokenizer and LLM metadata.", "#d9ead3",
    plan=lm_bundle, module="mobilebuild.routes.litert.worker.lm_litertlm",
    recipe_fields=generation.recipe_fields(LMConvertConfig)))

SECTION = Section("litert", SCHEMA)
CHECKS = Checks(preflight=preflight, outputs=outputs)


def runtime(device_only=None):
    return Runtime("litert", FAMILY, module="mobilebuild.routes.litert.worker.runtime", device_only=device_only,
                   fixed_shapes=FIXED, packages=PACKAGES, package="ai-edge-litert", structure=structure, extra="litert",
                   arm64=Arm64("mobilebuild.routes.litert.worker.guest", ("ai-edge-litert",)))


register(Route("xnnpack", "litert", ("fp32", "int8"), ("litert",), ".tflite",
               "CPU through LiteRT's XNNPACK delegate (fp16 weights on request; int8: PT2E static or dynamic-range)",
               runtime(), int8=Int8("final", observers=TORCH_OBSERVERS, modes=MODES), section=SECTION,
               generation=Generation("lm_litert", LM_PRECISIONS, layers="mobilebuild.routes.litert.worker.lm_layers"),
               checks=Checks(preflight=preflight, outputs=outputs, layers=tensor_layers,
                             layer_methods={"litert": "LiteRT interpreter, tensor by tensor (cumulative)",
                                            "lm_litert": "each part of the decoder alone quantized by "
                                                         "ai-edge-quantizer, logits at the prefill"})))
register(Route("xnnpack", "litert-lm", (), (), ".litertlm",
               "Language models as LiteRT-LM runs them: a .litertlm bundle (the .tflite, its tokenizer, LLM metadata) "
               "for its engine's CPU backend",
               Runtime("litert-lm", "LiteRT-LM", module="mobilebuild.routes.litert.worker.litertlm_runtime",
                       packages=(*PACKAGES, "litert-lm-api"), package="litert-lm-api", extra="litert"),
               generation=Generation("lm_litertlm", LM_PRECISIONS)))
register(Route("gpu-delegate", "litert", ("fp32",), ("litert",), ".tflite",
               "GPU through LiteRT's GPU delegate (OpenCL/OpenGL on Android, Metal on iOS); fp16 weights by default",
               runtime("a phone GPU with LiteRT's GPU delegate"), section=SECTION, default=True, checks=CHECKS))
register(Route("npu", "litert", ("int8",), ("litert",), ".tflite",
               "NPU through LiteRT's NPU accelerators (Qualcomm, MediaTek, Google Tensor), compiled on the device from "
               "the fully integer model (compiling ahead of time needs the vendor's SDK)",
               runtime("a phone NPU with LiteRT's NPU accelerator"),
               int8=Int8("final", observers=TORCH_OBSERVERS), section=SECTION, default=True, checks=CHECKS))
