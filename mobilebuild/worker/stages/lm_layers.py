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

A deep model (more than BLOCKS_FIRST decoder blocks: a 135M-parameter Llama has 30 of 7 linear layers each) is
ranked block by block first, each block's layers quantized together, then layer by layer in its WORST_BLOCKS worst
blocks and outside the blocks (the embedding, lm_head): about blocks + 2 x 7 + 2 comparisons instead of blocks x 7
+ 2, near linear in depth. Progress is a line every PROGRESS_SECONDS.
"""

import importlib
import re
import tempfile
import time

import torch

from mobilebuild.worker import lm, progress, quiet
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
            compare = Comparisons(quantizer, batches, reference)
            candidates = quantizer.layers
            blocks = decoder_blocks(quantizer.layers)
            if len(blocks) > BLOCKS_FIRST:
                ranked_blocks, _ = compare([(block, "decoder block", names) for block, names in blocks.items()])
                worst = {block["name"] for block in ranked_blocks[:WORST_BLOCKS]}
                candidates = [(name, op) for name, op in quantizer.layers if block_of(name) in (None, *worst)]
                result.update(blocks=ranked_blocks, blocks_ranked_first=f"layers of the {WORST_BLOCKS} worst of "
                              f"{len(blocks)} decoder blocks and outside them")
            ranked, uncompared = compare([(name, op, (name,)) for name, op in candidates])
            whole = quantizer.logits(batches, tuple(name for name, _ in quantizer.layers))
        result.update(layers=ranked[:config.top], compared=len(candidates), method=module.METHOD,
                      method_detail=module.DETAIL, data="held-out text" if config.text else "random token ids",
                      samples=sum(len(batch) for batch in batches),
                      all_quantized_sqnr_db=lm_verify.sqnr_db(_flat(reference), _flat(whole)))
        if uncompared:
            result["not_compared"] = uncompared
    except Exception as exc:  # a diagnosis, not a verdict: what it cannot do is said, and the build goes on
        result["error"] = layers.failure(exc)
    layers.write(result, started, output)


BLOCKS_FIRST = 8
WORST_BLOCKS = 2
PROGRESS_SECONDS = 30
BLOCK = re.compile(r"^(.*\.layers\.\d+)\.")  # a decoder block's module path (transformers': model.layers.<i>)


def block_of(name):
    """The decoder block `name` (a module path) is in, or None."""
    found = BLOCK.match(name)
    return found.group(1) if found else None


def decoder_blocks(layers):
    """{decoder block path: its layers' module paths}, in the model's order."""
    found = {}
    for name, _ in layers:
        if block := block_of(name):
            found.setdefault(block, []).append(name)
    return found


class Comparisons:
    """Each of a list of (name, op, module paths quantized together) against the float reference, with a progress
    line every PROGRESS_SECONDS: (ranked worst first, not comparable) as Errors.results gives them."""

    def __init__(self, quantizer, batches, reference):
        self.quantizer, self.batches, self.reference = quantizer, batches, reference

    def __call__(self, items):
        errors, shown = Errors(), time.perf_counter()
        for index, (name, op, quantized) in enumerate(items, 1):
            for expected, found in zip(self.reference, self.quantizer.logits(self.batches, quantized)):
                errors.add(name, op, expected, found)
            if time.perf_counter() - shown > PROGRESS_SECONDS and index < len(items):
                progress.note(f"{index} of {len(items)} {'blocks' if len(quantized) > 1 else 'layers'} compared")
                shown = time.perf_counter()
        return errors.results()


def _flat(logits):
    return torch.cat([values.flatten() for values in logits])
