"""PyTorch Mobile through TorchScript: `script` (per precision) then `optimize_for_mobile` (.ptl), for XNNPACK fp32,
QNNPACK int8 (the quantize stage's eager or FX graph mode model) and the Vulkan and Metal GPU backends. Its worker
half (stages, runtime, per-layer method, emulated-ARM runner) is worker/, beside this module."""

import os
from dataclasses import dataclass, replace

from mobilebuild.plan import stages
from mobilebuild.plan.routes import (
    CLAMPS,
    ActivationFusion,
    Arm64,
    Checks,
    Int8,
    Route,
    Runtime,
    mapping,
    register,
    text,
)
from mobilebuild.plan.settings import Fusion, ModelSource, Quantization
from mobilebuild.routes.torchscript import torch_libs

FAMILY = "PyTorch Mobile"
# Activation observers (quantize.observer), the default first: torch.ao's (eager and FX graph mode) HistogramObserver,
# MinMaxObserver, MovingAverageMinMaxObserver
TORCH_OBSERVERS = ("histogram", "minmax", "moving_average")
LAYER_METHODS = {"eager": "eager numeric suite", "fx": "FX numeric suite"}
SERIAL_ENV_VARS = ("MOBILEBUILD_ADB_SERIAL", "ANDROID_SERIAL")


@dataclass(frozen=True)
class ScriptConfig:
    mode: str  # script | trace
    precision: str
    engine: str | None
    quantization: Quantization | None  # {mode, weights}: how to rebuild the quantized model
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    model: ModelSource  # the model source and fusion the fused model is rebuilt from: it is stored as weights only
    fuse: Fusion


@dataclass(frozen=True)
class OptimizeConfig:
    backend: str
    engine: str | None
    options: dict  # the target's `optimize`: blocklist, preserved_methods, bundled_inputs
    script_mode: str
    inputs: list  # the inputs' specs (plan.recipe.input_specs)


def script(chain):
    """TorchScript per precision (and engine): the targets of one precision share it. It rebuilds the fused model
    from the factory: its source is among the node's files."""
    recipe, route = chain.recipe, chain.route
    tag = chain.target.id if chain.own_quantization else route.tag(chain.precision)
    config = ScriptConfig(mode=recipe.script, precision=chain.precision, engine=route.engine,
                          quantization=chain.quantization, inputs=recipe.inputs, model=chain.source, fuse=recipe.fuse)
    return chain.node("script", f"{recipe.name}-{tag}", config, chain.model_inputs(),
                      f"{chain.out}/scripted-{tag}.pt", files=chain.source_files)


def optimize(chain):
    route, recipe = chain.route, chain.recipe
    config = OptimizeConfig(backend=route.backend, engine=route.engine if chain.precision == "int8" else None,
                            options=chain.target.optimize, script_mode=recipe.script, inputs=recipe.inputs)
    return chain.shipped("optimize", config, {"scripted": chain.nodes["script"]})


# --- what the build adds for these targets ---------------------------------------------------------------------

def eager_layers(chain, common, files):
    """The quantize stage's model (eager or FX graph mode) against the float one, layer by layer."""
    if "quantize" not in chain.nodes:
        return None
    settings = stages.LayersConfig(method="mobilebuild.worker.layers.eager", engine=chain.route.engine,
                                   quantization=chain.quantization, **common)
    return chain.layers_node(settings, {"quantized": chain.nodes["quantize"]}, files)


def select_device(configured_serial=None, env=None):
    """The Android device to benchmark on: the recipe's serial, else $MOBILEBUILD_ADB_SERIAL, else $ANDROID_SERIAL;
    or None. The selection keys the bench node."""
    env = os.environ if env is None else env
    for candidate in (configured_serial, *(env.get(name) for name in SERIAL_ENV_VARS)):
        if candidate:
            return candidate
    return None


def device(device_config):
    """Which Android device benchmarks the artifact (speed_benchmark_torch over adb); the selection keys the bench
    task."""
    return {"serial": select_device(device_config.get("serial")), "binary": device_config["binary"],
            "use_bundled_input": device_config["use_bundled_input"]}


def traced(recipe):
    return "tracing records the example's sizes (script: script keeps them)" if recipe.script == "trace" else None


# --- mobilebuild check ------------------------------------------------------------------------------------------

def preflight(check):
    """`check`: preflight.targets.TargetCheck."""
    route, target = check.route, check.target
    if check.built and route.precision(target) == "int8":
        check.quantization_note()
    check.activation_advice(route.checks.fusion)


def xnnpack_preflight(check):
    preflight(check)
    (first, *others) = check.model.inputs
    if not others and first["memory_format"] != "channels_last" and len(first["shape"]) == 4 \
            and not check.model.converts_to_nhwc:
        check.add("advice", "the input is NCHW (contiguous): XNNPACK computes in NHWC and converts around every "
                            "convolution (MobileNetV2 here: about 415 ms against 28 ms); set "
                            "input.memory_format: channels_last (the performance recipe, step 4)",
                  "input.memory_format")


