"""The language-model zoo: the published configurations of small open language models (random weights: nothing is
downloaded), each built for every language-model target (TARGETS: the three runtimes' step programs and the
engine packagings apps embed), verified against eager transformers and timed by the engine each target ships for,
in one table (docs/llm.md, its "LM zoo" section) with each target's build time and peak memory.

Each model is one project and one recipe, built cold (shared artifact cache off) by `mobilebuild build -n 1`, with
a byte-level BPE tokenizer trained here on Python's help texts (mobilebuild.examples.pydoc_lm.bpe_tokenizer) and
held-out text from them. A target the plan refuses is its one line and the recipe is built without it.
`--layers N` builds the first N decoder layers of every model (their published widths and vocabularies kept): two
cores cannot lower a 1.2 B-parameter model in an evening; the table says so. CPU-heavy: run it niced.

    nice -n 15 .venv/bin/python benchmarks/lm_zoo.py [--only NAME[,NAME]] [--columns TARGET[,TARGET]] [--layers N]
        [--keep DIR] [--no-docs] [--table]
"""

import copy
import json
import os
import sys
import tempfile
import textwrap
from importlib.metadata import version
from pathlib import Path

import zoo
from _bench import REPO, bytecode_env

sys.path.insert(0, str(REPO))
from mobilebuild.engine import node_times  # noqa: E402

DOCS = REPO / "docs" / "llm.md"
HEADING = "## The LM zoo"  # a run of reduced depth (--layers N); at the published depths, heading(0)
END_OF = "## What rebuilds"  # the section the LM zoo's follow
TOKENIZER_TOKENS = 4096  # the BPE's vocabulary (the models' larger ones: ids it never makes, as a new tokenizer's)

