"""The bundled language model's ExecuTorch artifacts against the same weights exported by hand with ExecuTorch's
own `export_llm` (its Llama definition, custom SDPA-with-KV-cache op, XNNPACK), and against eager transformers
generation: time to first token and decode tokens/s side by side in one process, one thread each where the runtime
takes it (ExecuTorch's thread pool is sized to 1 for all of its programs alike).

    doit pydoc_lm && python benchmarks/llm_vs_export_llm.py [SCRATCH_DIR]

The checkpoint is mapped to Meta's Llama names (as ExecuTorch's Qwen 2.5 converter maps Hugging Face ones,
`use_hf_rope` keeping transformers' rotary layout); export_llm's logits are checked against eager first, so a bad
mapping cannot pass for a fast artifact. Prints one line per artifact and the ratio ours / export_llm's.
"""

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import mobilebuild.routes  # noqa: E402,F401  (the route families: the recipe's targets)
from mobilebuild.plan import recipe as recipes  # noqa: E402
from mobilebuild.plan.chain import model_source  # noqa: E402
from mobilebuild.worker import lm  # noqa: E402
from mobilebuild.worker.executorch_setup import ensure_flatc  # noqa: E402
from mobilebuild.worker.runtimes import executorch as et_runtime  # noqa: E402

RECIPE = "recipes/pydoc_lm.yaml"
RUNS, WARMUP = 10, 2
OURS = (("fp32", "xnnpack-executorch"), ("8da4w", "xnnpack-executorch-8da4w"))  # the recipe's targets
HF_TO_META = {
    "model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.wq.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.wk.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attention.wv.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attention.wo.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.attention_norm.weight",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.ffn_norm.weight",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.feed_forward.w1.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.feed_forward.w2.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.feed_forward.w3.weight",
}


def meta_state(model):
    found = {}
    for key, value in model.state_dict().items():
        parts = key.split(".")
        index = next((part for part in parts if part.isdigit()), None)
        pattern = key.replace(f".{index}.", ".{}.") if index else key
        found[HF_TO_META[pattern].format(index)] = value
    return found


def export_by_hand(model, generate, precision, scratch):
    """export_llm's own path (export_llama with an LlmConfig, as its CLI builds one) for the same weights."""
    from executorch.examples.models.llama.export_llama_lib import export_llama
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    config = model.config
    checkpoint, params = scratch / "meta.pth", scratch / "params.json"
    torch.save(meta_state(model), checkpoint)
    params.write_text(json.dumps({
        "dim": config.hidden_size, "n_layers": config.num_hidden_layers, "n_heads": config.num_attention_heads,
        "n_kv_heads": config.num_key_value_heads, "vocab_size": config.vocab_size,
        "hidden_dim": config.intermediate_size, "norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_parameters["rope_theta"], "use_hf_rope": True}))
    llm = LlmConfig()
    llm.base.checkpoint, llm.base.params = str(checkpoint), str(params)
    llm.model.use_kv_cache = llm.model.use_sdpa_with_kv_cache = llm.model.enable_dynamic_shape = True
    llm.export.max_seq_length = llm.export.max_context_length = generate["max_context"]
    output = scratch / f"export_llm-{precision}.pte"
    llm.export.output_dir, llm.export.output_name = str(scratch), str(output)  # a name ending .pte: the path
    llm.backend.xnnpack.enabled = llm.backend.xnnpack.extended_ops = True
    if precision == "8da4w":
        llm.quantization.qmode, llm.quantization.group_size = "8da4w", generate["group_size"]
    export_llama(llm)
    return output.read_bytes()


class ExportLlmGenerator:
    """export_llm's program: forward(tokens [1, T], input_pos [1]) -> logits of the last position."""

    def __init__(self, data):
        self.program, self.method = et_runtime.load_method(data)

    def forward(self, tokens, position):
        return self.method.execute([tokens, torch.tensor([position])])[0].view(1, 1, -1)


def timed(generator, length, new_tokens):
    """(TTFT ms, decode tokens/s): medians over RUNS after WARMUP."""
    prompt = torch.zeros(1, length, dtype=torch.long)
    first, decode = [], []
    for index in range(WARMUP + RUNS):
        started = time.perf_counter()
        token = int(generator.forward(prompt, 0)[0, -1].argmax())
        prefilled = time.perf_counter()
        for step in range(new_tokens - 1):
            token = int(generator.forward(torch.tensor([[token]]), length + step)[0, -1].argmax())
        if index >= WARMUP:
            first.append((prefilled - started) * 1e3)
            decode.append((new_tokens - 1) / (time.perf_counter() - prefilled))
    return statistics.median(first), statistics.median(decode)


def main():
    ensure_flatc()
    torch.set_num_threads(1)
    scratch = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="export_llm-"))
    scratch.mkdir(parents=True, exist_ok=True)
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
        by_hand = ExportLlmGenerator(data)
        reference = eager.forward(prompt, 0)[0, -1]
        found = by_hand.forward(prompt, 0)[0, -1]
        sqnr = 10 * torch.log10(reference.pow(2).mean() / (reference - found).pow(2).mean())
        print(f"export_llm {precision}: {len(data) / 1e6:.3f} MB, prefill logits SQNR against eager {sqnr:.1f} dB")
        mine = (out / f"{loaded.name}-{ours}.pte").read_bytes()
        rows += [(f"mobilebuild {ours}", precision, et_runtime.Generator(mine), len(mine)),
                 ("export_llm by hand", precision, by_hand, len(data))]
    results = {}
    for length in generate["prompt_lengths"]:
        for name, precision, generator, size in rows:
            ttft, rate = timed(generator, length, generate["new_tokens"])
            results[(name, precision, length)] = (ttft, rate)
            print(f"{name:28s} {precision:6s} prompt {length:3d}: TTFT {ttft:7.3f} ms, decode {rate:8.1f} tokens/s"
                  + (f", {size / 1e6:.3f} MB" if size else ""))
    for precision, target in OURS:
        for length in generate["prompt_lengths"]:
            ours = results[(f"mobilebuild {target}", precision, length)]
            theirs = results[("export_llm by hand", precision, length)]
            print(f"ratio ours/export_llm {precision} prompt {length}: decode tokens/s {ours[1] / theirs[1]:.2f}x, "
                  f"TTFT {theirs[0] / ours[0]:.2f}x (above 1: ours faster)")


if __name__ == "__main__":
    main()
