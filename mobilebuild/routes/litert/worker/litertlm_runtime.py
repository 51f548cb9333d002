"""LiteRT-LM, the engine LiteRT's language model apps embed, and its bundles (lm_litertlm's .litertlm): the build's
generator (worker/lm.py) runs the bundle's .tflite through the LiteRT interpreter (its signatures take the attention
mask: routes/litert/worker/runtime.py's Generator), and the engine itself is the app's runner (`app_runner`): the
bundle loaded by `litert_lm.Engine` on the CPU, a prompt's text prefilled and greedy tokens decoded by it, timed by
its own benchmark figures."""

import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

from mobilebuild.routes.litert.worker import runtime
from mobilebuild.worker import quiet
from mobilebuild.worker import tokenizer as recipe_tokenizer

HARNESS = "LiteRT-LM's engine (its benchmark figures)"
ENGINE_LOG = (b"W0000", b"I0000", b"E0000", b"WARNING:", b"INFO:", b"ERROR:", b"VERBOSE:", b"===", b"third_party/")


def tflite_bytes(path):
    """The .tflite inside a .litertlm (`path`: its file or its bytes), unpacked by LiteRT-LM's own reader."""
    from litert_lm_builder import litertlm_builder

    with tempfile.TemporaryDirectory(prefix="mobilebuild-litertlm-") as scratch:
        bundle = Path(path) if not isinstance(path, bytes) else Path(scratch, "model.litertlm")
        if isinstance(path, bytes):
            bundle.write_bytes(path)
        litertlm_builder.unpack(str(bundle), str(Path(scratch, "unpacked")))
        (found,) = Path(scratch, "unpacked").glob("*.tflite")
        return found.read_bytes()


def generator(path, config):
    return runtime.generator(tflite_bytes(path), config)


# --- the app's engine, lm_bench's runner (worker/runtimes: app_runner) -----------------------------------------------

def refusal_for(generator, tokenizer, vocab):
    """The bundle carries its tokenizer: the engine times every one."""
    return None


def host_timings(path, scratch, prompt_lengths, new_tokens, warmup, runs, tokenizer=None, vocab=None):
    """{length: {ttft_ms, decode_ms_per_token, runs, generated, prompt_tokens}}: LiteRT-LM's engine on the CPU,
    a new session per run (no prompt template, greedy), the prompt's text prefilled (the engine adds the start token)
    and `new_tokens` decoded; its own benchmark figures, medians over `runs` after `warmup`."""
    import litert_lm

    prompts = {length: recipe_tokenizer.Tokenizer(tokenizer).prompt(length) for length in prompt_lengths}
    with _engine_quiet():
        # cache_dir: its XNNPACK weight cache (the size of the model) goes to the scratch folder, not beside the
        # artifact, where it wrote it otherwise
        engine = litert_lm.Engine(str(path), backend=litert_lm.Backend.CPU(), enable_benchmark=True,
                                  max_num_tokens=max(prompt_lengths) + new_tokens + 1, cache_dir=str(scratch))
    found = {}
    for length, prompt in prompts.items():
        if prompt is None:
            continue
        first_token, decode, figures = [], [], None
        for index in range(warmup + runs):
            with _engine_quiet():
                session = engine.create_session(apply_prompt_template=False, max_output_tokens=new_tokens,
                                                sampler_config=litert_lm.SamplerConfig(top_k=1))
                session.run_prefill([prompt])
                session.run_decode()
                figures = session.get_benchmark_info()
                session.close()
            if index >= warmup:
                first_token.append(figures.time_to_first_token_in_second * 1e3)
                if figures.last_decode_tokens_per_second:
                    decode.append(1e3 / figures.last_decode_tokens_per_second)
        found[str(length)] = {"ttft_ms": statistics.median(first_token),
                              "decode_ms_per_token": statistics.median(decode) if decode else None, "runs": runs,
                              "generated": figures.last_decode_token_count,
                              "prompt_tokens": figures.last_prefill_token_count}
    with _engine_quiet():
        engine.close()
    return found


@contextlib.contextmanager
def _engine_quiet():
    """The engine logs natively (absl, its accelerator registry): kept out of the build's output; where it fails,
    its exception says only which call, so its last error line goes with it."""
    logged = []
    with quiet.native_stderr(kept=logged, kept_prefix=ENGINE_LOG):
        try:
            yield
        except RuntimeError as exc:
            errors = [line.strip() for line in logged if line.startswith("E0000")]
            raise RuntimeError(f"{exc}: {errors[-1] if errors else 'no error logged'}") from None


app_runner = sys.modules[__name__]  # this module is its own app runner: HARNESS, refusal_for, host_timings