# name -> (what it is, its published configuration: the model card's config.json fields that shape the model)
MODELS = {
    "SmolLM2-135M": ("HuggingFaceTB/SmolLM2-135M: Llama, tied embeddings", {
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
        "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 0,
        "eos_token_id": 0}),
    "Qwen2.5-0.5B": ("Qwen/Qwen2.5-0.5B: Qwen2, q/k/v biases, tied embeddings", {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
        "bos_token_id": 151643, "eos_token_id": 151643}),
    "Llama-3.2-1B": ("meta-llama/Llama-3.2-1B: Llama, llama3 rotary scaling, tied embeddings", {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192},
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128001}),
    "Gemma-3-270M": ("google/gemma-3-270m: Gemma 3, five sliding-window layers to one global", {
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048,
        "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "max_position_embeddings": 32768, "sliding_window": 512, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}),
}

# name -> target: every language-model route, fp32 and the precision apps ship
TARGETS = {
    "et-fp32": {"backend": "xnnpack", "runtime": "executorch"},
    "et-8da4w": {"backend": "xnnpack", "runtime": "executorch", "precision": "8da4w"},
    "onnx-fp32": {"backend": "onnx"},
    "onnx-int4": {"backend": "onnx", "precision": "int4"},
    "genai-int4": {"backend": "onnx", "runtime": "onnxruntime-genai", "precision": "int4"},
    "litert-fp32": {"backend": "xnnpack", "runtime": "litert"},
    "litert-int8": {"backend": "xnnpack", "runtime": "litert", "precision": "int8"},
    "litertlm-int8": {"backend": "xnnpack", "runtime": "litert-lm", "precision": "int8"},
}
GENERATE = {"max_context": 64, "prompt_lengths": [16], "new_tokens": 8, "prompts": 2,
            "text": "mobilebuild.examples.pydoc_lm:heldout_text", "tokenizer": "tokenizer.json", "group_size": 32}
VERDICT_STAGES = ("lm_verify", "lm_bench", "lm_layers", "verified")  # the rest of a target's nodes make its artifact


def recipe(name, layers, targets):
    config = copy.deepcopy(MODELS[name][1])
    if layers:
        config["num_hidden_layers"] = min(layers, config["num_hidden_layers"])
    return {"name": slug(name), "model": {"transformers": "AutoModelForCausalLM", "config": config, "seed": 0},
            "generate": GENERATE, "benchmark": {"warmup": 1, "iters": 24},  # 3 timed generations of 8 tokens
            "verify": {"layers": False},  # the per-layer ranking: a run of its own (docs/llm.md)
            "limits": {"stage_seconds": 3600},
            "targets": [{**TARGETS[target], "name": target} for target in targets]}


def slug(name):
    return name.lower().replace(".", "_").replace("-", "_")


def plan_refusals(project, data):
    """{target: the plan's one line} for each target the plan refuses, each planned alone."""
    import mobilebuild.routes  # noqa: F401  the route families register their stages
    from mobilebuild.plan import graph
    from mobilebuild.plan import recipe as recipes

    found = {}
    for target in data["targets"]:
        path = project / "recipes" / f"{data['name']}.yaml"
        path.write_text(json.dumps({**data, "targets": [target]}))
        try:
            (loaded,) = recipes.load_all(project)
            graph.recipe_nodes(loaded, str(project))
        except Exception as exc:  # noqa: BLE001 - the plan's errors, one line each
            found[target["name"]] = "; ".join(map(str, getattr(exc, "errors", None) or [exc]))
        path.unlink()
    return found


def build(root, name, layers, targets, env):
    """One model's project built: {target: cell}, the build's seconds, its output's noise."""
    from mobilebuild.examples import pydoc_lm

    project = root / slug(name)
    (project / "recipes").mkdir(parents=True, exist_ok=True)
    pydoc_lm.bpe_tokenizer(project / "recipes" / "tokenizer.json", vocab_size=TOKENIZER_TOKENS)
    data = recipe(name, layers, targets)
    refused = plan_refusals(project, data)
    data["targets"] = [target for target in data["targets"] if target["name"] not in refused]
    seconds, lines, _ = zoo.build(root, slug(name), False, env, {data["name"]: data}, files=())
    times = node_times.read(project / node_times.RECORD)
    cells = {target: {"kind": "refused", "line": line.split(": ", 1)[-1]} for target, line in refused.items()}
    for target in data["targets"]:
        cells[target["name"]] = cell(project / "artifacts" / data["name"], data["name"], target["name"], times, lines)
    return cells, seconds, zoo.noise(lines)


def cell(folder, recipe_name, target, times, lines):
    """A target's cell: built or the build's one line; its artifact's size, build seconds and peak memory (the
    artifact's own nodes), its verdict and the engine's timings."""
    own = {task.split(":")[0]: entry for task, entry in times.items() if task.endswith(f":{recipe_name}-{target}")}
    making = [entry for stage, entry in own.items() if stage not in VERDICT_STAGES]
    found = {"build_s": sum(map(_seconds, making)) or None,
             "peak_rss_mb": max((entry.get("peak_rss_mb") or 0 for entry in making), default=None) or None,
             "verify_s": _seconds(own.get("lm_verify")), "bench_s": _seconds(own.get("lm_bench"))}
    artifact = next((path for path in folder.glob(f"{recipe_name}-{target}.*")), None)
    verified, timed = folder / f"verify-{target}.json", folder / f"bench-{target}.json"
    if artifact is None:
        errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:") and f"-{target}" in line]
        return {**found, "kind": "refused", "line": (errors or ["not built (see the build's log)"])[0]}
    found.update(kind="built", mb=artifact.stat().st_size / 1e6)
    if verified.exists():
        result = json.loads(verified.read_text())
        metrics = result["metrics"]
        found.update(kind="verified" if result["status"] == "passed" else "failed", sqnr_db=metrics["sqnr_db"],
                     agreement=metrics["agreement"], perplexity=metrics["perplexity_artifact"],
                     perplexity_eager=metrics["perplexity_eager"], untrained=result["untrained_reference"])
    if timed.exists():
        result = json.loads(timed.read_text())
        if result.get("status") == "ran":
            found.update(harness=result["harness"], decode=result["decode_tokens_per_s"],
                         ttft_ms=next(iter(result["prompt_lengths"].values()))["ttft_ms"])
    return found


def _seconds(entry):
    return entry and entry["ended"] - entry["started"]


def _span(started, ended):
    """'on 2026-11-29, 22:10-23:20', or across midnight (runs merged) 'from 2026-11-29 22:10 to 2026-11-30 02:45'."""
    if started[:10] == ended[:10]:
        return f"on {started[:10]}, {started[11:16]}-{ended[11:16]}"
    return f"from {started[:10]} {started[11:16]} to {ended[:10]} {ended[11:16]}"


def _number(value, digits=1):
    return "" if value is None else f"{value:,.{digits}f}"


def heading(layers):
    """The docs section of a run of `layers` (0: the published depths, a section of its own)."""
    return HEADING if layers else f"{HEADING} at published depth"


def markdown(rows, run):
    """The docs section: how the rows were built, the table, every refusal in full."""
    layers = run["layers"]
    depths = ", ".join(f"{name} has {MODELS[name][1]['num_hidden_layers']}" for name, *_ in rows)
    reduced = (f"The first {layers} decoder layers of each ({depths}), widths and vocabularies as published: "
               "two cores do not lower a 1.2 B-parameter model in an evening; a full-depth run is `--layers 0`."
               ) if layers else "Every model at its published depth."
    how = (f"The published configurations of small open language models, random weights (nothing is downloaded), each "
           f"built for every language-model target by `{run['command']}` ([benchmarks/lm_zoo.py]"
           f"(../benchmarks/lm_zoo.py)) {_span(run['started'], run['ended'])} UTC: "
           "one model at a time, cold (`mobilebuild build -n 1`, shared cache off), a byte-level BPE tokenizer of "
           f"{TOKENIZER_TOKENS} tokens trained on Python's help texts, held-out text from them, prompts of 16 tokens, "
           f"8 new tokens, `max_context` 64, one thread; torch {version('torch')}, transformers "
           f"{version('transformers')}, ExecuTorch {version('executorch')}, onnxruntime-genai "
           f"{version('onnxruntime-genai')}, litert-torch {version('litert-torch')}, on a {zoo.machine()}, one-minute "
           f"load average {min(run['loads']):.1f}-{max(run['loads']):.1f} (read as the run started and as each model "
           f"ended). {reduced}")
    columns = ("Build: the seconds of the nodes that make the target's artifact (export, lowering, conversion, "
               "packaging) and their peak resident memory (the stage's process, or a process it started such as "
               "onnxruntime-genai's builder). Random weights give an eager perplexity about the vocabulary's size and "
               "flat logits: a quantized target's greedy tokens then disagree with eager's for any rounding, and its "
               "verdict says \"untrained reference\"; the fp32 targets' SQNR is the check that holds. Decode tokens/s "
               "and time to first token are the engine's the target ships for (ExecuTorch's LLM runner, "
               "onnxruntime-genai's loop, LiteRT-LM's engine) where it has one, else its runtime's generator.")
    out = [heading(layers), "", textwrap.fill(how, 116, break_on_hyphens=False), "",
           textwrap.fill(columns, 116, break_on_hyphens=False), "",
           "| model | target | size (MB) | build (s) | peak RSS (MB) | verdict | SQNR (dB) | agreement | "
           "decode tok/s | TTFT (ms) |", "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    notes = []
    for name, parameters, cells, seconds, noise in rows:
        for target, found in sorted(cells.items(), key=lambda cell: list(TARGETS).index(cell[0])):
            if found["kind"] == "refused":
                notes.append(f"{name}, {target}: {found['line']}")
                out.append(f"| {name} | {target} | | {_number(found.get('build_s'), 0)} | "
                           f"{_number(found.get('peak_rss_mb'), 0)} | refused [{len(notes)}] | | | | |")
                continue
            quantized = TARGETS[target].get("precision", "fp32") != "fp32"  # an fp32 failure is its own
            verdict = found["kind"] + (" (untrained reference)" if found["kind"] == "failed" and found.get("untrained")
                                       and quantized else "")
            out.append(f"| {name} | {target} | {_number(found.get('mb'))} | {_number(found.get('build_s'), 0)} | "
                       f"{_number(found.get('peak_rss_mb'), 0)} | {verdict} | {_number(found.get('sqnr_db'))} | "
                       f"{_number(found.get('agreement'), 2)} | {_number(found.get('decode'), 0)} | "
                       f"{_number(found.get('ttft_ms'), 2)} |")
    out += ["", "Each model's build, and what its output held beyond mobilebuild's lines:", ""]
    out += [f"- {name} ({parameters / 1e6:.0f} M parameters built, {parameters * 4 / 1e6:.0f} MB in fp32): "
            f"{seconds / 60:.1f} min; {noise}." for name, parameters, _, seconds, noise in rows]
    if notes:
        out += ["", "Refusals:", "", *(f"{index}. {line}" for index, line in enumerate(notes, 1))]
    return "\n".join(out) + "\n"


def parameters(name, layers):
    """The built model's parameter count, from its configuration on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = recipe(name, layers, [])["model"]["config"]
    fields = {key: value for key, value in config.items() if key != "model_type"}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **fields))
    return sum(parameter.numel() for parameter in model.parameters())


def write_docs(section, layers):
    """docs/llm.md with the section: the reduced run's after END_OF, the published depths' after it."""
    zoo.write_section(section, HEADING if not layers else END_OF, DOCS)


def main():
    args, names = zoo.arguments(__doc__, MODELS, columns={
        "help": "comma-separated targets to build: " + ", ".join(TARGETS)}, layers={
        "type": int, "default": 2, "help": "build the first N decoder layers of each model (0: all; default 2)"},
        table={"action": "store_true", "help": "write the section from a --keep folder's rows, building nothing"},
        merge={"help": "with --table: comma-separated rows.json files of other runs (of the same --layers), whose "
                       "rows follow the kept ones (a model's targets built again replace its cells)"})
    if args.table:
        kept = json.loads((args.keep / "rows.json").read_text())
        rows, run = kept["rows"], kept["run"]
        for path in args.merge.split(",") if args.merge else []:
            other = json.loads(Path(path).read_text())
            built = {row[0]: row for row in rows}
            for row in other["rows"]:
                if row[0] in built:  # a model's targets built again (--columns): theirs replace its cells
                    earlier = built[row[0]]
                    earlier[2].update(row[2])
                    earlier[3] += row[3]
                    earlier[4] = f"{earlier[4]}; again: {row[4]}"
                else:
                    rows.append(row)
            run = {**run, "command": f"{run['command']}; {other['run']['command']}", "ended": other["run"]["ended"],
                   "loads": run["loads"] + other["run"]["loads"]}
        write_docs(markdown(rows, run), run["layers"])
        return
    targets = args.columns.split(",") if args.columns else list(TARGETS)
    if unknown := [target for target in targets if target not in TARGETS]:
        sys.exit(f"lm_zoo.py: unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    scratch = None if args.keep else tempfile.TemporaryDirectory(prefix="lm-zoo-")
    root = args.keep.resolve() if args.keep else Path(scratch.name)
    env = {**bytecode_env(root), "MOBILEBUILD_CACHE": "off", "PYTHONPATH": str(REPO)}
    run = {**zoo.run_info(), "layers": args.layers}
    print(f"LM zoo: {len(names)} models x {len(targets)} targets in {root}", flush=True)
    rows = []
    for name in names:
        cells, seconds, noise = build(root, name, args.layers, targets, env)
        rows.append((name, parameters(name, args.layers), cells, seconds, noise))
        print(f"  {name}: {seconds:.0f} s ({noise}): " + "; ".join(
            f"{target} {found['kind']}" for target, found in cells.items()), flush=True)
        run.update(ended=zoo.utc_now(), loads=[*run["loads"], os.getloadavg()[0]])
        (root / "rows.json").write_text(json.dumps({"rows": rows, "run": run}))
        if not args.no_docs:  # after each model: an interrupted run leaves the rows it has
            write_docs(markdown(rows, run), run["layers"])
    if scratch:
        scratch.cleanup()


if __name__ == "__main__":
    main()
