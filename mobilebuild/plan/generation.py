"""Decoder-only language models (a recipe with `generate:`): each target's chain from the checkpoint to an artifact
with a static KV cache (the route's `Generation.stage`), its verification token by token against the eager model
and its timing (time to first token, decode tokens per second). Names, settings and paths only.

What each node reads is what keys it: `generate.max_context` reaches the artifact, its verification and its timing;
prompt lengths, new tokens and held-out text only the verification and timing; `group_size` only quantized artifacts.
"""

import dataclasses
from dataclasses import dataclass

from mobilebuild.plan import recipe as recipes
from mobilebuild.plan import routes, stages
from mobilebuild.plan.chain import checked_node, source_files
from mobilebuild.plan.settings import ModelSource

VERIFY, BENCH, LAYERS, TOKENIZER = "lm_verify", "lm_bench", "lm_layers", "tokenizer"
GROUPED = ("8da4w", "int4")  # weights quantized in groups of generate.group_size

# What a target must reach when the recipe sets no thresholds for its precision (generate.thresholds). On the
# bundled 2.5 M-parameter Llama, one build: fp32 118-125 dB, every token agreeing; int8 weights 37 dB; 8da4w and
# int4 26-29 dB with about four fifths of the tokens agreeing; perplexity within 0.1% (docs/llm.md).
DEFAULT_THRESHOLDS = {
    "fp32": {"sqnr_db": 40.0, "agreement": 0.9, "perplexity_ratio": 1.01},
    "int8": {"sqnr_db": 15.0, "agreement": 0.5, "perplexity_ratio": 1.1},
    "8da8w": {"sqnr_db": 15.0, "agreement": 0.5, "perplexity_ratio": 1.1},
    "8da4w": {"sqnr_db": 8.0, "agreement": 0.25, "perplexity_ratio": 1.3},
    "int4": {"sqnr_db": 8.0, "agreement": 0.25, "perplexity_ratio": 1.3},
}
FIELDS = {"max_context": "generate.max_context", "prompt_lengths": "generate.prompt_lengths",
          "new_tokens": "generate.new_tokens", "prompts": "generate.prompts", "text": "generate.text",
          "group_size": "generate.group_size", "seed": "generate.seed", "thresholds": "generate.thresholds",
          "exclude": "quantize.exclude", "format": "generate.tokenizer"}


@dataclass(frozen=True)
class TokenizerConfig:
    """The recipe's tokenizer (generate.tokenizer), checked and shipped beside its language model artifacts."""

    format: str  # "tokenizers" (a tokenizer.json) or "sentencepiece" (a .model)


@dataclass(frozen=True)
class LMExportConfig:
    """A route's generative stage: the causal LM from its checkpoint, with a static KV cache of max_context."""

    model: ModelSource
    precision: str
    max_context: int
    group_size: int | None = None  # grouped weight quantization only
    exclude: list | None = stages.when_set()  # quantize.exclude: module paths of the model whose layers stay float


@dataclass(frozen=True)
class LMVerifyConfig:
    runtime: str
    runtime_module: str
    model: ModelSource
    precision: str
    max_context: int
    prompt_lengths: list
    new_tokens: int
    prompts: int
    text: str | None  # held-out text: a file, or "module:function" (text or token ids); None: seeded random ids
    seed: int
    thresholds: dict
    default_thresholds: dict


@dataclass(frozen=True)
class LMLayersConfig:
    """Each layer's share of a quantized target's error: the model with that layer alone quantized, as the route
    quantizes, its logits at the prefill against the float model's (Generation.layers: the worker-side module)."""

    method: str
    model: ModelSource
    precision: str
    max_context: int
    group_size: int | None
    exclude: list | None  # layers the target keeps float: not ranked
    prompt_lengths: list
    new_tokens: int  # with the others, what the held-out prompts are (lm.heldout_tokens): verification's
    prompts: int
    text: str | None  # as LMVerifyConfig's
    seed: int
    top: int  # verify.layers_top


