"""ncnn, Tencent's mobile inference runtime: the fused model traced (torch.jit.trace) and converted by pnnx, ncnn's
official PyTorch converter, to ncnn's two files (model.ncnn.param, the graph as text; model.ncnn.bin, the weights),
shipped as one deterministic zip; run by ncnn's Python binding on its CPU path, or on its Vulkan compute path. The
precision is the weights' and the arithmetic's: fp32; fp16 (pnnx's fp16 weights, and ncnn's fp16 storage and
arithmetic, as a phone's GPU and an ARMv8.2 CPU run them), judged at the fp16 thresholds; int8 (ncnn's int8
convolutions and inner products, calibrated on the recipe's data as ncnn2table does and written as ncnn2int8 does:
neither tool ships in a wheel, worker/int8.py). Its worker half (stage, runtime, the emulated-ARM runner) is worker/,
beside this module."""

import os
from dataclasses import dataclass
from pathlib import Path

from mobilebuild.plan import stages
from mobilebuild.plan.routes import Arm64, Checks, Int8, Route, Runtime, mapping, register, text
from mobilebuild.plan.settings import Fusion, ModelSource
from mobilebuild.plan.stages import when_set

FAMILY = "ncnn"
PACKAGES = ("ncnn", "pnnx")  # what runs the artifacts, and what converts them: the versions that key the nodes
# The runtime names the verify and bench stages' settings carry: the worker's runtime runs the artifact on ncnn's
# CPU path for the first, its Vulkan compute path for the second
CPU_RUNTIME, VULKAN_RUNTIME = "ncnn", "ncnn-vulkan"
FIXED = ("pnnx converts at the example's sizes (its second shape set for dynamic dims, inputshape2, is not wired "
         "yet)")
# quantize.observer, the default first: torch.ao's observers (symmetric) over the fp32 model's blobs in ncnn
OBSERVERS = ("histogram", "minmax", "moving_average")
SOFTWARE_GPU = ("timed on the host's Vulkan driver (a software one, Mesa's llvmpipe, where there is no GPU): not a "
                "phone GPU's speed")


@dataclass(frozen=True)
class ConvertConfig:
    precision: str  # fp32 | fp16 | int8: pnnx's fp16 option (the weights), which the runtime's fp16 options follow
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    model: ModelSource  # the model source and fusion the fused model is rebuilt from: it is stored as weights only
    fuse: Fusion
    calibration: dict | None = when_set()  # int8: quantize.calibration
    weights: str | None = when_set()  # int8: quantize.weights (per_channel where unset, as ncnn2table)
    exclude: list | None = when_set()  # int8: quantize.exclude
    observer: str | None = when_set()  # int8: quantize.observer


def plan(chain):
    quantization, files = chain.final_quantization()
    config = ConvertConfig(precision=chain.precision, inputs=chain.recipe.inputs, model=chain.source,
                           fuse=chain.recipe.fuse, **quantization)
    return chain.shipped("ncnn", config, {"model": chain.nodes["fuse"]}, files=files)


