"""script: the eager model as TorchScript (the performance recipe, step 3), by scripting or tracing; with
`memory_format: channels_last` the model converts that input itself (the performance recipe, step 4)."""

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
    if any(spec["memory_format"] == "channels_last" for spec in config.inputs):
        model = channels_last_inputs(model, config.inputs, config.mode)
    scripted = to_torchscript(model, config.mode, modeling.example_inputs(config.inputs))
    with open(output, "wb") as handle:  # a failed write (full disk) raises OSError here; by path, torch aborts
        torch.jit.save(scripted, handle)


# Below the code above on purpose: a traced artifact records the lines of its callers (a one-input model's bytes
# stay as they were).

def channels_last_inputs(model, specs, mode):
    """The model converting each input the recipe marks channels_last (4-D, by the recipe's check) itself; the others
    pass as they come. One input: ChannelsLastInput, as always. Several: to trace, a module whose forward takes them
    all; to script, the scripted model inside a module whose forward is defined from a string naming each input, as
    TorchScript has no *args."""
    if len(specs) == 1:
        return ChannelsLastInput(model).eval()
    converted = tuple(index for index, spec in enumerate(specs) if spec["memory_format"] == "channels_last")
    if mode != "script":
        return ChannelsLastInputs(model, converted).eval()
    holder = InputsHolder(to_torchscript(model.eval(), "script", ()))
    names = modeling.parameter_names(specs)
    arguments = [f"{name}.contiguous(memory_format=torch.channels_last)" if index in converted else name
                 for index, name in enumerate(names)]
    scripted = torch.jit.script(holder.eval())
    scripted.define(f"def forward(self, {', '.join(f'{name}: Tensor' for name in names)}):\n"
                    f"    return self.model({', '.join(arguments)})\n")
    return scripted


class ChannelsLastInputs(torch.nn.Module):
    """ChannelsLastInput for several inputs, traced: the inputs at `converted` (their indices) become channels_last."""

    def __init__(self, model, converted):
        super().__init__()
        self.model = model
        self.converted = converted

    def forward(self, *inputs):
        return self.model(*(x.contiguous(memory_format=torch.channels_last) if index in self.converted else x
                            for index, x in enumerate(inputs)))


class InputsHolder(torch.nn.Module):
    """Holds a scripted model; its forward is defined from a string (channels_last_inputs)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
