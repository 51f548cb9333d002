"""The registry of targets: for each backend x runtime, the stage chain that makes it and what the host can do.

Adding a target means one entry here and, at most, one stage module. No torch here.
"""

from dataclasses import dataclass

from mobilebuild.errors import MobileBuildError


@dataclass(frozen=True)
class Route:
    backend: str
    runtime: str
    precision: str  # "fp32" or "int8"
    engine: str | None  # the quantized engine whose qconfig and kernels an int8 route uses
    final_stage: str  # the stage that turns the scripted model into the shipped artifact
    suffix: str
    runs_on_host: bool
    summary: str

    @property
    def precision_tag(self):
        return self.precision if self.engine is None else f"{self.precision}-{self.engine}"


ROUTES = {
    ("xnnpack", "pytorch-mobile"): Route(
        "xnnpack", "pytorch-mobile", "fp32", None, "optimize", ".ptl", True,
        "fp32 CPU through XNNPACK prepacked kernels, TorchScript lite interpreter"),
    ("qnnpack", "pytorch-mobile"): Route(
        "qnnpack", "pytorch-mobile", "int8", "qnnpack", "optimize", ".ptl", True,
        "int8 CPU through QNNPACK, eager post-training quantization, TorchScript lite interpreter"),
}

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
    found = ROUTES.get((target.backend, runtime))
    if found is None:
        buildable = ", ".join(f"{backend} ({rt})" for backend, rt in ROUTES)
        raise MobileBuildError(
            f"backend {target.backend!r} with runtime {runtime!r} is not buildable by this version of mobilebuild "
            f"(buildable: {buildable})",
            file=recipe_file, field=f"targets[{target.index}]")
    return found