def structure(facts):
    """'41 layers (Convolution 12, ...); fp16' (int8: '52 of 53 layers with weights int8, the rest fp32'): what the
    .param holds and the precision ncnn runs it in, read by verify."""
    if facts.get("layers") is None:
        return ""
    kinds = sorted(mapping(facts.get("layer_types")).items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{kind} {count}" for kind, count in kinds[:4]) + (", ..." if len(kinds) > 4 else "")
    precision = text(facts.get("precision"))
    if facts.get("int8_layers") is not None:
        precision = (f"{text(facts.get('int8_layers'))} of {text(facts.get('weighted_layers'))} layers with weights "
                     "int8, the rest fp32")
    return f"{text(facts.get('layers'))} layers ({shown}); {precision}"


def notes(facts):
    """The Vulkan device the host ran the artifact on, where it is not a phone's GPU."""
    device = facts.get("vulkan_device")
    return [f"verified on the host's Vulkan device {device}: its numbers are ncnn's Vulkan path, its speed is not a "
            "phone GPU's"] if device else []


def blob_layers(chain, common, files):
    """Each int8 layer of the shipped model against pnnx's fp32 conversion of the float model, fed its input blob."""
    return chain.layers_node(stages.LayersConfig(method="mobilebuild.routes.ncnn.worker.layers", **common), {},
                             files)


def preflight(check):
    """Loading the converted model in ncnn, the host run every check makes, is all there is to check."""


def outputs(found):
    """ncnn's blobs are flat and numbered (preflight.interface.Outputs)."""
    if not found.flat:
        return found.say(f"ncnn has {len(found.names)} flat output blobs, out0 to out{len(found.names) - 1}, in this "
                         f"order: {', '.join(found.names)}")
    return []


stages.register(stages.Stage(
    "ncnn", ConvertConfig, {"model": ("fuse",)},
    "ncnn models (.param and .bin, zipped) converted by pnnx: fp32 or fp16 weights, or int8 calibrated.", "#f6b26b",
    plan=plan,
    module="mobilebuild.routes.ncnn.worker.convert"))
CHECKS = Checks(preflight=preflight, outputs=outputs, layers=blob_layers,
                layer_methods={"ncnn": "ncnn, layer by layer: each int8 layer fed the fp32 conversion's input blob"},
                input_dtypes=("float32", "int32", "int64"),
                input_dtypes_why="ncnn's blobs hold floats, and integers as int32 (token ids: the runtime passes "
                                 "int64 ones as int32)")


# where the Vulkan loader looks for drivers' manifests (ICD files), besides VK_ICD_FILENAMES and VK_DRIVER_FILES
ICD_FOLDERS = ("/usr/share/vulkan/icd.d", "/usr/local/share/vulkan/icd.d", "/etc/vulkan/icd.d")
NO_DRIVER = ("a host with a Vulkan driver (none is installed here: `apt-get install mesa-vulkan-drivers`, whose "
             "llvmpipe runs ncnn's Vulkan path on the CPU)")


def vulkan_driver(folders=ICD_FOLDERS):
    """Whether a Vulkan driver is installed, by the manifests the loader reads, without loading one: planning stays
    fast and torch-free, and a driver installed later changes the Vulkan targets' keys, so they run then."""
    if os.environ.get("VK_ICD_FILENAMES") or os.environ.get("VK_DRIVER_FILES"):
        return True
    return any(any(Path(folder).glob("*.json")) for folder in folders)


def runtime(name, unranked=None, arm64=None, device_only=None):
    return Runtime(name, FAMILY, module="mobilebuild.routes.ncnn.worker.runtime", fixed_shapes=FIXED,
                   packages=PACKAGES, package="ncnn", structure=structure, notes=notes, extra="ncnn",
                   unranked=unranked, arm64=arm64, device_only=device_only)


INT8 = Int8("final", observers=OBSERVERS)
register(Route("ncnn", "ncnn", ("fp32", "fp16", "int8"), ("ncnn",), ".ncnn.zip",
               "CPU through ncnn (Tencent), converted by pnnx: .param and .bin in one zip (fp16: fp16 weights, "
               "storage and arithmetic where the CPU has it; int8: its convolutions and inner products, calibrated)",
               runtime(CPU_RUNTIME, arm64=Arm64("mobilebuild.routes.ncnn.worker.guest", ("ncnn",))), int8=INT8,
               default=True, checks=CHECKS))
register(Route("vulkan", "ncnn", ("fp16", "fp32", "int8"), ("ncnn",), ".ncnn.zip",
               "GPU through ncnn's Vulkan compute path (fp16 by default: fp16 weights, storage and arithmetic, as on a "
               "phone GPU), converted by pnnx; verified on the host's Vulkan driver (Mesa's llvmpipe where there is no "
               "GPU)",
               runtime(VULKAN_RUNTIME, unranked=SOFTWARE_GPU, device_only=None if vulkan_driver() else NO_DRIVER),
               int8=INT8, checks=CHECKS))