@dataclass(frozen=True)
class LMBenchConfig:
    runtime: str
    runtime_module: str
    model: ModelSource
    max_context: int
    prompt_lengths: list
    new_tokens: int
    timing: dict  # warmup, iters, threads (recipe.benchmark)
    device: dict | None = None  # an Android device to time it on too, with the route's LLM runner


def recipe_fields(config):
    """The generate: fields behind a stage's settings (stages.recipe_field)."""
    return {name: FIELDS[name] for name in (setting.name for setting in dataclasses.fields(config)) if name in FIELDS}


def export_config(chain):
    """The settings of a route's generative stage for this target."""
    generate = chain.recipe.generate
    if chain.excluded and chain.precision == "fp32":
        raise chain.error("an fp32 target quantizes nothing: leave exclude out", "quantize.exclude")
    return LMExportConfig(model=chain.source, precision=chain.precision, max_context=generate["max_context"],
                          group_size=generate["group_size"] if chain.precision in GROUPED else None,
                          exclude=chain.excluded)


def _verify_config(chain, runtime):
    generate = chain.recipe.generate
    defaults = DEFAULT_THRESHOLDS[chain.precision]
    return LMVerifyConfig(
        **runtime, model=chain.source, precision=chain.precision, max_context=generate["max_context"],
        prompt_lengths=generate["prompt_lengths"], new_tokens=generate["new_tokens"], prompts=generate["prompts"],
        text=generate.get("text"), seed=generate["seed"],
        thresholds={**defaults, **generate.get("thresholds", {}).get(chain.precision, {})},
        default_thresholds=defaults)


def bench_config(recipe, runtime, source, device=None):
    generate = recipe.generate
    return LMBenchConfig(**runtime, model=source, max_context=generate["max_context"],
                         prompt_lengths=generate["prompt_lengths"], new_tokens=generate["new_tokens"],
                         timing={key: recipe.benchmark[key] for key in ("warmup", "iters", "threads")}, device=device)


def target_nodes(chain, root):
    """(the nodes of the target's shipped files: its artifact and the recipe's tokenizer; its verification and timing
    nodes; the manifest's entry) of a language model target."""
    recipe, route, target = chain.recipe, chain.route, chain.target
    tokenizer = _tokenizer_node(chain)
    if tokenizer:  # for a route that packages it with the model (onnxruntime-genai's model folder)
        chain.nodes[TOKENIZER] = tokenizer
    final = stages.get(route.generation.stage).planner()(chain)
    with_tokenizer = {"tokenizer": tokenizer} if tokenizer else {}
    runtime = {"runtime": route.runs_in.name, "runtime_module": route.runs_in.module}
    text_files = _text_files(root, recipe.generate.get("text"))
    name = f"{recipe.name}-{target.id}"
    verify = chain.node(VERIFY, name, _verify_config(chain, runtime),
                        {"artifact": final, "checkpoint": chain.nodes["checkpoint"], **with_tokenizer},
                        f"{chain.out}/verify-{target.id}.json", files=chain.source_files + text_files,
                        fields=chain.fields)
    device = route.generation.device(recipe.benchmark["device"]) if route.generation.device else None
    bench = chain.node(BENCH, name, bench_config(recipe, runtime, chain.source, device),
                       {"artifact": final, **with_tokenizer}, f"{chain.out}/bench-{target.id}.json",
                       fields=chain.fields)
    checks = [verify, bench]
    if chain.precision != "fp32" and route.generation.layers and recipe.verify.get("layers", True):
        checks.append(_layers_node(chain, name, final, with_tokenizer, text_files))
    entry = {"target": target.id, "backend": route.backend, "runtime": route.runtime, "precision": chain.precision,
             "path": final.output, "runs_on_host": route.runs_on_host, "device_only": route.runs_in.device_only,
             "delegate": final.config.get("delegate"), "pruning": None, "quantization": None,
             "interpreter": final.interpreter, "fixed_shape": None, "generation": True,
             **({"tokenizer": tokenizer.output} if tokenizer else {})}
    return [final, *([tokenizer] if tokenizer else [])], checks, entry


