"""lm_onnx: an ONNX language model target's layers (linear layers and embeddings: what ONNX Runtime's quantizers
take) quantized one at a time on the exported step (lm_onnx.export_float), every other node excluded
(nodes_to_exclude), and run by ONNX Runtime (worker/stages/lm_layers.py's hook)."""

import os

import onnx
import torch

from mobilebuild.routes.onnx.worker import lm_onnx
from mobilebuild.routes.onnx.worker import runtime as ort_runtime

METHOD = "lm_onnx"  # its name in results and the report (Checks.layer_methods)
DETAIL = ("each layer's nodes alone quantized by onnxruntime (as lm_onnx quantizes, every other node excluded), the "
          "logits at every position of the prefill against the float ONNX model's")
KINDS = (torch.nn.Linear, torch.nn.Embedding)


class Quantizer:
    def __init__(self, model, config, scratch):
        self.config, self.scratch = config, scratch
        self.float = os.path.join(scratch, "float.onnx")
        lm_onnx.export_float(model, config.max_context, self.float)
        self.every = [node.name for node in onnx.load(self.float, load_external_data=False).graph.node]
        kept = set(lm_onnx.kept_float(model, self.float, config.exclude))
        self.nodes = {name: [node for node in lm_onnx.module_nodes(self.float, [name]) if node not in kept]
                      for name, module in model.named_modules() if isinstance(module, KINDS)}
        kinds = {name: type(module).__name__ for name, module in model.named_modules()}
        self.layers = [(name, kinds[name]) for name, nodes in self.nodes.items() if nodes]

    def logits(self, batches, quantized):
        path = self.float
        if quantized:
            chosen = {node for name in quantized for node in self.nodes[name]}
            path = os.path.join(self.scratch, "quantized.onnx")
            lm_onnx.quantized(self.float, path, self.config, [n for n in self.every if n not in chosen])
        generator = ort_runtime.generator(path, self.config)
        return [torch.cat([generator.forward(prompt.view(1, -1), 0) for prompt in batch]) for batch in batches]
