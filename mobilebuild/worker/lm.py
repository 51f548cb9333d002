"""Decoder-only language models with a static KV cache (a recipe with `generate:`), as the LM stages share them:
the transformers causal LM from its checkpoint, its one-step module with the cache (transformers' own export
wrapper for ExecuTorch, the cache as inputs and outputs for ONNX), the held-out prompts, and what a runtime's
generator is.

A generator (each runtime module's `generator(path, config)`) runs a model a step at a time: `forward(tokens,
position)` takes token ids [1, T] written to the cache from `position` on and returns the logits [1, T, vocab] as a
float32 tensor; a step at position 0 starts a new sequence.
"""

from pathlib import Path

import torch

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import recipe
from mobilebuild.worker import hub, named_inputs, tokenizer
from mobilebuild.worker.stages import modeling


def causal_lm(source, checkpoint):
    """The recipe's causal LM with the checkpoint's weights, its own forward (not the build's binding by input
    name), caching on: what the generative export and the eager reference take."""
    with hub.quiet_transformers():
        model = named_inputs.unbound(modeling.restore_model(source, checkpoint))
    if not hasattr(model, "config") or not hasattr(model, "generation_config"):
        raise MobileBuildError(f"a recipe with generate: needs a transformers causal LM (a PreTrainedModel with "
                               f"generation, like AutoModelForCausalLM); got {type(model).__name__}", field="model")
    for holder in hub._configs(model.config):
        if hasattr(holder, "use_cache"):
            holder.use_cache = True
    return model.eval()


def vocab_size(model):
    return model.get_output_embeddings().weight.shape[0]


def cache_heads(model):
    """(key/value heads, head size) of each layer's cache."""
    from transformers.integrations.executorch import get_head_shapes

    return get_head_shapes(model.config.get_text_config())


def static_cache_module(model, max_context):
    """transformers' own wrapper for ExecuTorch: forward(input_ids, cache_position) -> logits, the cache its
    buffers, updated in place."""
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
    return TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_context)


class CacheInOut(torch.nn.Module):
    """One step of the model with its static cache as inputs and outputs (for runtimes without state, ONNX):
    forward(input_ids, cache_position, *past) -> (logits, *present), past and present [1, heads, max_context, dim]
    per layer, keys then values."""

    def __init__(self, model, max_context):
        super().__init__()
        from transformers.cache_utils import StaticCache, StaticLayer, StaticSlidingWindowLayer

        self.model = model
        self.cache = StaticCache(max_cache_len=max_context, config=model.config.get_text_config())
        for index, layer in enumerate(self.cache.layers):
            # as transformers' own ExecuTorch wrapper has them: a sliding-window layer counts its tokens in a Python
            # int, which an export froze at the example's 0, so that every exported step took its positions (rotary
            # and mask) from 0 (Gemma 3's ONNX export decoded at -2 dB against eager); the window stays the mask's
            if type(layer) is StaticSlidingWindowLayer:
                self.cache.layers[index] = StaticLayer(max_context)
        heads, dim = cache_heads(model)
        self.cache.early_initialization(1, heads, dim, torch.float32, "cpu")

    def forward(self, input_ids, cache_position, *past):
        for index, layer in enumerate(self.cache.layers):
            # copies: the step writes its keys and values into them; the caller's arrays stay as they were
            layer.keys, layer.values = past[2 * index].clone(), past[2 * index + 1].clone()
            layer.cumulative_length = cache_position[0].clone()
        logits = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, attention_mask=None).logits
        return (logits, *[tensor for layer in self.cache.layers for tensor in (layer.keys, layer.values)])

    def empty(self):
        """The cache of a new sequence, as forward takes it."""
        return [torch.zeros_like(tensor) for layer in self.cache.layers for tensor in (layer.keys, layer.values)]


def cache_names(layers):
    return [f"past_{kind}_{index}" for index in range(layers) for kind in ("key", "value")]


