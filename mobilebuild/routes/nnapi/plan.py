"""Android NNAPI through PyTorch Mobile: the fused (and, for int8, eagerly quantized) model traced NHWC and converted by
torch.backends._nnapi in the NNAPI blog's modes (none / core / full), saved for the lite interpreter. It runs only on
a device; the host inspects it. Its worker half (stages, runtime, per-layer method, emulated-ARM runner) is worker/,
beside this module."""

from dataclasses import dataclass

from mobilebuild.plan import stages
from mobilebuild.plan.routes import ActivationFusion, Checks, Int8, Route, Runtime, Section, mapping, register, text
from mobilebuild.plan.settings import Fusion, ModelSource, Quantization
from mobilebuild.routes.torchscript.plan import FAMILY, LAYER_METHODS, TORCH_OBSERVERS, device, eager_layers, preflight

# what torch.backends._nnapi's serializer takes (and quantized tensors)
INPUT_DTYPES = ("float32", "int32")
SCHEMA = {
    "description": "NNAPI conversion (the NNAPI blog's modes): none = float model; core = quantized core with a "
                   "float interface; full = quantized input and output.",
    "type": "object", "additionalProperties": False, "default": {},
    "properties": {"mode": {"enum": ["none", "core", "full"], "default": "none"}},
}


@dataclass(frozen=True)
class NnapiConfig:
    precision: str
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    mode: str  # none | core | full
    engine: str
    quantization: Quantization | None
    options: dict  # bundled_inputs
    model: ModelSource  # the model source and fusion the fused model is rebuilt from: it is stored as weights only
    fuse: Fusion


def plan(chain):
    settings = chain.settings
    config = NnapiConfig(precision=chain.precision, inputs=chain.recipe.inputs, mode=settings["mode"],
                         engine=chain.route.engine, quantization=chain.quantization,
                         options={"bundled_inputs": chain.target.optimize["bundled_inputs"]},
                         model=chain.source, fuse=chain.recipe.fuse)
    return chain.shipped("nnapi", config, chain.model_inputs(), files=chain.source_files)


def precision(target):
    """The NNAPI blog's modes: only "none" keeps the float model."""
    return "fp32" if target.settings.get("nnapi", {}).get("mode", "none") == "none" else "int8"


def structure(facts):
    model = mapping(facts.get("nnapi_model"))
    if not model:
        return ""
    return f"NNAPI model: {text(model.get('operations'))} operations, {text(model.get('operands'))} operands"


def outputs(found):
    """What the converter returns (preflight.interface.Outputs)."""
    if found.container - {"tuple", "namedtuple"} or found.nested:
        return found.say("NNAPI cannot return them: the converter returns a tensor or a flat tuple of tensors "
                         "(return a tuple)")
    if "namedtuple" in found.container:
        return found.say("NNAPI returns a plain tuple: the field names are lost")
    return []


stages.register(stages.Stage(
    "nnapi", NnapiConfig, {"model": ("fuse",), "quantized": ("quantize",)},
    "NNAPI models (traced NHWC, converted by torch.backends._nnapi) with bundled inputs (.ptl).", "#a4c2f4",
    plan=plan, module="mobilebuild.routes.nnapi.worker.nnapi",
    recipe_fields={"mode": "targets.nnapi.mode", "options": "targets.optimize"}))

register(Route(
    "nnapi", "pytorch-mobile", ("fp32", "int8"), ("nnapi",), ".ptl",
    "Android NNAPI (accelerators) through torch.backends._nnapi, traced NHWC, lite interpreter",
    Runtime("nnapi", FAMILY, module="mobilebuild.routes.nnapi.worker.runtime",
            device_only="an Android 8.1+ device with NNAPI",
            fixed_shapes="the NNAPI converter takes the example's sizes", structure=structure, device_bench=device),
    # torch.backends._nnapi converts per-tensor quantized weights only (FX graph mode's default is per channel)
    int8=Int8("eager", engine="qnnpack", observers=TORCH_OBSERVERS, weights="per_tensor"),
    section=Section("nnapi", SCHEMA),
    precision_of=precision, default=True,
    checks=Checks(preflight=preflight, outputs=outputs, layers=eager_layers,
                  fusion=ActivationFusion({"conv": {"relu"}, "linear": set()}, (
                      "the NNAPI converter fuses only ReLU, into quantized convolutions (conv2d_relu); ReLU6 and the "
                      "rest are NNAPI operations of their own")),
                  layer_methods=LAYER_METHODS, input_dtypes=INPUT_DTYPES,
                  input_dtypes_why="torch.backends._nnapi converts float32, int32 and quantized input tensors only")))
