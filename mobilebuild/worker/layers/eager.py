"""eager: a model the quantize stage quantized in eager mode, against the fused float model. The quantize stage's
model is rebuilt as the script stage does (quantize.load_quantized), each quantized module shadowed by the fused float
module at the same path, both fed the same (dequantized) input: torch's eager numeric suite
(torch.ao.ns._numeric_suite.prepare_model_with_stubs, as compare_model_stub does). A model quantized in FX graph mode
is compared by fx.py."""

import torch
from torch.ao import quantization as tq
from torch.ao.nn.intrinsic import _FusedModule
from torch.ao.ns import _numeric_suite as ns

from mobilebuild.worker.layers import fx
from mobilebuild.worker.layers.common import Errors, dequantized
from mobilebuild.worker.stages import fuse, quantize

DETAIL = ("eager numeric suite (torch.ao.ns._numeric_suite shadow modules): each quantized module and its float "
          "module on the same input")


def compare(inputs, config, chunks):
    """The layers hook (see mobilebuild.worker.stages.layers): the quantize stage's model rebuilt, each quantized
    module shadowed by its float module; a model quantized in FX graph mode goes to the FX numeric suite (fx.py)."""
    quantized = quantize.load_quantized(inputs, config)
    if isinstance(quantized, torch.fx.GraphModule):
        return fx.compare_quantized(inputs, config, chunks, quantized)
    reference = fuse.load(inputs["model"], config).eval()
    if isinstance(quantized, tq.QuantWrapper):  # its stubs are identities on a float model
        reference = type(quantized)(reference).eval()
    swap = _swapped_types(reference, quantized)
    ns.prepare_model_with_stubs(reference, quantized, swap, _Shadow)
    shadows = {name: module for name, module in quantized.named_modules() if isinstance(module, ns.Shadow)}
    prefix = "module." if isinstance(quantized, tq.QuantWrapper) else ""
    errors = Errors()
    with torch.no_grad():
        for chunk in chunks:
            quantized(*chunk)
            for name, shadow in shadows.items():
                stats = shadow.logger.stats
                for output, expected in zip(stats["quantized"], stats["float"]):
                    output, expected = dequantized(output), dequantized(expected)
                    if output is not None and expected is not None:
                        errors.add(name.removeprefix(prefix) or name, type(shadow.shadow_module).__name__, expected,
                                   output)
                stats["quantized"], stats["float"] = [], []
    return errors, "eager", DETAIL


def _swapped_types(reference, quantized):
    """The float module types whose modules quantization replaced: layers (leaves, or fused modules), not the
    containers around them."""
    found = dict(reference.named_modules())
    swap = set()
    for name, module in quantized.named_modules():
        original = found.get(name)
        if (name and original is not None and type(original) is not type(module)
                and (not list(original.children()) or isinstance(original, _FusedModule))):
            swap.add(type(original))
    return swap


class _Shadow(ns.ShadowLogger):
    """The suite's ShadowLogger keeps one sample of a batch (`x[0]` when len(x) > 1): this one keeps them all."""

    def forward(self, x, y):
        self.stats["quantized"].append(x.detach() if isinstance(x, torch.Tensor) else x)
        self.stats["float"].append(y.detach() if isinstance(y, torch.Tensor) else y)