def outputs(found):
    """What TorchScript keeps of the output structure (preflight.interface.Outputs)."""
    if (found.precision == "int8" and found.route.quantizes_eagerly and found.script == "script" and not found.made
            and found.quantize.get("mode", "static") == "static" and not found.own_stubs):
        return found.say("eager int8 dequantizes each output in a wrapper torch.jit.script cannot compile; "
                         "`script: trace` keeps the structure")
    if found.script == "trace" and "namedtuple" in found.container:
        return found.say("traced TorchScript returns a named tuple as a plain tuple (the field names are lost); "
                         "`script: script` keeps them")
    return []


stages.register(stages.Stage(
    "script", ScriptConfig, {"model": ("fuse",), "quantized": ("quantize",)},
    "TorchScript per precision (script or trace).", "#d0e0e3", plan=script, form="torchscript",
    module="mobilebuild.routes.torchscript.worker.script",
    recipe_fields={"mode": "script"}))
stages.register(stages.Stage(
    "optimize", OptimizeConfig, {"scripted": ("script",)},
    "optimize_for_mobile per target, saved for the lite interpreter (.ptl).", "#c9daf8", plan=optimize,
    module="mobilebuild.routes.torchscript.worker.optimize",
    recipe_fields={"options": "targets.optimize"}))

def structure(facts):
    """How the artifact was made, where not as the recipe asked: the quantize stage's dynamic int8 where static
    could not be made, the script stage's traced fallback."""
    made = mapping(facts.get("torchscript"))
    int8 = mapping(made.get("int8"))
    parts = [f"int8 {text(int8.get('int8'))}, as {text(int8.get('why'))}" if int8 else "",
             f"traced, as {text(made.get('why'))}" if made.get("made_by") else ""]
    return "; ".join(part for part in parts if part)


STAGES = ("script", "optimize")
RUNTIME = Runtime("pytorch-mobile", FAMILY, module="mobilebuild.routes.torchscript.worker.runtime", structure=structure,
                  device_bench=device,
                  arm64=Arm64("mobilebuild.routes.torchscript.worker.guest", ("torch",), setup=torch_libs))
CHECKS = Checks(preflight=preflight, outputs=outputs, fixed_shapes=traced)

register(Route("xnnpack", "pytorch-mobile", ("fp32",), STAGES, ".ptl",
               "fp32 CPU through XNNPACK prepacked kernels, TorchScript lite interpreter", RUNTIME, default=True,
               checks=replace(CHECKS, preflight=xnnpack_preflight, fusion=ActivationFusion(
                   {"conv": CLAMPS, "linear": CLAMPS}, "optimize_for_mobile folds only ReLU and ReLU6/Hardtanh "
                   "clamps into XNNPACK's prepacked convolution and linear ops"))))
register(Route("qnnpack", "pytorch-mobile", ("int8",), STAGES, ".ptl",
               "int8 CPU through QNNPACK, eager post-training quantization, TorchScript lite interpreter", RUNTIME,
               int8=Int8("eager", engine="qnnpack", observers=TORCH_OBSERVERS), default=True,
               checks=replace(CHECKS, layers=eager_layers, layer_methods=LAYER_METHODS, fusion=ActivationFusion(
                   {"conv": {"relu"}, "linear": {"relu"}},
                   "eager quantization fuses only Conv/Linear + ReLU (fuse_modules)"))))
register(Route("vulkan", "pytorch-mobile", ("fp32",), STAGES, ".ptl",
               "GPU through Vulkan, optimize_for_mobile(backend='vulkan'); needs a torch built with USE_VULKAN=1 "
               "(a `toolchain:` interpreter)",
               replace(RUNTIME, device_only="an Android GPU with Vulkan"), default=True,
               checks=replace(CHECKS, fusion=ActivationFusion({"conv": CLAMPS}, (
                   "optimize_for_mobile(backend='vulkan') folds only ReLU and ReLU6/Hardtanh clamps into its "
                   "convolutions")))))
register(Route("metal", "pytorch-mobile", ("fp32",), STAGES, ".ptl",
               "Apple GPU through Metal, optimize_for_mobile(backend='metal'); needs a torch built with the Metal "
               "export ops (a `toolchain:` interpreter)",
               replace(RUNTIME, device_only="an iPhone or iPad GPU (Metal)"), default=True,
               checks=replace(CHECKS, fusion=ActivationFusion({"conv": CLAMPS}, (
                   "optimize_for_mobile(backend='metal') folds only ReLU and ReLU6/Hardtanh clamps into its "
                   "convolutions")))))
