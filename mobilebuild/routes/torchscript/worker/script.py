"""script: the eager model as TorchScript (the performance recipe, step 3), by scripting or tracing; with
`memory_format: channels_last` the model converts that input itself (the performance recipe, step 4)."""

import io
import json
import warnings
import zipfile

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.worker import metrics, outputs, quiet
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


# What a TorchScript file made here says of itself (an extra file in its archive, carried into the .ptl): how it was
# made, when that is not what the recipe asked.
RECORD = "mobilebuild.json"
# A traced fallback stands in for the scripted model only where it gives the eager model's numbers: the same
# kernels run, so anything short of exact (float rounding aside) is a traced branch or size.
FALLBACK_SQNR_DB = 80.0


def saved(model, mode, specs, made=None):
    """(the TorchScript file's bytes, its record or None: `made` ({"int8": quantize.made_otherwise's}, where its int8
    was not made as the recipe asked), and the traced fallback's facts). Where `script` fails, in compiling or saving
    (timm's MobileViTv2: "Could not export Python function call"; every transformers model), the traced model
    instead, when it matches the eager model at every size verification checks (the dynamic dims' smallest and
    largest too: a trace may have recorded the example's sizes)."""
    held = outputs.held_objects(model, modeling.example_inputs(specs))
    if held:
        raise MobileBuildError(f"the model returns {held}: TorchScript returns only tensors, tuples, lists and dicts, "
                               f"so neither torch.jit.script nor torch.jit.trace can: {outputs.object_advice(held)}",
                               field="script")
    if mode != "script":
        return _bytes(to_torchscript(model, mode, modeling.example_inputs(specs)), made), made
    saving = None  # torch.jit.save's own failure, once the model compiled: the library's, with its traceback
    try:
        # the compiler's notes on the model's annotations (timm's FX-quantized models: "instance-level annotations
        # on empty non-base types"): it compiles, or the fallback below says why not
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            scripted = torch.jit.script(model)
    except Exception as exc:  # the TorchScript compiler raises many types
        why = f"torch.jit.script failed ({modeling.first_line(exc)})"
    else:
        try:
            return _bytes(scripted, made), made
        except Exception as exc:  # the serializer too
            why, saving = f"torch.jit.script failed ({modeling.first_line(exc)})", exc
    try:
        with warnings.catch_warnings():  # what they warn of (a size or branch recorded) is checked below
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            traced = _traced(model, specs, why)
        checked = {size: _traced_sqnr(model, traced, specs, size, why) for size in modeling.sizes(specs)}
    except MobileBuildError as exc:
        if saving is None:
            raise
        # a model that compiles but does not save: what failed is the library's (its line and a log of its
        # traceback, worker/failures.py); the fallback's verdict goes beside it
        print(f"   note: its traced fallback cannot stand in: {exc.message}")
        raise saving from None
    record = {**(made or {}), "made_by": "torch.jit.trace", "asked": "torch.jit.script", "why": why,
              "checked_sqnr_db": checked}
    print(f"   note: {why}: traced instead, as the eager model at the "
          + ", ".join(f"{size} ({db:.1f} dB)" for size, db in checked.items()) + " sizes")
    return _bytes(traced, record), record


def _traced(model, specs, why):
    try:
        return to_torchscript(model, "trace", modeling.example_inputs(specs))
    except MobileBuildError as exc:
        raise MobileBuildError(f"{why}, and so did tracing, its fallback: {exc.message}", field="script") from None


def _traced_sqnr(model, traced, specs, size, why):
    """The traced model's lowest SQNR against the eager one at `size`; one line where it cannot stand in."""
    examples = modeling.example_inputs(specs, seed=1, size=size)
    with torch.no_grad():
        expected = outputs.leaves(model(*examples))
        try:
            found = outputs.leaves(traced(*examples))
        except Exception as exc:  # the traced graph's own shapes, asserted as it runs
            found, shown = None, modeling.first_line(exc)
    if found is not None:
        sqnr = min((metrics.sqnr_db(want, got) for (_, want), (_, got) in zip(expected, found)), default=0.0)
        if len(found) == len(expected) and sqnr >= FALLBACK_SQNR_DB:
            return min(sqnr, metrics.SQNR_CEILING_DB)
        shown = f"{sqnr:.1f} dB against the eager model" if len(found) == len(expected) else \
            f"{len(found)} output tensor(s), the eager model {len(expected)}"
    if size == "example":  # on another input than it was traced with: `script: trace` would not do either
        raise MobileBuildError(f"{why}; its fallback, the traced model, is not the eager model ({shown}: the trace "
                               "kept a branch or a value of the input it ran on): fix what scripting reports",
                               field="script")
    raise MobileBuildError(f"{why}; its fallback, the traced model, is not the eager model at the {size} sizes "
                           f"({shown}): fix what scripting reports, or set `script: trace`, which builds for the "
                           "example's sizes only", field="script")


def _bytes(scripted, record=None):
    """torch.jit.save's bytes, where scripting's last failures come (a Python function it cannot export)."""
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer, _extra_files={RECORD: json.dumps(record)} if record else {})
    return buffer.getvalue()


def run(inputs, config, output):
    """The fused or quantized model (both rebuilt from the recipe, read weights-only) as TorchScript."""
    if config.engine:
        torch.backends.quantized.engine = config.engine
    made = None
    if "quantized" in inputs:
        saved_state = modeling.load_weights_only(inputs["quantized"], field=None)  # read once, for both
        model = quantize.load_quantized(inputs, config, saved_state)
        made = quantize.made_otherwise(saved_state)
    else:
        model = fuse.load(inputs["model"], config)
    if any(spec["memory_format"] == "channels_last" for spec in config.inputs):
        model = channels_last_inputs(model, config.inputs, config.mode)
    with quiet.native_stderr(once=True):  # tracing runs the model: its kernels' C++ warnings, each shown once
        data, _ = saved(model, config.mode, config.inputs, made and {"int8": made})
    with open(output, "wb") as handle:  # a failed write (full disk) raises OSError here; by path, torch aborts
        handle.write(data)


def record_of(path):
    """The record a TorchScript or .ptl file made here carries (saved), or None: read from its archive, without
    loading the model."""
    with zipfile.ZipFile(path) as archive:
        name = next((name for name in archive.namelist() if name.endswith(f"/extra/{RECORD}")), None)
        return json.loads(archive.read(name)) if name is not None else None


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
