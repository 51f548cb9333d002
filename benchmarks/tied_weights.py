"""An LM head tied to the embedding, stored once: what it saves and what it costs, side by side in one run.

SmolLM2-135M's published configuration (benchmarks/lm_zoo.py; its first `--layers` decoder layers, random
weights, restored from a checkpoint as a build restores it), fp32:
- ExecuTorch: export_llm's program with its weights inside (one .pte, the embedding stored twice) against the
  program and its weights apart (model.pte + model.ptd zipped, as lm_lower ships it: routes/executorch/lm_package.py);
- ONNX: the exporter's model (the head a transposed copy of the embedding) against lm_onnx's (tied_head.share).
Each is timed by its runtime's generator (a prompt of 16 tokens, 8 new), the variants interleaved round by round;
the table gives sizes, medians and the ratios apart/inside (decode tokens/s above 1: the single copy faster).

    nice -n 5 .venv/bin/python benchmarks/tied_weights.py [--layers N] [--rounds R]
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import lm_zoo
import onnx
import torch
from _bench import REPO

sys.path.insert(0, str(REPO))
from mobilebuild.plan import generation  # noqa: E402
from mobilebuild.plan.chain import model_source  # noqa: E402
from mobilebuild.routes.executorch import lm_package  # noqa: E402
from mobilebuild.routes.executorch.worker import export_llm  # noqa: E402
from mobilebuild.routes.executorch.worker import runtime as et_runtime  # noqa: E402
from mobilebuild.routes.executorch.worker.setup import ensure_flatc  # noqa: E402
from mobilebuild.routes.onnx.worker import export, lm_onnx  # noqa: E402
from mobilebuild.routes.onnx.worker import runtime as ort_runtime  # noqa: E402
from mobilebuild.worker import archive, lm  # noqa: E402
from mobilebuild.worker.stages import lm_bench  # noqa: E402

MAX_CONTEXT, PROMPT, NEW_TOKENS = 64, 16, 8


def artifacts(source, checkpoint, settings, scratch):
    """{variant: its file} of the four files."""
    model = lm.causal_lm(source, checkpoint)
    inside = Path(export_llm.write_program(model, "fp32", MAX_CONTEXT, None, str(scratch)))
    inside = inside.rename(scratch / "inside.pte")
    folder = scratch / "apart"
    folder.mkdir()
    export_llm.write_program(lm.causal_lm(source, checkpoint), "fp32", MAX_CONTEXT, None, str(folder),
                             weights_apart=True)
    apart = scratch / "apart.zip"
    archive.write_zip({name: folder / name for name in (lm_package.PROGRAM, lm_package.WEIGHTS)}, apart)
    exported = scratch / "exported.onnx"
    lm_onnx.export_float(lm.causal_lm(source, checkpoint), MAX_CONTEXT, exported)
    exported.write_bytes(export.reproducible(onnx.load(exported)).SerializeToString())
    shared = scratch / "shared.onnx"
    lm_onnx.run({"checkpoint": checkpoint}, settings, shared)
    return {"ExecuTorch, weights inside (.pte)": inside, "ExecuTorch, weights apart (.pte + .ptd)": apart,
            "ONNX, as exported": exported, "ONNX, head tied (lm_onnx)": shared}


def random_model(config):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    fields = {key: value for key, value in config.items() if key != "model_type"}
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields)).eval()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (0: the published 30; default 2)")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    ensure_flatc()
    torch.set_num_threads(1)
    config = lm_zoo.recipe("SmolLM2-135M", args.layers, [])["model"]["config"]
    source = model_source({"transformers": "AutoModelForCausalLM", "config": config}, [{"name": "input_ids"}],
                          generative=True)
    settings = generation.LMExportConfig(model=source, precision="fp32", max_context=MAX_CONTEXT)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="tied-weights-") as scratch:
        scratch = Path(scratch)
        checkpoint = scratch / "checkpoint.pt"
        torch.save(random_model(config).state_dict(), checkpoint)
        files = artifacts(source, checkpoint, settings, scratch)
        runtimes = {name: (et_runtime if "ExecuTorch" in name else ort_runtime) for name in files}
        generators = {name: runtimes[name].generator(path, settings) for name, path in files.items()}
        rounds = {name: [] for name in files}
        for _ in range(args.rounds):
            for name, generator in generators.items():
                found = lm_bench.generator_timings(generator, PROMPT, NEW_TOKENS, warmup=1, runs=3)
                rounds[name].append((found["ttft_ms"], 1e3 / found["decode_ms_per_token"]))
        loads.append(os.getloadavg()[0])
        print(f"SmolLM2-135M, {config['num_hidden_layers']} decoder layers, fp32, one thread; one-minute load "
              f"{min(loads):.1f}-{max(loads):.1f}")
        print(f"{'variant':42s} {'MB':>8s} {'TTFT ms':>8s} {'decode tok/s':>12s}")
        medians = {}
        for name, path in files.items():
            ttft, rate = (statistics.median(values) for values in zip(*rounds[name]))
            medians[name] = (path.stat().st_size / 1e6, ttft, rate)
            print(f"{name:42s} {medians[name][0]:8.1f} {ttft:8.2f} {rate:12.1f}")
    for family, (inside, apart) in {"ExecuTorch": list(files)[:2], "ONNX": list(files)[2:]}.items():
        (size_in, ttft_in, rate_in), (size_ap, ttft_ap, rate_ap) = medians[inside], medians[apart]
        print(f"ratio {family} once/twice: size {size_ap / size_in:.3f}x, decode tokens/s {rate_ap / rate_in:.2f}x, "
              f"TTFT {ttft_in / ttft_ap:.2f}x (above 1: the single copy faster)")


if __name__ == "__main__":
    main()
