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

The same weights are also exported by the peer that turns Hugging Face models into `.pte` files, optimum-executorch
(`optimum-cli export executorch --recipe xnnpack --use_custom_sdpa --use_custom_kv_cache`, `--qlinear 8da4w` for
8da4w), and its programs timed by the same LLM runner. optimum-executorch 1.1.0 requires transformers 5.0.0rc1, so
it runs in an interpreter of its own (SCRATCH_DIR/optimum-executorch: a venv that sees this one's packages, with
optimum-executorch and the versions it pins installed over them; made on the first run, from PyPI).

Each lowering is timed once, one after another: the build's own stage function (lm_lower.run, which must give the
build's bytes), export_llm by hand, and optimum-executorch's command line (its interpreter's start included).
export_llm's and optimum-executorch's logits are checked against eager first, so a bad weight mapping cannot pass
for a fast artifact. Rows take turns, five rounds of each; prints one line per artifact (the medians of its rounds)
and the ratios ours / export_llm's and ours / optimum-executorch's.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import mobilebuild.routes  # noqa: E402,F401  (the route families: the recipe's targets)
from mobilebuild.plan import generation  # noqa: E402
from mobilebuild.plan import recipe as recipes  # noqa: E402
from mobilebuild.plan.chain import model_source  # noqa: E402
from mobilebuild.routes.executorch import lm_package  # noqa: E402
from mobilebuild.routes.executorch.worker import export_llm, llm_runner, lm_lower, pte  # noqa: E402
from mobilebuild.routes.executorch.worker import runtime as et_runtime  # noqa: E402
from mobilebuild.routes.executorch.worker.setup import ensure_flatc  # noqa: E402
from mobilebuild.worker import archive, lm, metrics  # noqa: E402
from mobilebuild.worker.stages import lm_bench  # noqa: E402

RECIPE = "examples/llm/pydoc_lm.yaml"
# Each row is timed ROUNDS times, the rows taking turns (so a change in the machine's load touches all alike), RUNS
# generations after WARMUP each time; a row's figure is the median of its rounds'
ROUNDS, RUNS, WARMUP = 5, 4, 1
RUNNER = "  the same, LLM runner"
OPTIMUM = "optimum-executorch, LLM runner"
OURS = (("fp32", "xnnpack-executorch"), ("8da4w", "xnnpack-executorch-8da4w"))  # the recipe's targets
# optimum-executorch and what it pins that this venv has in other versions (transformers 5.0.0rc1 pins tokenizers
# and huggingface-hub below theirs), with what those need that this venv lacks
OPTIMUM_PACKAGES = ("optimum-executorch==1.1.0", "optimum==2.0.0", "transformers==5.0.0rc1", "tokenizers==0.22.2",
                    "huggingface-hub>=1.2.1,<2", "accelerate", "httpx", "httpcore", "h11", "anyio", "sniffio")


def export_by_hand(model, generate, precision, scratch):
    """export_llm's own path for the same weights, as a user would run it (the mapping to Meta's names and the
    LlmConfig the command line builds: routes/executorch/worker/export_llm.py, which the build uses for a plain
    Llama too), its weights apart where the build keeps them apart (foundation_weights_file), zipped as the build
    zips them: the path of its .pte or zip."""
    apart = lm_package.weights_apart(precision, None)
    folder = scratch / f"by-hand-{precision}"
    folder.mkdir(exist_ok=True)
    program = Path(export_llm.write_program(model, precision, generate["max_context"], generate["group_size"],
                                            str(folder), weights_apart=apart))
    if not apart:
        return program
    archive.write_zip({name: folder / name for name in (lm_package.PROGRAM, lm_package.WEIGHTS)},
                      scratch / f"by-hand-{precision}.zip")
    return scratch / f"by-hand-{precision}.zip"


def optimum_python(folder):
    """optimum-executorch's interpreter: a venv at `folder` that sees this venv's packages (a .pth file) under
    its own installs of OPTIMUM_PACKAGES, which come first on its path."""
    python = folder / "bin" / "python"
    site = folder / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
        (site / "this_venv.pth").write_text(next(p for p in sys.path if p.endswith("site-packages")) + "\n")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                        *OPTIMUM_PACKAGES], check=True)
    return python


