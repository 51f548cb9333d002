"""lm_bench: a language model artifact (or eager transformers generation) timed in a process of its own, with the
bench stage's rules (worker/stages/bench.py, worker/timing.py): the host lock, warmup then timed runs, medians,
the peak RSS of the measuring process.

Time to first token, per prompt length: the prefill of the prompt and the choice of its first token. Decode: the
new tokens after it, one step each (greedy), as tokens per second. The prompts are fixed token ids (the timings
do not depend on their values).

The harness: what an app runs. Where the artifact's family has an engine that apps embed (the runtime module's
`app_runner`: ExecuTorch's LLM runner for an export_llm program with a tokenizer, onnxruntime-genai's generation loop
for its model folder, LiteRT-LM's engine for its bundle), the artifact is timed by it (its prompt as text, no Python
between steps): those are the row's figures, which the report ranks, and the harness names it. Every artifact, and
eager transformers, is also timed by its runtime's generator, a step at a time from Python (worker/lm.py): the row's
figures where there is no engine, else a cross-check under "generator". On an Android device where
benchmark.device selects one, the engine times it there too.
"""

import json
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import torch

from mobilebuild import store
from mobilebuild.plan import toolchain
from mobilebuild.worker import measure_alone, peak_rss, progress, runtimes
from mobilebuild.worker.stages import bench, modeling

GENERATOR = "its runtime's generator, a step at a time from Python"


def measure(spec):
    config = spec["config"]
    settings = config.timing
    peak_rss.reset()
    torch.set_num_threads(settings["threads"])
    eager = config.runtime == "eager"
    with measure_alone.measuring_alone(spec["label"], settings["threads"]) as waited, torch.no_grad():
        started = alone_since = time.perf_counter()
        generator = runtimes.load_generator(spec["path"], config, eager=eager)
        load_ms = (time.perf_counter() - started) * 1e3
        vocab = generator.forward(torch.zeros(1, 1, dtype=torch.long), 0).shape[-1]
        # the decode steps are many per run: fewer runs than the bench stage's single forwards give as many samples
        runs = max(1, settings["iters"] // max(config.new_tokens, 1))
        found = {"harness": GENERATOR, **timings({str(length): generator_timings(
            generator, length, config.new_tokens, settings["warmup"], runs) for length in config.prompt_lengths})}
        runner = runtimes.app_runner(config)
        refused = runner.refusal_for(generator, spec["tokenizer"], vocab) if runner else None
        if runner and not refused:
            try:
                found = {"harness": runner.HARNESS, **timings(runner.host_timings(
                    spec["path"], spec["scratch"], config.prompt_lengths, config.new_tokens, settings["warmup"], runs,
                    spec["tokenizer"], vocab)), "generator": found}
            except (RuntimeError, UnicodeDecodeError) as exc:  # the engine's failure, said; the generator's timing
                refused = f"{runner.HARNESS} failed: {type(exc).__name__}: {modeling.first_line(exc)}"  # stands
    alone = time.perf_counter() - alone_since
    return {**found, "load_ms": load_ms, "peak_rss_mb": peak_rss.mb(), "threads": settings["threads"],
            "vocab": vocab, "runner_refused": refused, "waited_for_stages_s": waited, "alone_s": alone,
            "isolation": measure_alone.isolation()}


def timings(per_length):
    """{prompt_lengths, decode_tokens_per_s, median_ms} of one harness's {length: timings}."""
    per_token = [values["decode_ms_per_token"] for values in per_length.values() if values["decode_ms_per_token"]]
    decode_ms = statistics.median(per_token) if per_token else None
    # median_ms: the bench stage's median, one decode step, what an app waits for per token
    return {"prompt_lengths": per_length, "decode_tokens_per_s": 1e3 / decode_ms if decode_ms else None,
            "median_ms": decode_ms}


def generator_timings(generator, length, new_tokens, warmup, runs):
    """{ttft_ms, decode_ms_per_token, runs}: medians of `runs` greedy generations after `warmup`."""
    prompt = torch.zeros(1, length, dtype=torch.long)
    first_token, decode = [], []
    for index in range(warmup + runs):
        started = time.perf_counter_ns()
        token = int(generator.forward(prompt, 0)[0, -1].argmax())
        prefilled = time.perf_counter_ns()
        for step in range(new_tokens - 1):
            token = int(generator.forward(torch.tensor([[token]]), length + step)[0, -1].argmax())
        ended = time.perf_counter_ns()
        if index >= warmup:
            first_token.append((prefilled - started) / 1e6)
            if new_tokens > 1:
                decode.append((ended - prefilled) / 1e6 / (new_tokens - 1))
    return {"ttft_ms": statistics.median(first_token),
            "decode_ms_per_token": statistics.median(decode) if decode else None, "runs": runs}


def run(inputs, config, output):
    artifact = inputs.get("artifact") or inputs["checkpoint"]
    data = artifact.read_bytes()
    label = progress.current_task() or (artifact.stem if "artifact" in inputs else f"{artifact.parent.name}-eager")
    result = {"runtime": config.runtime, **config.timing, "artifact_bytes": len(data),
              "artifact_compressed_bytes": len(zlib.compress(data, 6)),
              "artifact_sha256": store.sha256_file(artifact), "generation": True, "new_tokens": config.new_tokens,
              "host": bench.host(), "toolchain": toolchain.versions(), "status": "ran"}
    tokenizer = str(inputs["tokenizer"]) if "tokenizer" in inputs else None
    with tempfile.TemporaryDirectory(dir=Path(output).parent) as scratch:
        result.update(bench.time_in_subprocess({"config": config, "path": str(artifact), "label": label,
                                                "scratch": scratch, "tokenizer": tokenizer}, measure))
        if config.device:
            result["device"] = on_device(artifact, scratch, config, result["runner_refused"], tokenizer,
                                         result["vocab"])
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)
    print(f"   {timings_line(result)}; peak RSS {result['peak_rss_mb']:.0f} MB ({result['harness']})")
    if "generator" in result:
        print(f"   cross-check, {GENERATOR}: {timings_line(result['generator'])}")
    if "device" in result:
        print(f"   device: {device_line(result['device'])}")


def timings_line(found):
    ttft = ", ".join(f"{length} tokens {values['ttft_ms']:.2f} ms" for length, values in
                     found["prompt_lengths"].items())
    tokens_per_s = found["decode_tokens_per_s"]
    return (f"time to first token: {ttft}; decode {'n/a' if tokens_per_s is None else f'{tokens_per_s:.1f}'} "
            "tokens/s")


def on_device(artifact, scratch, config, refused, tokenizer, vocab):
    """The family's app runner on the selected device, where it times the artifact on the host too."""
    runner = runtimes.app_runner(config)
    if runner is None or refused:
        return {"status": "skipped", "reason": refused or f"{config.runtime} has no runner that apps embed"}
    return runner.device_timings(artifact, scratch, config.device, config.prompt_lengths, config.new_tokens,
                                 tokenizer, vocab)


def device_line(found):
    if found["status"] != "ran":
        return f"not measured on a device ({found['status']}: {found['reason']})"
    return "; ".join(f"prompt {length}: TTFT {values['ttft_ms']} ms, decode {values['decode_ms_per_token']} ms/token"
                     for length, values in found["prompt_lengths"].items()) + f" on {found['serial']}"
