"""lm_layers: which linear layers of a quantized language model cost it most. Each layer is quantized alone, as the
route quantizes the whole model, and the model's logits over every position of each held-out prompt's prefill are
compared with the float model's: a layer is charged with the error it adds by itself, whatever the others do. The
result lists the N layers with the lowest SQNR, worst first (the layers stage's format: the report's table of
worst layers, `mobilebuild tune`'s ranking), and the SQNR with every layer quantized.

Each route quantizes with its own tools, in its family's worker/lm_layers.py, named by `config.method`
(Generation.layers): ExecuTorch's torchao transform run eagerly, ONNX Runtime's quantizers on the exported step,
ai-edge-quantizer on LiteRT's decoder. The module's METHOD names it in results and the report, DETAIL says how it
compares, and its one class is the hook a new route implements:

    Quantizer(model, config, scratch)
      layers               [(module path, class name)]: what it ranks (quantize.exclude's layers left out)
      logits(batches, quantized) -> [float32 logits [prompts, T, vocab] per batch of prompts [prompts, T]]: the
                           prefill with only the layers at `quantized` (module paths) quantized; () the float
                           reference
"""

import importlib
import tempfile
import time

import torch

from mobilebuild.worker import lm, quiet
from mobilebuild.worker.layers.common import Errors
from mobilebuild.worker.stages import layers, lm_verify


def run(inputs, config, output):
    started = time.perf_counter()
    result = {"precision": config.precision, "layers": [], "compared": 0, "method": None}
    try:
        with quiet.native_stderr(once=True), torch.no_grad(), tempfile.TemporaryDirectory() as scratch:
            model = lm.causal_lm(config.model, inputs["checkpoint"])
            tokens = lm.heldout_tokens(config, lm.vocab_size(model), inputs.get("tokenizer"))
            # verification's prompts, those of a length as one batch [prompts, length]
            batches = [torch.cat(lm.prompts(tokens, length, config.prompts)) for length in config.prompt_lengths]
            module = importlib.import_module(config.method)
            quantizer = module.Quantizer(model, config, scratch)
            reference = quantizer.logits(batches, ())
            errors = Errors()
            for name, op in quantizer.layers:
                for expected, found in zip(reference, quantizer.logits(batches, (name,))):
                    errors.add(name, op, expected, found)
            whole = quantizer.logits(batches, tuple(name for name, _ in quantizer.layers))
        ranked, uncompared = errors.results()
        result.update(layers=ranked[:config.top], compared=len(errors.found), method=module.METHOD,
                      method_detail=module.DETAIL, data="held-out text" if config.text else "random token ids",
                      samples=sum(len(batch) for batch in batches),
                      all_quantized_sqnr_db=lm_verify.sqnr_db(_flat(reference), _flat(whole)))
        if uncompared:
            result["not_compared"] = uncompared
    except Exception as exc:  # a diagnosis, not a verdict: what it cannot do is said, and the build goes on
        result["error"] = layers.failure(exc)
    layers.write(result, started, output)


def _flat(logits):
    return torch.cat([values.flatten() for values in logits])