def export(module, args, kwargs, dynamic):
    """torch.export (strict: the non-strict trace of transformers' masks fails to decompose on torch 2.12) with
    the prompt's length dynamic (sequence_dim). `dynamic`: the inputs' dynamic shapes, by forward's parameter
    names."""
    with torch.no_grad(), hub.quiet_transformers():
        return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic, strict=True)


def sequence_dim(max_context):
    return torch.export.Dim("sequence", min=1, max=max_context - 1)


# --- held-out text and prompts -----------------------------------------------------------------------------------

def heldout_tokens(config, vocab, tokenizer_path=None):
    """The held-out token ids (generate.text: a text file or a function's text, encoded by the recipe's tokenizer,
    or a function's token ids; else seeded random ones) as a 1-D int64 tensor, checked against the vocabulary and
    long enough for the prompts."""
    needed = max(config.prompt_lengths) + config.new_tokens
    found_tokenizer = tokenizer.Tokenizer(tokenizer_path) if tokenizer_path else None
    if found_tokenizer:
        found_tokenizer.check(vocab)
    if config.text is None:
        generator = torch.Generator().manual_seed(config.seed)
        return torch.randint(0, vocab, (max(needed * config.prompts, 4 * config.max_context),), generator=generator)
    found = _heldout(config.text)
    if isinstance(found, str):
        if found_tokenizer is None:
            raise MobileBuildError(f"{config.text} returned text: name the tokenizer that encodes it in "
                                   "generate.tokenizer, or return token ids", field="generate.text")
        found = found_tokenizer.encode(found)
    try:
        tokens = torch.as_tensor(list(found) if not isinstance(found, torch.Tensor) else found, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise MobileBuildError(f"{config.text} returned {type(found).__name__}, expected text or token ids (a 1-D "
                               f"sequence of ints): {modeling.first_line(exc)}", field="generate.text") from None
    tokens = tokens.flatten()
    if len(tokens) < needed:
        raise MobileBuildError(f"{config.text} gave {len(tokens)} tokens; the longest prompt and its new "
                               f"tokens need {needed}", field="generate.text")
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
        raise MobileBuildError(f"{config.text} returned token ids outside [0, {vocab}), the model's vocabulary",
                               field="generate.text")
    return tokens


def _heldout(text):
    """generate.text's text (a file's, or a function's) or token ids (a function's)."""
    if not recipe.FUNCTION.fullmatch(text):  # a file of the repository
        try:
            return Path(text).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise MobileBuildError(f"cannot read {text} as UTF-8 text: {modeling.first_line(exc)}",
                                   field="generate.text") from None
    function = modeling.resolve_callable(text, field="generate.text")
    return modeling.call_user(function, text, "generate.text")


def prompts(tokens, length, count):
    """`count` prompts of `length` tokens, spread evenly over the held-out text."""
    last = len(tokens) - length
    starts = sorted({round(index * last / max(count - 1, 1)) for index in range(count)}) if last > 0 else [0]
    return [tokens[start:start + length].view(1, -1) for start in starts]


def greedy(generator, prompt, new_tokens):
    """(the first step's logits, the new tokens): the generator's own greedy continuation of `prompt`."""
    logits = generator.forward(prompt, 0)[0, -1]
    first, produced = logits, []
    position = prompt.shape[1]
    for _ in range(new_tokens):
        token = int(logits.argmax())
        produced.append(token)
        if len(produced) == new_tokens:
            break
        logits = generator.forward(torch.tensor([[token]]), position)[0, -1]
        position += 1
    return first, produced


class EagerGenerator:
    """The eager transformers model a step at a time with its DynamicCache: the reference, and the timings'
    baseline (transformers' own incremental decoding)."""

    def __init__(self, model):
        self.model, self.cache = model, None

    def forward(self, tokens, position):
        from transformers import DynamicCache

        if position == 0:
            self.cache = DynamicCache(config=self.model.config)
        with torch.no_grad():
            return self.model(input_ids=tokens, cache=self.cache, use_cache=True).logits.float()