def export_by_optimum(model, generate, precision, scratch):
    """optimum-executorch's program of the same weights: the model saved as a transformers folder, exported by
    `optimum-cli export executorch` as its README does for XNNPACK (custom SDPA and KV cache)."""
    folder, out = scratch / "transformers", scratch / f"optimum-{precision}"
    model.save_pretrained(folder)
    quantized = ["--qlinear", "8da4w", "--qlinear_group_size", str(generate["group_size"])] if precision == "8da4w" \
        else []
    argv = [str(optimum_python(scratch / "optimum-executorch")), "-m", "optimum.commands.optimum_cli", "export",
            "executorch", "--model", str(folder), "--task", "text-generation", "--recipe", "xnnpack",
            "--use_custom_sdpa", "--use_custom_kv_cache", "--max_seq_len", str(generate["max_context"]), *quantized,
            "--output_dir", str(out)]
    log = scratch / f"optimum-{precision}.log"
    with open(log, "w") as output:
        if subprocess.run(argv, stdout=output, stderr=subprocess.STDOUT, env=os.environ).returncode:
            sys.exit(f"optimum-executorch's export ({precision}) failed: its output is in {log}")
    return (out / "model.pte").read_bytes()


def timed(generator, length, new_tokens, tokenizer):
    """(TTFT ms, decode tokens/s): medians over RUNS after WARMUP; `generator`: a generator (worker/lm.py) or the
    path of an artifact for ExecuTorch's LLM runner (with the byte tokenizer's file). One round of a row."""
    if isinstance(generator, Path):
        program, weights = pte.unpacked(generator, generator.parent / f"{generator.stem}-unpacked")
        found = llm_runner.time_on_host(program, tokenizer, {length: llm_runner.prompt_text(length)}, new_tokens,
                                        WARMUP, RUNS, weights)[str(length)]
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
    reference = eager.forward(prompt, 0)[0, -1]
    for precision, ours in OURS:
        settings = generation.LMExportConfig(model=source, precision=precision, max_context=generate["max_context"],
                                             group_size=generate["group_size"])
        suffix = lm_package.SUFFIX if lm_package.weights_apart(precision, None) else ".pte"
        path, seconds = out / f"{loaded.name}-{ours}{suffix}", {}
        mine = path.read_bytes()
        started = time.perf_counter()  # the build's stage function, in this process: the lowering of the build
        lm_lower.run({"checkpoint": out / "checkpoint.pt"}, settings, scratch / f"ours{suffix}")
        seconds["mobilebuild"] = time.perf_counter() - started
        print(f"mobilebuild {ours}: {len(mine) / 1e6:.3f} MB, its lm_lower stage {seconds['mobilebuild']:.1f} s, "
              + ("the same bytes as the build's" if (scratch / f"ours{suffix}").read_bytes() == mine
                 else "OTHER BYTES"))
        started = time.perf_counter()
        by_hand = export_by_hand(lm.causal_lm(source, out / "checkpoint.pt"), generate, precision, scratch)
        seconds["export_llm"] = time.perf_counter() - started
        peer, started = scratch / f"optimum-{precision}.pte", time.perf_counter()
        peer.write_bytes(export_by_optimum(lm.causal_lm(source, out / "checkpoint.pt"), generate, precision, scratch))
        seconds["optimum-executorch"] = time.perf_counter() - started  # its interpreter's start and imports too
        for name, artifact in (("export_llm", by_hand), ("optimum-executorch", peer)):
            found = et_runtime.generator(artifact, settings).forward(prompt, 0).reshape(-1, len(reference))[-1]
            print(f"{name} {precision}: {artifact.stat().st_size / 1e6:.3f} MB in {seconds[name]:.1f} s, prefill "
                  f"logits SQNR against eager {metrics.sqnr_db(reference, found):.1f} dB; mobilebuild {ours} and "
                  "it: " + ("byte-identical" if mine == artifact.read_bytes() else "different files"))
        static = lm_lower.program_bytes(lm.causal_lm(source, out / "checkpoint.pt"), settings)
        rows += [(f"mobilebuild {ours}", precision, et_runtime.generator(path, settings), len(mine)),
                 (RUNNER, precision, path, len(mine)),
                 ("export_llm by hand", precision, et_runtime.generator(by_hand, settings),
                  by_hand.stat().st_size),
                 (OPTIMUM, precision, peer, peer.stat().st_size),
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
            peer = results[(OPTIMUM, precision, length)]
            print(f"ratio ours/export_llm {precision} prompt {length}: decode tokens/s {ours[1] / theirs[1]:.2f}x, "
                  f"TTFT {theirs[0] / ours[0]:.2f}x (above 1: ours faster); ours through the LLM runner / through "
                  f"the generator: decode tokens/s {runner[1] / ours[1]:.2f}x, TTFT {ours[0] / runner[0]:.2f}x; "
                  f"ours / optimum-executorch's, both through the LLM runner: decode tokens/s "
                  f"{runner[1] / peer[1]:.2f}x, TTFT {peer[0] / runner[0]:.2f}x")


if __name__ == "__main__":
    main()
