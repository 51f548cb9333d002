"""script: the eager model as TorchScript (the performance recipe, step 3), by scripting or tracing; with
`memory_format: channels_last` the model converts its own input (the performance recipe, step 4)."""

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker.stages import fuse, modeling, quantize


class ChannelsLastInput(torch.nn.Module):
    """Converting here is free when the caller already passes NHWC, and every later op keeps the format."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x.contiguous(memory_format=torch.channels_last))


def to_torchscript(model, mode, examples):
    with torch.no_grad():
        if mode == "script":
            try:
                return torch.jit.script(model)
            except Exception as exc:  # the TorchScript compiler raises many types
                raise MobileBuildError(
                    f"torch.jit.script cannot compile the model ({modeling.first_line(exc)}); if forward only "
                    "uses Python the compiler does not support, set `script: trace`", field="script") from None
        try:
            return torch.jit.trace(model, examples, strict=False)  # dict outputs (segmentation): fixed structure
        except Exception as exc:
            raise MobileBuildError(
                f"torch.jit.trace failed ({modeling.first_line(exc)}); tracing records tensor operations only: for "
                "non-tensor outputs or data-dependent control flow, set `script: script`", field="script") from None


def run(inputs, config, output):
    """The fused or quantized model (both rebuilt from the recipe, read weights-only) as TorchScript."""
    if config.engine:
        torch.backends.quantized.engine = config.engine
    if "quantized" in inputs:
        model = quantize.load_quantized(inputs, config)
    else:
        model = fuse.load(inputs["model"], config)
    if config.inputs[0]["memory_format"] == "channels_last":  # a recipe with one input only
        model = ChannelsLastInput(model).eval()
    scripted = to_torchscript(model, config.mode, modeling.example_inputs(config.inputs))
    with open(output, "wb") as handle:  # a failed write (full disk) raises OSError here; by path, torch aborts
        torch.jit.save(scripted, handle)
