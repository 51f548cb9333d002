"""The registry of targets: one `Route` per backend x runtime, the single entry everything else derives from.

From a route come the stages after the fused model (and so the doit task groups), the recipe grammar's backends and
target sections, the runtime module that loads or inspects the artifact in verify and bench, what `mobilebuild
check` runs for the target, the report's structure column and the package versions that key its nodes. Adding a
target means one `register(Route(...))` and, at most, one stage module (with its contract, `plan.stages`) and one
runtime module. No torch here.
"""

from collections.abc import Callable
from dataclasses import dataclass

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan.registry import Registry

DEVICE_ONLY = "runs only on {where}; the host checks that the artifact loads and records its structure"
RUNTIMES_PACKAGE = "mobilebuild.worker.runtimes"
CHECKS = "mobilebuild.preflight.targets:TargetCheck"


@dataclass(frozen=True)
class Route:
    backend: str
    runtime: str
    precisions: tuple  # the first is the default
    stages: tuple  # the stages from the fused model to the shipped artifact, the last one writing it
    suffix: str
    summary: str
    # How int8 is made: "eager" = the quantize stage with this engine's qconfig, before `stages`;
    # "final" = the final stage quantizes itself from the recipe's calibration data (pt2e, onnxruntime).
    quantizer: str | None = None
    engine: str | None = None
    delegate: str | None = None  # ExecuTorch's partitioner
    loader: str | None = None  # the runtime's name in results, and its module's under mobilebuild.worker.runtimes
    runtime_module: str | None = None  # a runtime module elsewhere (one that comes with its route)
    device_only: str | None = None  # where it runs, when the host cannot run it
    fixed_shapes: str | None = None  # why its artifacts take the example's sizes only (no dynamic dims)
    int8_fixed_shapes: str | None = None  # the same, for its static (calibrated) int8 artifacts only
    settings: str | None = None  # the target's own section of settings for this route (`nnapi:`, `onnx:`...)
    settings_schema: dict | None = None  # its JSON Schema, for a section the recipe schema does not declare
    # The target's precision when the route takes it from its own settings rather than `precision:` (NNAPI's mode).
    precision_of: Callable | None = None
    preflight: str | None = None  # "module:function" that `mobilebuild check` runs for the target
    structure: Callable | None = None  # verify's host facts about the artifact -> one line for the report
    distributions: tuple = ()  # the packages besides torch whose versions shape the artifact
    # quantize.observer's choices for its int8 artifacts, its default first (empty: it takes no observer setting)
    observers: tuple = ()
    # quantize.mode's choices where the final stage quantizes (quantizer "final"): static (calibrated) and, where its
    # stage has it, dynamic (weights int8 ahead of time, activations quantized at run time; no calibration)
    final_modes: tuple = ("static",)
    default: bool = False  # the backend's runtime when a target names none

    @property
    def key(self):
        return f"{self.backend}/{self.runtime}"

    @property
    def final_stage(self):
        return self.stages[-1]

    @property
    def runs_on_host(self):
        return self.device_only is None

    @property
    def host_reason(self):
        return DEVICE_ONLY.format(where=self.device_only) if self.device_only else None

    @property
    def runtime_module_path(self):
        return self.runtime_module or f"{RUNTIMES_PACKAGE}.{self.loader.replace('-', '_')}"

    def precision(self, target):
        if self.precision_of is not None:
            return self.precision_of(target)
        return target.precision or self.precisions[0]

    def tag(self, precision):
        engine = self.engine if precision == "int8" and self.quantizer == "eager" else None
        return f"{precision}-{engine}" if engine else precision


# --- the report's structure column: what the host read from the artifact (verify's "artifact" facts), which the
# report reads from files it does not trust: every level is checked to be what it should be.

def _mapping(value):
    return value if isinstance(value, dict) else {}


def _text(value):
    return "—" if value is None or value == "" else str(value)


def delegation_structure(facts):
    delegation = _mapping(facts.get("delegation"))
    if not delegation:
        return ""
    counts = _mapping(delegation.get("delegates")).items()
    delegates = ", ".join(f"{_text(count)} {name} call(s)" for name, count in counts)
    return f"{delegates or 'nothing delegated'}; {_text(delegation.get('fallback_calls'))} op(s) outside the delegate"


