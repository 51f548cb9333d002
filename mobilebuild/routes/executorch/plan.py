"""ExecuTorch: the fused model exported and lowered to a delegate (.pte): XNNPACK (fp32, and int8 through PT2E: static
or dynamic), Vulkan, Core ML or MPS. XNNPACK programs run on the host through executorch.runtime; the others only on
devices, where the host reads what was delegated. Its worker half (stages, runtime, per-layer method, emulated-ARM
runner) is worker/, beside this module."""

from dataclasses import dataclass, replace

from mobilebuild.plan import generation, stages
from mobilebuild.plan.routes import (
    CLAMPS,
    ActivationFusion,
    Arm64,
    Checks,
    Generation,
    Int8,
    Route,
    Runtime,
    Section,
    mapping,
    register,
    text,
)
from mobilebuild.plan.settings import Fusion, ModelSource
from mobilebuild.plan.stages import when_set
from mobilebuild.routes.executorch import lm_package
from mobilebuild.routes.torchscript import torch_libs
from mobilebuild.routes.torchscript.plan import TORCH_OBSERVERS, select_device

FAMILY = "ExecuTorch"
PACKAGES = ("executorch", "torchao", "coremltools")
# ExecuTorch 1.3.1's export recipe quantizes a graph it captures without dynamic shapes (QuantizeStage); dynamic
# int8 is quantized by the lower stage itself on a graph captured with them, and keeps them
INT8_FIXED = "ExecuTorch's int8 export recipe captures the model at the example's sizes"
# ExecuTorch's XNNPackRecipeType.PT2E_INT8_DYNAMIC_PER_CHANNEL
MODES = ("static", "dynamic")
SCHEMA = {
    "description": "ExecuTorch lowering options.",
    "type": "object", "additionalProperties": False, "default": {},
    "properties": {
        "delegate": {"description": "The partitioner; default: xnnpack for xnnpack, vulkan for vulkan, coreml for "
                                    "metal.", "enum": ["xnnpack", "vulkan", "coreml", "mps"]},
        "compute_units": {"description": "Core ML compute units.",
                          "enum": ["all", "cpu_and_gpu", "cpu_and_ne", "cpu_only"]},
        "compute_precision": {"description": "Delegate arithmetic: Core ML fp16 (default) or fp32; Vulkan fp32 "
                                             "(default) or fp16; MPS fp16 (default) or fp32.",
                              "enum": ["fp16", "fp32"]},
    },
}


@dataclass(frozen=True)
class LowerConfig:
    precision: str
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    delegate: str
    options: dict  # the delegate's options
    model: ModelSource  # the model source and fusion the fused model is rebuilt from: it is stored as weights only
    fuse: Fusion
    calibration: dict | None = None  # int8, static
    weights: str | None = None
    exclude: list | None = when_set()  # int8: quantize.exclude
    observer: str | None = when_set()  # int8: quantize.observer
    mode: str = when_set("static")  # int8: quantize.mode, static (calibrated) or dynamic (int8 activations at run time)


# Each backend's delegate (ExecuTorch's partitioner), where the target's executorch.delegate does not name another
DELEGATES = {"xnnpack": "xnnpack", "vulkan": "vulkan", "metal": "coreml"}


def own_delegate(route):
    return DELEGATES[route.backend]


def lower(chain):
    quantization, files = chain.final_quantization()
    options = chain.settings
    delegate = options.pop("delegate", own_delegate(chain.route))
    if delegate != own_delegate(chain.route):  # another delegate's quantizer: its own observers and module selection
        for key in ("exclude", "observer"):
            if quantization.get(key):
                raise chain.error(f"the {delegate} delegate's int8 recipe quantizes with its own quantizer, which "
                                  f"takes no {key}: leave it out for this target", f"quantize.{key}")
        if quantization.get("mode") == "dynamic":
            raise chain.error(f"the {delegate} delegate's int8 recipe is static (calibrated): mode 'dynamic' is "
                              f"{own_delegate(chain.route)}'s; use mode 'static' for this target", "quantize.mode")
    config = LowerConfig(precision=chain.precision, inputs=chain.recipe.inputs, delegate=delegate, options=options,
                         model=chain.source, fuse=chain.recipe.fuse, **quantization)
    return chain.shipped("lower", config, {"model": chain.nodes["fuse"]}, files=files)


