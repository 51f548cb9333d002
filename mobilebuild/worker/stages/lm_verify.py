"""lm_verify: a language model artifact against the eager model, token by token, on held-out prompts.

For each prompt length and prompt: the logits' SQNR at the prefill's last position, then at each decode step with
both fed the artifact's own greedy tokens (so every step compares the same context); greedy agreement, the share of
new tokens identical to the eager model's own greedy continuation up to the first divergence; and the perplexity of
held-out text in windows of the KV cache's length, eager and artifact. Each is judged against the thresholds of its
precision (plan/generation.py).
"""

import json
import math

import torch

from mobilebuild import store
from mobilebuild.worker import lm, quiet, runtimes
from mobilebuild.worker.metrics import failures, json_safe, relaxed

NEVER_DIVERGED = None
# An eager perplexity of at least this share of the vocabulary's size: an untrained reference (random weights), whose
# nearly flat logits any rounding reorders; a quantized artifact's failure against it is named as such
UNTRAINED_SHARE = 0.5


def sqnr_db(reference, found):
    noise = (reference - found).double().pow(2).mean()
    signal = reference.double().pow(2).mean()
    return None if noise == 0 else float(10 * torch.log10(signal / noise))  # None: identical


def compare_prompt(artifact, eager, prompt, new_tokens):
    """{sqnr_prefill_db, sqnr_decode_db (the lowest step), agreement, first_divergence} of one prompt."""
    reference_first, reference_tokens = lm.greedy(eager, prompt, new_tokens)
    found_first, found_tokens = lm.greedy(artifact, prompt, new_tokens)
    decode = []
    position = prompt.shape[1]
    eager.forward(prompt, 0)  # the eager cache again, then the artifact's own tokens through both
    artifact.forward(prompt, 0)
    for token in found_tokens[:-1]:
        step = torch.tensor([[token]])
        decode.append(sqnr_db(eager.forward(step, position)[0, -1], artifact.forward(step, position)[0, -1]))
        position += 1
    diverged = next((index for index, (a, b) in enumerate(zip(reference_tokens, found_tokens)) if a != b),
                    NEVER_DIVERGED)
    return {"sqnr_prefill_db": sqnr_db(reference_first, found_first),
            "sqnr_decode_db": _lowest(decode),
            "agreement": (new_tokens if diverged is None else diverged) / new_tokens,
            "first_divergence": diverged}


def perplexity(generator, tokens, window):
    """exp(mean negative log-likelihood) of `tokens`, in windows of `window` tokens, each its own sequence (a
    generator that returns the last position's logits only is fed a token at a time)."""
    total, count = 0.0, 0
    for start in range(0, len(tokens) - 1, window):
        piece = tokens[start:start + window + 1]
        if len(piece) < 2:
            break
        if getattr(generator, "all_positions", True):
            logits = generator.forward(piece[:-1].view(1, -1), 0)[0].double()
        else:
            logits = torch.cat([generator.forward(piece[index:index + 1].view(1, 1), index)[0]
                                for index in range(len(piece) - 1)]).double()
        total += float(torch.nn.functional.cross_entropy(logits, piece[1:], reduction="sum"))
        count += len(piece) - 1
    return math.exp(total / count)


def run(inputs, config, output):
    with quiet.native_stderr(once=True), torch.no_grad():
        eager = runtimes.load_generator(inputs["checkpoint"], config, eager=True)
        artifact = runtimes.load_generator(inputs["artifact"], config)
        tokens = lm.heldout_tokens(config, lm.vocab_size(eager.model), inputs.get("tokenizer"))
        per_length = {}
        for length in config.prompt_lengths:
            found = [compare_prompt(artifact, eager, prompt, config.new_tokens)
                     for prompt in lm.prompts(tokens, length, config.prompts)]
            per_length[str(length)] = {
                "prompts": len(found), "sqnr_prefill_db": _lowest(f["sqnr_prefill_db"] for f in found),
                "sqnr_decode_db": _lowest(f["sqnr_decode_db"] for f in found),
                "agreement": sum(f["agreement"] for f in found) / len(found),
                "first_divergence": [f["first_divergence"] for f in found]}
        window = config.max_context - 1
        text = tokens[:max(window * 4, window + 1)]
        ppl_eager, ppl_artifact = perplexity(eager, text, window), perplexity(artifact, text, window)
    lowest = min(((values[key], f"{key.removeprefix('sqnr_').removesuffix('_db')}, prompt length {length}")
                  for length, values in per_length.items() for key in ("sqnr_prefill_db", "sqnr_decode_db")
                  if values[key] is not None), default=(None, None))
    found = {"sqnr_db": lowest[0],
             "agreement": min(values["agreement"] for values in per_length.values()),
             "perplexity_eager": ppl_eager, "perplexity_artifact": ppl_artifact,
             "perplexity_ratio": ppl_artifact / ppl_eager, "perplexity_tokens": len(text) - 1}
    missed = [f"{line} (at the {lowest[1]})" if line.startswith("sqnr") else line
              for line in failures(found, config.thresholds)]
    vocab = lm.vocab_size(eager.model)
    untrained = ppl_eager >= UNTRAINED_SHARE * vocab
    missed += untrained_note(missed, untrained, config.precision, ppl_eager, vocab)
    result = {"artifact_sha256": store.sha256_file(inputs["artifact"]), "precision": config.precision,
              "status": "failed" if missed else "passed", "failures": missed, "thresholds": config.thresholds,
              "relaxed": relaxed(config.thresholds, config.default_thresholds), "generation": True,
              "data": "held-out text" if config.text else "random token ids", "untrained_reference": untrained,
              "samples": sum(values["prompts"] for values in per_length.values()),
              "metrics": json_safe(found), "sqnr_at": lowest[1], "prompt_lengths": per_length}
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True, allow_nan=False)
    print(f"   {result['status']}: logits SQNR {_short(found['sqnr_db'])} dB (lowest, at the {lowest[1]}), greedy "
          f"agreement {found['agreement']:.3f}, perplexity {ppl_eager:.3f} eager -> {ppl_artifact:.3f}"
          + "".join(f"\n   {line}" for line in missed))


def _lowest(values):
    """The lowest SQNR; None where every one was identical (no noise) or there was none."""
    return min((value for value in values if value is not None), default=None)


def _short(value):
    return "n/a" if value is None else f"{value:.4g}"


def untrained_note(missed, untrained, precision, ppl_eager, vocab):
    """[the line naming an untrained reference] where a quantized artifact missed a threshold against one; an fp32
    artifact rounds nothing, so its failure is its own (the LM zoo's Gemma 3 ONNX export, -2.2 dB, was first
    blamed on the reference)."""
    if not (missed and untrained) or precision == "fp32":
        return []
    return [f"the eager model's perplexity ({ppl_eager:.0f}) is about its vocabulary's size ({vocab}): an untrained "
            "reference (random weights), whose flat logits any rounding reorders"]