def nnapi_structure(facts):
    model = _mapping(facts.get("nnapi_model"))
    if not model:
        return ""
    return f"NNAPI model: {_text(model.get('operations'))} operations, {_text(model.get('operands'))} operands"


def onnx_structure(facts):
    if facts.get("quantized_nodes") is None:
        return ""
    return f"{_text(facts.get('quantized_nodes'))} of {_text(facts.get('nodes'))} nodes quantized"


def nnapi_precision(target):
    """The NNAPI blog's modes: only "none" keeps the float model."""
    return "fp32" if target.settings.get("nnapi", {}).get("mode", "none") == "none" else "int8"


_ROUTES = Registry("route")


def register(route):
    """Add a route (a project's dodo.py may add its own before importing mobilebuild.tasks)."""
    return _ROUTES.add(route.key, route)


def all_routes():
    return _ROUTES.all()


def backends():
    return tuple(dict.fromkeys(route.backend for route in _ROUTES.all()))


def runtimes():
    return tuple(dict.fromkeys(route.runtime for route in _ROUTES.all()))


def get(backend, runtime):
    return _ROUTES.get(f"{backend}/{runtime}")


def default_runtime(backend):
    candidates = [route for route in _ROUTES.all() if route.backend == backend]
    chosen = next((route for route in candidates if route.default), candidates[0] if candidates else None)
    return chosen.runtime if chosen else None


def final_stages():
    """The stages that write a shipped artifact: what verify and bench may take."""
    return tuple(dict.fromkeys(route.final_stage for route in _ROUTES.all()))


def distributions():
    """Every package whose version can change an artifact's bytes, in registration order."""
    return tuple(dict.fromkeys(("torch", "torchvision", *(d for r in _ROUTES.all() for d in r.distributions))))


def route_for(target, recipe_file):
    """The route a recipe target takes, or a clear error for a combination this version cannot build."""
    runtime = target.runtime or default_runtime(target.backend)
    found = get(target.backend, runtime)
    where = f"targets[{target.index}]"
    if found is None:
        buildable = ", ".join(f"{r.backend} ({r.runtime})" for r in _ROUTES.all())
        raise MobileBuildError(
            f"backend {target.backend!r} with runtime {runtime!r} is not buildable by this version of mobilebuild "
            f"(buildable: {buildable})", file=recipe_file, field=where)
    if target.precision and found.precision_of is not None and target.precision != found.precision(target):
        raise MobileBuildError(f"{found.backend.upper()} takes its precision from {found.settings}.mode "
                               f"({target.settings[found.settings]['mode']!r} is {found.precision(target)}); leave "
                               "precision out", file=recipe_file, field=f"{where}.precision")
    if target.precision not in (None, *found.precisions):
        raise MobileBuildError(
            f"precision {target.precision!r} is not available for {found.backend} ({found.runtime}); expected one "
            f"of {', '.join(found.precisions)}", file=recipe_file, field=f"{where}.precision")
    return found


TORCHSCRIPT = ("script", "optimize")
# ExecuTorch 1.3.1's export recipe quantizes a graph it captures without dynamic shapes (QuantizeStage); dynamic
# int8 is quantized by the lower stage itself on a graph captured with them, and keeps them
ET_INT8_FIXED = "ExecuTorch's int8 export recipe captures the model at the example's sizes"
EXECUTORCH = ("executorch", "torchao", "coremltools")
ONNX = ("onnx", "onnxscript", "onnxruntime")
# Activation observers (quantize.observer), each route's default first: torch.ao's (eager and FX graph mode) and
# torchao's (PT2E) HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver; onnxruntime's CalibrationMethod
# MinMax (moving_average: with CalibMovingAverage) and Percentile. Not its Entropy: quantize_static gives it 128
# histogram bins for 128 quantized bins, which leaves one candidate range, MinMax's (identical scales, measured);
# nor Distribution, which it computes for float8 types (0.6 dB where MinMax gave 4.7 on an int8 model)
TORCH_OBSERVERS = ("histogram", "minmax", "moving_average")
ORT_OBSERVERS = ("minmax", "moving_average", "percentile")
# ExecuTorch's XNNPackRecipeType.PT2E_INT8_DYNAMIC_PER_CHANNEL; onnxruntime's quantize_dynamic
FINAL_MODES = ("static", "dynamic")

