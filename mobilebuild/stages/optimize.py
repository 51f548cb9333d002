"""optimize: optimize_for_mobile, optional bundled inputs, saved for the lite interpreter (.ptl)."""

import torch
import torch.utils.bundled_inputs
from torch.utils.mobile_optimizer import MobileOptimizerType, optimize_for_mobile

from mobilebuild.errors import MobileBuildError
from mobilebuild.stages import modeling


def has_batch_norm(scripted):
    return any(node.kind() == "aten::batch_norm" for node in scripted.inlined_graph.nodes())


def blocklist_for(options, script_mode, scripted):
    blocklist = {getattr(MobileOptimizerType, name) for name in options["blocklist"]}
    if script_mode == "trace" and has_batch_norm(scripted):
        # pytorch/pytorch#76807: on traced modules CONV_BN_FUSION drops the bias of Conv(bias=False)-BN. The fuse
        # stage folds batch norm after convolutions, so one left here is one it could not see: keep it unfolded.
        blocklist.add(MobileOptimizerType.CONV_BN_FUSION)
    return blocklist


def optimize(scripted, options, script_mode, input_config):
    blocklist = blocklist_for(options, script_mode, scripted)
    missing = [m for m in options["preserved_methods"] if not hasattr(scripted, m)]
    if missing:
        raise MobileBuildError(f"the scripted model has no method {', '.join(map(repr, missing))}",
                               field="optimize.preserved_methods")
    optimized = optimize_for_mobile(scripted, optimization_blocklist=blocklist,
                                    preserved_methods=list(options["preserved_methods"]), backend="CPU")
    if options["bundled_inputs"]:
        bundled = torch.utils.bundled_inputs.bundle_randn(*input_config["shape"],
                                                          dtype=modeling.DTYPES[input_config["dtype"]])
        torch.utils.bundled_inputs.augment_model_with_bundled_inputs(optimized, [(bundled,)])
    return optimized


def run(inputs, config, output):
    if config["engine"]:
        torch.backends.quantized.engine = config["engine"]
    scripted = torch.jit.load(inputs["scripted"], map_location="cpu")
    optimized = optimize(scripted, config["options"], config["script_mode"], config["input"])
    data = optimized._save_to_buffer_for_lite_interpreter()
    with open(output, "wb") as handle:  # a failed write (full disk) raises OSError here; by path, torch aborts
        handle.write(data)
