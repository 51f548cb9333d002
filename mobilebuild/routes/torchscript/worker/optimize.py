"""optimize: optimize_for_mobile (CPU, or Vulkan / Metal where torch was built for them), optional bundled inputs,
saved for the lite interpreter (.ptl)."""

import json

import torch
import torch.utils.bundled_inputs
from torch.utils.mobile_optimizer import MobileOptimizerType, optimize_for_mobile

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.torchscript.worker import script
from mobilebuild.worker.stages import modeling


def has_batch_norm(scripted):
    return any(node.kind() == "aten::batch_norm" for node in scripted.inlined_graph.nodes())


def blocklist_for(options, script_mode, scripted):
    blocklist = {getattr(MobileOptimizerType, name) for name in options["blocklist"]}
    if script_mode == "trace" and has_batch_norm(scripted):
        # pytorch/pytorch#76807: on traced modules CONV_BN_FUSION drops the bias of Conv(bias=False)-BN. The fuse
        # stage folds batch norm after convolutions, so one left here is one it could not see: keep it unfolded.
        blocklist.add(MobileOptimizerType.CONV_BN_FUSION)
    return blocklist


# optimize_for_mobile's GPU backends rewrite the graph into ops that only special builds of torch register.
GPU_EXPORT_OPS = {"vulkan": ("vulkan_prepack", "create_conv2d_context", "USE_VULKAN=1"),
                  "metal": ("metal_prepack", "conv2d_prepack", "the Metal export ops (USE_PYTORCH_METAL_EXPORT=1)")}


def check_gpu_export(backend):
    """Fail before optimizing, with what to do, where torch would fail halfway with 'Unknown custom class type'."""
    namespace, op, build = GPU_EXPORT_OPS[backend]
    if not hasattr(getattr(torch.ops, namespace), op):
        raise MobileBuildError(
            f"optimize_for_mobile(backend={backend!r}) needs a torch built with {build}; this torch "
            f"{torch.__version__} (a stock wheel) has no {namespace}::{op}. Name such an interpreter with "
            f"`toolchain:` on this target, or use `runtime: executorch`, which lowers for {backend} on stock wheels",
            field="targets")


def bundled_input(spec):
    """A compact bundled input (the shape only; values drawn when the app inflates it): normal floats, or integers
    from the input's range (token ids must stay below the vocabulary)."""
    dtype = modeling.DTYPES[spec["dtype"]]
    if dtype.is_floating_point:
        return torch.utils.bundled_inputs.bundle_randn(*spec["shape"], dtype=dtype)
    low, high = (0, 2) if dtype == torch.bool else modeling.value_range(spec)
    stub = torch.zeros(1, dtype=dtype).expand(*spec["shape"])
    return torch.utils.bundled_inputs.InflatableArg(value=stub, fmt=f"torch.randint_like({{}}, {low}, {high})")


def optimize(scripted, options, script_mode, specs, backend="CPU"):
    blocklist = blocklist_for(options, script_mode, scripted)
    missing = [m for m in options["preserved_methods"] if not hasattr(scripted, m)]
    if missing:
        raise MobileBuildError(f"the scripted model has no method {', '.join(map(repr, missing))}",
                               field="optimize.preserved_methods")
    optimized = optimize_for_mobile(scripted, optimization_blocklist=blocklist,
                                    preserved_methods=list(options["preserved_methods"]), backend=backend)
    if options["bundled_inputs"]:
        # forward's parameters after the inputs take their defaults: a Transformer's masks None, RAFT's number of
        # flow updates 12
        unset = tuple(argument.default_value if argument.has_default_value() else None
                      for argument in optimized.forward.schema.arguments[1 + len(specs):])
        try:
            torch.utils.bundled_inputs.augment_model_with_bundled_inputs(
                optimized, [(*map(bundled_input, specs), *unset)])
        except RuntimeError as exc:
            raise MobileBuildError(f"the bundled input does not fit forward's parameters ({modeling.first_line(exc)})"
                                   "; set optimize.bundled_inputs: false", field="optimize.bundled_inputs") from None
    return optimized


def run(inputs, config, output):
    if config.engine:
        torch.backends.quantized.engine = config.engine
    backend = config.backend if config.backend in GPU_EXPORT_OPS else "CPU"
    if backend != "CPU":
        check_gpu_export(backend)
    carried = {script.RECORD: ""}
    scripted = torch.jit.load(inputs["scripted"], map_location="cpu", _extra_files=carried)
    record = json.loads(carried[script.RECORD]) if carried[script.RECORD] else None
    traced = record is not None and record.get("made_by") == "torch.jit.trace"  # the script stage fell back to it
    mode = "trace" if traced else config.script_mode
    optimized = optimize(scripted, config.options, mode, config.inputs, backend)
    data = optimized._save_to_buffer_for_lite_interpreter(_extra_files={script.RECORD: json.dumps(record)}
                                                          if record is not None else {})
    with open(output, "wb") as handle:  # a failed write (full disk) raises OSError here; by path, torch aborts
        handle.write(data)