def pt2e_layers(chain, common, files):
    """The lower stage's PT2E quantization run again, its quantized graph against the float one (only where the
    target lowers to the route's own delegate, whose quantizer this is)."""
    lowering = chain.nodes[chain.route.final_stage].settings
    if lowering.delegate != own_delegate(chain.route):
        return None
    settings = stages.LayersConfig(method="mobilebuild.routes.executorch.worker.layers", weights=lowering.weights,
                                   options=lowering.options, exclude=lowering.exclude, observer=lowering.observer,
                                   mode=lowering.mode, **{**common, "calibration": lowering.calibration})
    return chain.layers_node(settings, {}, files + chain.nodes[chain.route.final_stage].files)


def structure(facts):
    delegation = mapping(facts.get("delegation"))
    if not delegation:
        return ""
    counts = mapping(delegation.get("delegates")).items()
    delegates = ", ".join(f"{text(count)} {name} call(s)" for name, count in counts)
    made = mapping(facts.get("made"))
    how = f"; int8 {text(made.get('int8'))} by torchao, as {text(made.get('why'))}" if made.get("int8") else ""
    return (f"{delegates or 'nothing delegated'}; {text(delegation.get('fallback_calls'))} op(s) outside the "
            f"delegate{how}")


def fallback_notes(facts):
    """The report's note on the operators a program runs outside its delegate, on ExecuTorch's portable kernels."""
    ops = mapping(mapping(facts.get("delegation")).get("fallback_ops"))
    return ["not delegated: " + ", ".join(f"{op} x{count}" for op, count in sorted(ops.items()))] if ops else []


# --- mobilebuild check: what the program delegates, read from the .pte (by the build's verify, where it read these
# bytes)

BACKEND_NAMES = {"xnnpack": "XNNPACK", "vulkan": "Vulkan", "coreml": "Core ML", "mps": "MPS"}
# The activations each delegate fuses into the op before them (Core ML's and MPS's: no claim)
DELEGATE_FUSION = {
    "xnnpack": ActivationFusion({"conv": CLAMPS, "linear": CLAMPS}, (
        "ExecuTorch's XNNPACK delegate fuses only ReLU and ReLU6/Hardtanh clamps into the op before them")),
    "vulkan": ActivationFusion({"conv": CLAMPS}, (
        "ExecuTorch's Vulkan delegate fuses only ReLU and ReLU6/Hardtanh clamps into convolutions (conv_with_clamp)")),
}


def undelegated_message(summary, delegate):
    """The lower stage's warning for a program of which `delegate` took nothing (`summary`: a delegation), or None."""
    if summary["delegated_calls"] == 0:
        return (f"nothing was delegated to {BACKEND_NAMES[delegate]}: all {summary['fallback_calls']} operator "
                "calls run on ExecuTorch's portable CPU kernels")
    return None


def preflight(check):
    delegate = check.artifact.config.get("delegate") or own_delegate(check.route)
    check.facts["delegate"] = delegate
    check.activation_advice(DELEGATE_FUSION.get(delegate))
    if not check.built:
        return
    summary = check.artifact_facts("delegation")["delegation"]
    check.facts["delegation"] = summary
    name = BACKEND_NAMES[delegate]
    message = undelegated_message(summary, delegate)
    if message:
        check.add("fallback", message, "whole program")
        return
    for operator, calls in summary["fallback_ops"].items():
        check.add("fallback", f"{calls} call{'s' if calls > 1 else ''} on ExecuTorch's portable CPU kernels, "
                              f"outside {name} (the program makes {summary['delegated_calls']} delegate "
                              f"call{'s' if summary['delegated_calls'] > 1 else ''})" + layout_hint(check, operator),
                  operator)


def layout_hint(check, line):
    """Both were seen with MobileNetV2 and a channels_last input, and are gone with a contiguous one."""
    if check.model.inputs[0]["memory_format"] != "channels_last":
        return ""
    if "as_strided" in line:
        return "; it is the reshape of an NHWC tensor, from the channels_last input (input.memory_format)"
    if "dim order" in line:
        return "; the input is channels_last (input.memory_format): Core ML lowers it contiguous"
    return ""


