"""The bundled language model's ExecuTorch artifacts (as the build wrote them) against the same weights exported
by hand with ExecuTorch's own `export_llm` (its Llama definition, custom SDPA-with-KV-cache op, XNNPACK) and through
transformers' static-cache export (the build's path for other models), and against eager transformers generation:
time to first token and decode tokens/s side by side in one process, one thread each where the runtime
takes it (ExecuTorch's thread pool is sized to 1 for all of its programs alike). Each ExecuTorch program of ours is
timed twice: through the build's generator (a step at a time from Python, worker/lm.py) and through ExecuTorch's own
LLM runner (its Python binding, the byte tokenizer:
routes/executorch/worker/llm_runner.py), which lm_bench times them by too.

    MOBILEBUILD_EXTRA_RECIPES=examples/llm/pydoc_lm.yaml mobilebuild build examples/llm/pydoc_lm.yaml
    python benchmarks/llm_vs_export_llm.py [SCRATCH_DIR]

export_llm's logits are checked against eager first, so a bad weight mapping cannot pass for a fast artifact.
Rows take turns, five rounds of each; prints one line per artifact (the medians of its rounds) and the ratio
ours / export_llm's.
"""

import statistics
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import mobilebuild.routes  # noqa: E402,F401  (the route families: the recipe's targets)
from mobilebuild.plan import generation  # noqa: E402
from mobilebuild.plan import recipe as recipes  # noqa: E402
from mobilebuild.plan.chain import model_source  # noqa: E402
from mobilebuild.routes.executorch.worker import export_llm, llm_runner, lm_lower  # noqa: E402
from mobilebuild.routes.executorch.worker import runtime as et_runtime  # noqa: E402
from mobilebuild.routes.executorch.worker.setup import ensure_flatc  # noqa: E402
from mobilebuild.worker import lm  # noqa: E402
from mobilebuild.worker.stages import lm_bench  # noqa: E402

RECIPE = "examples/llm/pydoc_lm.yaml"
# Each row is timed ROUNDS times, the rows taking turns (so a change in the machine's load touches all alike), RUNS
# generations after WARMUP each time; a row's figure is the median of its rounds'
ROUNDS, RUNS, WARMUP = 5, 4, 1
RUNNER = "  the same, LLM runner"
OURS = (("fp32", "xnnpack-executorch"), ("8da4w", "xnnpack-executorch-8da4w"))  # the recipe's targets


def export_by_hand(model, generate, precision, scratch):
    """export_llm's own path for the same weights, as a user would run it (the mapping to Meta's names and the
    LlmConfig the command line builds: routes/executorch/worker/export_llm.py, which the build uses for a plain
    Llama too)."""
    return export_llm.program_bytes(model, precision, generate["max_context"], generate["group_size"], str(scratch))


def timed(generator, length, new_tokens, tokenizer):
    """(TTFT ms, decode tokens/s): medians over RUNS after WARMUP; `generator`: a generator (worker/lm.py) or the
    path of a program for ExecuTorch's LLM runner (with the byte tokenizer's file). One round of a row."""
    if isinstance(generator, Path):
        found = llm_runner.time_on_host(generator, tokenizer, {length: llm_runner.prompt_text(length)}, new_tokens,
                                        WARMUP, RUNS)[str(length)]
    else:
        found = lm_bench.generator_timings(generator, length, new_tokens, WARMUP, RUNS)
    return found["ttft_ms"], 1e3 / found["decode_ms_per_token"]


def main():
    ensure_flatc()
    torch.set_num_threads(1)
    scratch = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="export_llm-"))
    scratch.mkdir(parents=True, exist_ok=True)
    tokenizer, _ = llm_runner.runner_tokenizer(scratch, None, [])
    loaded = recipes.load(RECIPE, REPO)
    generate, out = loaded.generate, REPO / "artifacts" / loaded.name
    source = model_source(loaded.model, loaded.inputs)
    eager = lm.EagerGenerator(lm.causal_lm(source, out / "checkpoint.pt"))
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(1)
    prompt = torch.arange(1, 17).view(1, -1)
    rows = [("eager transformers", "fp32", eager, None)]
    for precision, ours in OURS:
        data = export_by_hand(lm.causal_lm(source, out / "checkpoint.pt"), generate, precision, scratch)
        by_hand = et_runtime.Generator(data)
        reference = eager.forward(prompt, 0)[0, -1]
        found = by_hand.forward(prompt, 0)[0, -1]
        sqnr = 10 * torch.log10(reference.pow(2).mean() / (reference - found).pow(2).mean())
        print(f"export_llm {precision}: {len(data) / 1e6:.3f} MB, prefill logits SQNR against eager {sqnr:.1f} dB")
        path = out / f"{loaded.name}-{ours}.pte"
        mine = path.read_bytes()
        print(f"mobilebuild {ours} and export_llm {precision}: "
              + ("byte-identical programs" if mine == data else "different programs"))
        settings = generation.LMExportConfig(model=source, precision=precision, max_context=generate["max_context"],
                                             group_size=generate["group_size"])
        static = lm_lower.program_bytes(lm.causal_lm(source, out / "checkpoint.pt"), settings)
        rows += [(f"mobilebuild {ours}", precision, et_runtime.Generator(mine), len(mine)),
                 (RUNNER, precision, path, len(mine)),
                 ("export_llm by hand", precision, by_hand, len(data)),
                 ("transformers static cache", precision, et_runtime.Generator(static), len(static))]
    results = {}
    for length in generate["prompt_lengths"]:
        rounds = {(name, precision): [] for name, precision, _, _ in rows}
        for _ in range(ROUNDS):
            for name, precision, generator, _ in rows:
                rounds[name, precision].append(timed(generator, length, generate["new_tokens"], tokenizer))
        for name, precision, _, size in rows:
            ttft, rate = (statistics.median(values) for values in zip(*rounds[name, precision]))
            results[(name, precision, length)] = (ttft, rate)
            print(f"{name:28s} {precision:6s} prompt {length:3d}: TTFT {ttft:7.3f} ms, decode {rate:8.1f} tokens/s"
                  + (f", {size / 1e6:.3f} MB" if size else ""))
    for precision, target in OURS:
        for length in generate["prompt_lengths"]:
            ours = results[(f"mobilebuild {target}", precision, length)]
            theirs = results[("export_llm by hand", precision, length)]
            runner = results[(RUNNER, precision, length)]
            print(f"ratio ours/export_llm {precision} prompt {length}: decode tokens/s {ours[1] / theirs[1]:.2f}x, "
                  f"TTFT {theirs[0] / ours[0]:.2f}x (above 1: ours faster); ours through the LLM runner / through "
                  f"the generator: decode tokens/s {runner[1] / ours[1]:.2f}x, TTFT {ours[0] / runner[0]:.2f}x")


if __name__ == "__main__":
    main()
