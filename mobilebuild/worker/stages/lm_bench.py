"""lm_bench: a language model artifact (or eager transformers generation) timed in a process of its own, with the
bench stage's rules (worker/stages/bench.py, worker/timing.py): the host lock, warmup then timed runs, medians,
the peak RSS of the measuring process.

Time to first token, per prompt length: the prefill of the prompt and the choice of its first token. Decode: the
new tokens after it, one step each (greedy), as tokens per second. The prompts are fixed token ids (the timings
do not depend on their values).
"""

import json
import statistics
import time
import zlib

import torch

from mobilebuild import store
from mobilebuild.plan import toolchain
from mobilebuild.worker import measure_alone, progress, runtimes, timing
from mobilebuild.worker.stages import bench


def measure(spec):
    config = spec["config"]
    settings = config.timing
    timing.reset_peak_rss()
    torch.set_num_threads(settings["threads"])
    eager = config.runtime == "eager"
    with measure_alone.measuring_alone(spec["label"]), torch.no_grad():
        started = time.perf_counter()
        generator = runtimes.load_generator(spec["path"], config, eager=eager)
        load_ms = (time.perf_counter() - started) * 1e3
        found = {}
        # the decode steps are many per run: fewer runs than the bench stage's single forwards give as many samples
        runs = max(1, settings["iters"] // max(config.new_tokens, 1))
        for length in config.prompt_lengths:
            prompt = torch.zeros(1, length, dtype=torch.long)
            first_token, decode = [], []
            for index in range(settings["warmup"] + runs):
                started = time.perf_counter_ns()
                token = int(generator.forward(prompt, 0)[0, -1].argmax())
                prefilled = time.perf_counter_ns()
                for step in range(config.new_tokens - 1):
                    token = int(generator.forward(torch.tensor([[token]]), length + step)[0, -1].argmax())
                ended = time.perf_counter_ns()
                if index >= settings["warmup"]:
                    first_token.append((prefilled - started) / 1e6)
                    if config.new_tokens > 1:
                        decode.append((ended - prefilled) / 1e6 / (config.new_tokens - 1))
            found[str(length)] = {"ttft_ms": statistics.median(first_token),
                                  "decode_ms_per_token": statistics.median(decode) if decode else None,
                                  "runs": runs}
    per_token = [values["decode_ms_per_token"] for values in found.values() if values["decode_ms_per_token"]]
    decode_ms = statistics.median(per_token) if per_token else None
    return {"prompt_lengths": found, "decode_tokens_per_s": 1e3 / decode_ms if decode_ms else None,
            # the bench stage's median: one decode step, what an app waits for per token
            "median_ms": decode_ms, "load_ms": load_ms, "peak_rss_mb": timing.peak_rss_mb(),
            "threads": settings["threads"]}


def run(inputs, config, output):
    artifact = inputs.get("artifact") or inputs["checkpoint"]
    data = artifact.read_bytes()
    label = progress.current_task() or (artifact.stem if "artifact" in inputs else f"{artifact.parent.name}-eager")
    result = {"runtime": config.runtime, **config.timing, "artifact_bytes": len(data),
              "artifact_compressed_bytes": len(zlib.compress(data, 6)),
              "artifact_sha256": store.sha256_file(artifact), "generation": True, "new_tokens": config.new_tokens,
              "host": bench.host(), "toolchain": toolchain.versions(), "status": "ran",
              **bench.time_in_subprocess({"config": config, "path": str(artifact), "label": label}, measure)}
    with open(output, "w") as handle:
        json.dump(result, handle, indent=2, sort_keys=True)
    ttft = ", ".join(f"{length} tokens {values['ttft_ms']:.2f} ms" for length, values in
                     result["prompt_lengths"].items())
    tokens_per_s = result["decode_tokens_per_s"]
    print(f"   time to first token: {ttft}; decode "
          f"{'n/a' if tokens_per_s is None else f'{tokens_per_s:.1f}'} tokens/s; peak RSS "
          f"{result['peak_rss_mb']:.0f} MB")