def outputs(found):
    """ExecuTorch returns a flat list of tensors (preflight.interface.Outputs)."""
    if "namedtuple" in found.container:
        return found.say("ExecuTorch cannot serialize a named tuple output (return a tuple or a dict)")
    if not found.flat:
        return found.say(f"ExecuTorch returns a flat list of {len(found.names)} tensors, in this order: "
                         f"{', '.join(found.names)}")
    return []


stages.register(stages.Stage(
    "lower", LowerConfig, {"model": ("fuse",)},
    "ExecuTorch programs (.pte) lowered to their delegate: XNNPACK, Vulkan, Core ML or MPS.", "#9fc5e8", plan=lower,
    module="mobilebuild.routes.executorch.worker.lower",
    recipe_fields={"options": "targets.executorch", "delegate": "targets.executorch.delegate",
                   "mode": "quantize.mode"}))

def lm_lower(chain):
    """A .pte, or where the LM head stays float the program and its weights apart, zipped (lm_package)."""
    settings = generation.export_config(chain)
    apart = lm_package.weights_apart(settings.precision, settings.exclude)
    return chain.shipped("lm_lower", settings, {"checkpoint": chain.nodes["checkpoint"]}, files=chain.source_files,
                         suffix=lm_package.SUFFIX if apart else None)


# A language model (generate:): transformers' static-cache export, ExecuTorch's own torchao quantization of its
# linear layers (8da4w, 8da8w), lowered to XNNPACK (worker side: mobilebuild.routes.executorch.worker.lm_lower)
stages.register(stages.Stage(
    "lm_lower", generation.LMExportConfig, {"checkpoint": ("checkpoint",)},
    "Language models as ExecuTorch programs (.pte) with a static KV cache, lowered to XNNPACK.", "#9fc5e8",
    plan=lm_lower, module="mobilebuild.routes.executorch.worker.lm_lower",
    recipe_fields=generation.recipe_fields(generation.LMExportConfig)))

SECTION = Section("executorch", SCHEMA)
CHECKS = Checks(preflight=preflight, hint=layout_hint, outputs=outputs)


def lm_device(device_config):
    """The Android device on which ExecuTorch's LLM runner (llama_main over adb) times a language model's program;
    the selection keys the timing node."""
    return {"serial": select_device(device_config.get("serial")), "binary": device_config["llm_runner"]}


def runtime(device_only=None):
    return Runtime("executorch", FAMILY, module="mobilebuild.routes.executorch.worker.runtime", device_only=device_only,
                   packages=PACKAGES, package="executorch", structure=structure, notes=fallback_notes,
                   extra="executorch",
                   arm64=Arm64("mobilebuild.routes.executorch.worker.guest", ("executorch", "torch"), setup=torch_libs))


register(Route("xnnpack", "executorch", ("fp32", "int8"), ("lower",), ".pte",
               "CPU through ExecuTorch's XNNPACK delegate (int8: pt2e XNNPACKQuantizer)", runtime(),
               int8=Int8("final", observers=TORCH_OBSERVERS, modes=MODES, fixed_shapes=INT8_FIXED),
               section=SECTION, generation=Generation("lm_lower", ("fp32", "8da4w", "8da8w"),
                                     layers="mobilebuild.routes.executorch.worker.lm_layers", device=lm_device),
               checks=replace(CHECKS, layers=pt2e_layers, layer_methods={
                   "pt2e": "PT2E numeric debugger",
                   "lm_torchao": "each linear layer alone quantized by torchao, eager logits at the prefill"})))
register(Route("vulkan", "executorch", ("fp32",), ("lower",), ".pte", "GPU through ExecuTorch's Vulkan delegate",
               runtime("a device with a Vulkan GPU and ExecuTorch's Vulkan runtime"),
               section=SECTION, checks=CHECKS))
register(Route("metal", "executorch", ("fp32",), ("lower",), ".pte",
               "Apple GPU / Neural Engine through ExecuTorch's Core ML delegate (or MPS)",
               runtime("an Apple device (Core ML / MPS)"), section=SECTION, checks=CHECKS))
