"""The registry of targets: for each backend x runtime, the stage chain that makes it and what the host can do.

Adding a target means one entry here and, at most, one stage module. No torch here.
"""

from dataclasses import dataclass

from mobilebuild.errors import MobileBuildError

DEVICE_ONLY = "runs only on {where}; the host checks that the artifact loads and records its structure"


@dataclass(frozen=True)
class Route:
    backend: str
    runtime: str
    precisions: tuple  # the first is the default
    final_stage: str  # the stage that writes the shipped artifact
    suffix: str
    summary: str
    # How int8 is made: "eager" = the quantize stage with this engine's qconfig, before the final stage;
    # "final" = the final stage quantizes itself from the recipe's calibration data (pt2e, onnxruntime).
    quantizer: str | None = None
    engine: str | None = None
    delegate: str | None = None  # ExecuTorch's partitioner
    loader: str | None = None  # the runtime module (runtimes/) that loads or inspects the artifact
    device_only: str | None = None  # where it runs, when the host cannot run it

    @property
    def runs_on_host(self):
        return self.device_only is None

    @property
    def host_reason(self):
        return DEVICE_ONLY.format(where=self.device_only) if self.device_only else None

    @property
    def through_torchscript(self):
        return self.final_stage == "optimize"

    def precision(self, target):
        if self.final_stage == "nnapi":  # the NNAPI blog's modes: only "none" keeps the float model
            return "fp32" if target.nnapi.get("mode", "none") == "none" else "int8"
        return target.precision or self.precisions[0]

    def tag(self, precision):
        engine = self.engine if precision == "int8" and self.quantizer == "eager" else None
        return f"{precision}-{engine}" if engine else precision


ROUTES = {route.backend + "/" + route.runtime: route for route in (
    Route("xnnpack", "pytorch-mobile", ("fp32",), "optimize", ".ptl",
          "fp32 CPU through XNNPACK prepacked kernels, TorchScript lite interpreter", loader="pytorch-mobile"),
    Route("qnnpack", "pytorch-mobile", ("int8",), "optimize", ".ptl",
          "int8 CPU through QNNPACK, eager post-training quantization, TorchScript lite interpreter",
          quantizer="eager", engine="qnnpack", loader="pytorch-mobile"),
    Route("vulkan", "pytorch-mobile", ("fp32",), "optimize", ".ptl",
          "GPU through Vulkan, optimize_for_mobile(backend='vulkan'); needs a torch built with USE_VULKAN=1 "
          "(a `toolchain:` interpreter)", loader="pytorch-mobile", device_only="an Android GPU with Vulkan"),
    Route("metal", "pytorch-mobile", ("fp32",), "optimize", ".ptl",
          "Apple GPU through Metal, optimize_for_mobile(backend='metal'); needs a torch built with the Metal export "
          "ops (a `toolchain:` interpreter)", loader="pytorch-mobile", device_only="an iPhone or iPad GPU (Metal)"),
    Route("nnapi", "pytorch-mobile", ("fp32", "int8"), "nnapi", ".ptl",
          "Android NNAPI (accelerators) through torch.backends._nnapi, traced NHWC, lite interpreter",
          quantizer="eager", engine="qnnpack", loader="nnapi", device_only="an Android 8.1+ device with NNAPI"),
    Route("xnnpack", "executorch", ("fp32", "int8"), "lower", ".pte",
          "CPU through ExecuTorch's XNNPACK delegate (int8: pt2e XNNPACKQuantizer)",
          quantizer="final", delegate="xnnpack", loader="executorch"),
    Route("vulkan", "executorch", ("fp32",), "lower", ".pte",
          "GPU through ExecuTorch's Vulkan delegate", delegate="vulkan", loader="executorch",
          device_only="a device with a Vulkan GPU and ExecuTorch's Vulkan runtime"),
    Route("metal", "executorch", ("fp32",), "lower", ".pte",
          "Apple GPU / Neural Engine through ExecuTorch's Core ML delegate (or MPS)", delegate="coreml",
          loader="executorch", device_only="an Apple device (Core ML / MPS)"),
    Route("onnx", "onnxruntime", ("fp32", "int8"), "export", ".onnx",
          "ONNX, run by ONNX Runtime (int8: static QDQ quantization with onnxruntime's tools)",
          quantizer="final", loader="onnxruntime"),
)}

DEFAULT_RUNTIME = {
    "xnnpack": "pytorch-mobile",
    "qnnpack": "pytorch-mobile",
    "vulkan": "pytorch-mobile",
    "metal": "pytorch-mobile",
    "nnapi": "pytorch-mobile",
    "onnx": "onnxruntime",
}


def route_for(target, recipe_file):
    """The route a recipe target takes, or a clear error for a combination this version cannot build."""
    runtime = target.runtime or DEFAULT_RUNTIME[target.backend]
    found = ROUTES.get(f"{target.backend}/{runtime}")
    where = f"targets[{target.index}]"
    if found is None:
        buildable = ", ".join(f"{r.backend} ({r.runtime})" for r in ROUTES.values())
        raise MobileBuildError(
            f"backend {target.backend!r} with runtime {runtime!r} is not buildable by this version of mobilebuild "
            f"(buildable: {buildable})", file=recipe_file, field=where)
    if target.precision and target.precision != found.precision(target):
        if found.final_stage == "nnapi":
            raise MobileBuildError(f"NNAPI takes its precision from nnapi.mode ({target.nnapi['mode']!r} is "
                                   f"{found.precision(target)}); leave precision out", file=recipe_file,
                                   field=f"{where}.precision")
    if target.precision not in (None, *found.precisions):
        raise MobileBuildError(
            f"precision {target.precision!r} is not available for {found.backend} ({found.runtime}); expected one "
            f"of {', '.join(found.precisions)}", file=recipe_file, field=f"{where}.precision")
    return found
