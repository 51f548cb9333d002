"""lm_litert: a LiteRT language model target's parts (each decoder layer's attention and feed-forward blocks, the
embedding, lm_head: what its quantizer can keep float, routes/litert/worker/lm_litert.py) quantized one at a time on the
float .tflite, every other part left float, and run by LiteRT's interpreter (worker/stages/lm_layers.py's hook)."""

import torch

from mobilebuild.routes.litert.worker import lm_litert, runtime

METHOD = "lm_litert"  # its name in results and the report (Checks.layer_methods)
DETAIL = ("each part of litert-torch's decoder alone quantized by ai-edge-quantizer with litert-torch's recipe (as "
          "lm_litert quantizes, every other part left float), the logits at every position of the prefill against "
          "the float .tflite's")


class Quantizer:
    def __init__(self, model, config, scratch):
        self.config = config
        self.float = lm_litert.float_tflite(model, config, scratch)
        self.kept = lm_litert.kept_float(model, config.exclude)
        kinds = {name: type(module).__name__ for name, module in model.named_modules()}
        # one entry per part the target quantizes: a tied lm_head is the embedding's weight
        self.parts = {}
        for name, patterns in lm_litert.parts(model).items():
            if not set(self.kept) & set(patterns) and patterns not in self.parts.values():
                self.parts[name] = patterns
        self.layers = [(name, kinds[name]) for name in self.parts]

    def logits(self, batches, quantized):
        data = self.float
        if quantized:
            data = lm_litert.quantized(self.float, self.config, self.kept + [
                pattern for name, patterns in self.parts.items() if name not in quantized for pattern in patterns])
        generator = runtime.generator(data, self.config)
        return [torch.cat([generator.forward(prompt.view(1, -1), 0) for prompt in batch]) for batch in batches]