def _tokenizer_node(chain):
    """The recipe's tokenizer as the file its artifacts ship with (one node, which every target's chain shares)."""
    source = chain.recipe.generate.get("tokenizer")
    if source is None:
        return None
    suffix = source[source.rindex("."):]
    # not chain.node: the file is the same whichever route's targets ship it, so is the node
    return checked_node(chain.recipe, TOKENIZER, chain.recipe.name,
                        TokenizerConfig(format="tokenizers" if suffix == ".json" else "sentencepiece"),
                        {"source": source}, f"{chain.out}/tokenizer{suffix}")


def _text_files(root, text):
    """The repository files behind generate.text: the text file itself, or a function's module."""
    if text is None or recipes.FUNCTION.fullmatch(text):
        return source_files(root, text)
    return (text,)


def _layers_node(chain, name, final, with_tokenizer, text_files):
    generate, export = chain.recipe.generate, final.settings
    settings = LMLayersConfig(method=chain.route.generation.layers, model=chain.source, precision=chain.precision,
                              max_context=export.max_context, group_size=export.group_size, exclude=export.exclude,
                              prompt_lengths=generate["prompt_lengths"], new_tokens=generate["new_tokens"],
                              prompts=generate["prompts"], text=generate.get("text"), seed=generate["seed"],
                              top=chain.recipe.verify.get("layers_top", 5))
    return chain.node(LAYERS, name, settings, {"checkpoint": chain.nodes["checkpoint"], **with_tokenizer},
                      f"{chain.out}/layers-{chain.target.id}.json", files=chain.source_files + text_files,
                      fields=chain.fields)


def eager_bench_config(recipe, source):
    """Eager transformers generation on the host (a DynamicCache, token by token): the timings' baseline."""
    return bench_config(recipe, {"runtime": "eager", "runtime_module": routes.EAGER_RUNTIME}, source)


for _stage in (
    stages.Stage(TOKENIZER, TokenizerConfig, {"source": (stages.FILE,)},
                 "Check the recipe's tokenizer (generate.tokenizer) and ship a copy of it beside the language model "
                 "artifacts.", "#f4e6f0", recipe_fields=recipe_fields(TokenizerConfig)),
    stages.Stage(VERIFY, LMVerifyConfig, {"artifact": (stages.SHIPPED,), "checkpoint": ("checkpoint",),
                                          "tokenizer": (TOKENIZER,)},
                 "Compare each language model artifact with the eager model token by token on held-out prompts: "
                 "logits SQNR at the prefill and each decode step, greedy agreement, perplexity.", "#d9d2e9",
                 recipe_fields=recipe_fields(LMVerifyConfig)),
    stages.Stage(BENCH, LMBenchConfig, {"artifact": (stages.SHIPPED,), "checkpoint": ("checkpoint",),
                                        "tokenizer": (TOKENIZER,)},
                 "Time each language model artifact (time to first token per prompt length, decode tokens/s, peak "
                 "memory), and eager transformers generation, in a process of its own.", "#ead1dc", measures=True,
                 recipe_fields=recipe_fields(LMBenchConfig)),
    stages.Stage(LAYERS, LMLayersConfig, {"checkpoint": ("checkpoint",), "tokenizer": (TOKENIZER,)},
                 "Rank the linear layers of each quantized language model target by the error each adds alone: the "
                 "model with that layer alone quantized, its logits at the prefill against the float model's.",
                 "#e4d7ee", recipe_fields={**recipe_fields(LMLayersConfig), "top": "verify.layers_top"},
                 limit="layers_seconds"),
):
    stages.register(_stage)
