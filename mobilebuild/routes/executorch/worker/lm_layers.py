"""lm_torchao: an ExecuTorch language model target's linear layers quantized one at a time by ExecuTorch's own
torchao transform (torchao_linears.quantize_linears: 8da4w, 8da8w), run eagerly (worker/stages/lm_layers.py's
hook). torchao's eager kernels compute what XNNPACK's do from the same int8 and int4 values; the rounding of their
arithmetic may differ slightly."""

import copy

from mobilebuild.routes.executorch.worker import torchao_linears

METHOD = "lm_torchao"  # its name in results and the report (Checks.layer_methods)
DETAIL = ("each linear layer alone quantized by ExecuTorch's torchao transform (as lm_lower quantizes), the eager "
          "model's logits at every position of the prefill against the float model's")


class Quantizer:
    def __init__(self, model, config, scratch):
        self.model, self.config = model, config
        self.linears = torchao_linears.linear_layers(model)
        kept = torchao_linears.kept_float(model, config.exclude, config.precision)
        self.layers = [(name, "Linear") for name in self.linears if name not in kept]

    def logits(self, batches, quantized):
        saved = {name: copy.deepcopy(self.model.get_submodule(name)) for name in quantized}
        torchao_linears.quantize_linears(self.model, self.config.precision, self.config.group_size,
                            keep_float=set(self.linears) - set(quantized))
        try:
            return [self.model(input_ids=batch, use_cache=False).logits.float() for batch in batches]
        finally:  # the float layers back: quantize_ replaced their weights in place
            for name, module in saved.items():
                parent, _, leaf = name.rpartition(".")
                setattr(self.model.get_submodule(parent) if parent else self.model, leaf, module)