for _route in (
    Route("xnnpack", "pytorch-mobile", ("fp32",), TORCHSCRIPT, ".ptl",
          "fp32 CPU through XNNPACK prepacked kernels, TorchScript lite interpreter", loader="pytorch-mobile",
          default=True, preflight=f"{CHECKS}.pytorch_mobile"),
    Route("qnnpack", "pytorch-mobile", ("int8",), TORCHSCRIPT, ".ptl",
          "int8 CPU through QNNPACK, eager post-training quantization, TorchScript lite interpreter",
          quantizer="eager", engine="qnnpack", loader="pytorch-mobile", default=True,
          preflight=f"{CHECKS}.pytorch_mobile", observers=TORCH_OBSERVERS),
    Route("vulkan", "pytorch-mobile", ("fp32",), TORCHSCRIPT, ".ptl",
          "GPU through Vulkan, optimize_for_mobile(backend='vulkan'); needs a torch built with USE_VULKAN=1 "
          "(a `toolchain:` interpreter)", loader="pytorch-mobile", device_only="an Android GPU with Vulkan",
          default=True, preflight=f"{CHECKS}.pytorch_mobile"),
    Route("metal", "pytorch-mobile", ("fp32",), TORCHSCRIPT, ".ptl",
          "Apple GPU through Metal, optimize_for_mobile(backend='metal'); needs a torch built with the Metal export "
          "ops (a `toolchain:` interpreter)", loader="pytorch-mobile", device_only="an iPhone or iPad GPU (Metal)",
          default=True, preflight=f"{CHECKS}.pytorch_mobile"),
    Route("nnapi", "pytorch-mobile", ("fp32", "int8"), ("nnapi",), ".ptl",
          "Android NNAPI (accelerators) through torch.backends._nnapi, traced NHWC, lite interpreter",
          quantizer="eager", engine="qnnpack", loader="nnapi", device_only="an Android 8.1+ device with NNAPI",
          settings="nnapi", precision_of=nnapi_precision, default=True, preflight=f"{CHECKS}.nnapi",
          structure=nnapi_structure, fixed_shapes="the NNAPI converter takes the example's sizes",
          observers=TORCH_OBSERVERS),
    Route("xnnpack", "executorch", ("fp32", "int8"), ("lower",), ".pte",
          "CPU through ExecuTorch's XNNPACK delegate (int8: pt2e XNNPACKQuantizer)",
          quantizer="final", delegate="xnnpack", loader="executorch", settings="executorch",
          preflight=f"{CHECKS}.executorch", structure=delegation_structure, distributions=EXECUTORCH,
          int8_fixed_shapes=ET_INT8_FIXED, observers=TORCH_OBSERVERS, final_modes=FINAL_MODES),
    Route("vulkan", "executorch", ("fp32",), ("lower",), ".pte",
          "GPU through ExecuTorch's Vulkan delegate", delegate="vulkan", loader="executorch",
          device_only="a device with a Vulkan GPU and ExecuTorch's Vulkan runtime", settings="executorch",
          preflight=f"{CHECKS}.executorch", structure=delegation_structure, distributions=EXECUTORCH),
    Route("metal", "executorch", ("fp32",), ("lower",), ".pte",
          "Apple GPU / Neural Engine through ExecuTorch's Core ML delegate (or MPS)", delegate="coreml",
          loader="executorch", device_only="an Apple device (Core ML / MPS)", settings="executorch",
          preflight=f"{CHECKS}.executorch", structure=delegation_structure, distributions=EXECUTORCH),
    Route("onnx", "onnxruntime", ("fp32", "int8"), ("export",), ".onnx",
          "ONNX, run by ONNX Runtime (int8: static QDQ or dynamic quantization with onnxruntime's tools)",
          quantizer="final", loader="onnxruntime", settings="onnx", default=True, preflight=f"{CHECKS}.onnx",
          structure=onnx_structure, distributions=ONNX, observers=ORT_OBSERVERS, final_modes=FINAL_MODES),
):
    register(_route)
