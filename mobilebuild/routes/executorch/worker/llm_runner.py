"""ExecuTorch's own LLM runner as the timing harness of an export_llm program: on the host through its Python
binding (`executorch.extension.llm.runner.TextLLMRunner`), on an Android device through its `llama_main` binary
over adb (the way worker/device.py runs speed_benchmark_torch for TorchScript).

The runner takes a text prompt and a tokenizer file, not token ids: the recipe's tokenizer (generate.tokenizer), or
for a byte-level model without one (a vocabulary of 256: token id = byte, as the bundled example's) a tokenizer.json
that maps each byte to itself (Hugging Face tokenizers' byte-level BPE with no merges). Each prompt is text its
tokenizer encodes as exactly the prompt length's tokens. On the host, times come from the runner's token callback
(`time.perf_counter`): the runner's own Stats are whole milliseconds, coarser than a decode step of a small model.
On a device, they are the `PyTorchObserver` line llama_main prints (milliseconds too: that is all the binary
reports).
"""

import contextlib
import json
import re
import shlex
import statistics
import time
from pathlib import Path

from mobilebuild.routes.executorch.worker import export_llm, pte
from mobilebuild.worker import device, quiet
from mobilebuild.worker import tokenizer as recipe_tokenizer

# The app-side runner the lm_bench stage times an artifact by, beside its runtime's generator (the family's runtime
# module names this module its `app_runner`): HARNESS, refusal_for, host_timings, device_timings
HARNESS = "ExecuTorch's LLM runner (TextLLMRunner)"

BYTES = 256
LLAMA_MAIN = f"{device.REMOTE_DIR}/llama_main"
# how ExecuTorch's examples/models/llama/README.md builds llama_main for Android, and where
BUILD_LLAMA_MAIN = ("in an ExecuTorch checkout as its examples/models/llama/README.md builds it for Android",
                    "cmake-out-android/examples/models/llama/llama_main")
PLACEHOLDER = "<|mobilebuild id {}|>"  # the runner's tokenizer's entry for an id of the model the tokenizer lacks
RUNNER_LOG = (b"[", b"I ", b"W ", b"E ")  # its log lines' starts (ExecuTorch's, its tokenizers')
OBSERVER = re.compile(r"PyTorchObserver (\{.*\})")


def refusal(program_methods, vocab, tokenizer=None):
    """Why the runner cannot time this program (None: it can), with the recipe's tokenizer file or without one."""
    if export_llm.METADATA_METHOD not in program_methods:
        return "the LLM runner takes export_llm's programs (tokens and input_pos in, its metadata methods) only"
    if tokenizer is None and vocab != BYTES:
        return (f"the LLM runner takes text and a tokenizer file: name the model's in generate.tokenizer (only a "
                f"byte-level vocabulary, {BYTES} token ids, gets one without; this model has {vocab})")
    return None


def refusal_for(generator, tokenizer, vocab):
    """Why the runner does not time the artifact `generator` runs (worker/lm.py), of `vocab` token ids, or None: it
    does. An ExecuTorch generator names its program's methods."""
    return refusal(getattr(generator, "method_names", ()), vocab, tokenizer)


def host_timings(artifact, scratch, prompt_lengths, new_tokens, warmup, runs, tokenizer=None, vocab=None):
    """time_on_host with the recipe's tokenizer (else the byte-level one), its runner's copy written in `scratch`
    (`vocab`: the model's vocabulary's size, see runner_tokenizer), and the artifact's program and weights
    (unpacked there where lm_lower zipped them)."""
    path, prompts = runner_tokenizer(scratch, tokenizer, prompt_lengths, vocab)
    program, weights = pte.unpacked(artifact, Path(scratch, "program"))
    return time_on_host(program, path, prompts, new_tokens, warmup, runs, weights)


def device_timings(artifact, scratch, device_settings, prompt_lengths, new_tokens, tokenizer=None, vocab=None):
    """time_on_device on benchmark.device's device, with the tokenizer, program and weights host_timings gives the
    runner."""
    path, prompts = runner_tokenizer(scratch, tokenizer, prompt_lengths, vocab)
    program, weights = pte.unpacked(artifact, Path(scratch, "program"))
    return time_on_device(program, path, serial=device_settings["serial"], prompts=prompts,
                          new_tokens=new_tokens, binary=device_settings["binary"], weights_path=weights)


def runner_tokenizer(scratch, tokenizer, prompt_lengths, vocab=None):
    """(the tokenizer file the runner loads, {prompt length: its text}): the recipe's, or for a byte-level model
    without one a byte-level tokenizer.json. A tokenizer.json is given to it without its decoder: the binding hands
    each token to Python as a str, and a random model's tokens decode to bytes that are no valid UTF-8
    (UnicodeDecodeError); each token is then its vocabulary entry. And with a placeholder entry for each id of the
    model's vocabulary (`vocab` ids) it lacks: a model's vocabulary is often larger than its tokenizer's (padded), and
    an id the runner's tokenizer does not have decoded to another token's text or, on a 135M-parameter Llama of 49152
    ids with a tokenizer of 8813, to invalid UTF-8."""
    if tokenizer is None:
        tokenizer = recipe_tokenizer.byte_level(Path(scratch) / "bytes-tokenizer.json")
    found = recipe_tokenizer.Tokenizer(tokenizer)
    prompts = {length: found.prompt(length) for length in prompt_lengths}
    if found.format != "tokenizers":
        return Path(tokenizer), prompts
    path = Path(scratch) / "runner-tokenizer.json"
    document = json.loads(Path(tokenizer).read_text())
    document["decoder"] = None
    entries = document["model"].get("vocab")
    if vocab and isinstance(entries, dict):
        held = set(entries.values()) | {added["id"] for added in document.get("added_tokens") or ()}
        entries.update({PLACEHOLDER.format(index): index for index in range(vocab) if index not in held})
    path.write_text(json.dumps(document))
    return path, prompts


def vocabulary(tokenizer_json):
    """{the runner's string for a token: its id} of a tokenizer.json without a decoder; {} for other formats."""
    if Path(tokenizer_json).suffix != ".json":
        return {}
    document = json.loads(Path(tokenizer_json).read_text())
    vocab = document["model"].get("vocab") or {}
    found = dict(vocab) if isinstance(vocab, dict) else {}  # a Unigram model's is a list of [piece, score]
    found.update({added["content"]: added["id"] for added in document.get("added_tokens") or ()})
    return found


def prompt_text(length):
    """`length` bytes of ASCII text: as many prompt tokens for a byte-level tokenizer."""
    return ("the quick brown fox jumps over the lazy dog " * (length // 44 + 1))[:length]


def time_on_host(pte_path, tokenizer_path, prompts, new_tokens, warmup, runs, weights_path=None):
    """{length: {ttft_ms, decode_ms_per_token, runs, generated, prompt_tokens, tokens}}: each prompt ({length:
    text}; None where no text has that many tokens: left out) generated greedily by the runner, the first token's
    callback giving the time to first token, the rest the decode steps; `prompt_tokens`: the prompt's length as the
    runner encoded it; `tokens`: the last run's token ids (None where the tokenizer's pieces do not name them)."""
    with _runner_quiet():  # its tokenizers' registration note, at import
        from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (export_llm's kernels, for it too)
        from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

        runner = TextLLMRunner(str(pte_path), str(tokenizer_path), str(weights_path) if weights_path else None)
    token_of = vocabulary(tokenizer_path)
    found = {}
    for length, prompt in prompts.items():
        if prompt is None:
            continue
        first_token, decode, generated = [], [], []
        for index in range(warmup + runs):
            stamps, pieces, stats = [], [], []

            def on_token(piece):
                stamps.append(time.perf_counter())
                pieces.append(piece)

            settings = GenerationConfig(echo=False, max_new_tokens=new_tokens, temperature=0.0)
            with _runner_quiet():
                started = time.perf_counter()
                runner.generate(prompt, settings, on_token, stats.append)
            runner.reset()
            if index >= warmup and stamps:
                first_token.append((stamps[0] - started) * 1e3)
                generated.append(len(stamps))
                if len(stamps) > 1:  # it stops early at an end-of-sequence token
                    decode.append((stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1))
        found[str(length)] = {"ttft_ms": statistics.median(first_token),
                              "decode_ms_per_token": statistics.median(decode) if decode else None,
                              "runs": runs, "generated": min(generated),
                              "prompt_tokens": stats[-1].num_prompt_tokens if stats else None,
                              "tokens": [token_of[piece] for piece in pieces] if set(pieces) <= set(token_of)
                              else None}
    return found


@contextlib.contextmanager
def _runner_quiet():
    """The runner prints each token and its statistics (stdout) and logs each step (stderr): kept out of the build's
    output; where it fails, its exception says only "Generation failed", so its last log line goes with it."""
    logged = []
    with quiet.native_stdout_dropped(), quiet.native_stderr(kept=logged, kept_prefix=RUNNER_LOG):
        try:
            yield
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {logged[-1].strip() if logged else 'the runner logged nothing'}") from None


def parse_observer(text):
    """{ttft_ms, decode_ms_per_token, generated, prompt_tokens} from llama_main's `PyTorchObserver {...}` line, its
    own figures in whole milliseconds."""
    lines = OBSERVER.findall(text)
    if not lines:
        raise ValueError("no 'PyTorchObserver {...}' line in the output")
    stats = json.loads(lines[-1])
    generated = stats["generated_tokens"]
    decode = ((stats["inference_end_ms"] - stats["first_token_ms"]) / (generated - 1)) if generated > 1 else None
    return {"ttft_ms": stats["first_token_ms"] - stats["inference_start_ms"], "decode_ms_per_token": decode,
            "generated": generated, "prompt_tokens": stats["prompt_tokens"]}


def time_on_device(pte_path, tokenizer_path, *, serial, prompts, new_tokens, binary=LLAMA_MAIN, adb=None,
                   timeout=600, weights_path=None):
    """Push the program, its weights (`weights_path`, a .ptd, where apart) and its tokenizer and run llama_main once
    per prompt length, as device.benchmark_on_device runs speed_benchmark_torch: "ran" with the binary's figures,
    else "skipped" or "failed" with the reason."""
    session = device.adb_session(serial, binary, adb, timeout, build=BUILD_LLAMA_MAIN)
    if session["status"] != "ready":
        return session
    run = session["run"]
    local = [pte_path, tokenizer_path, *([weights_path] if weights_path else [])]
    model, tokenizer, *weights = (f"{device.REMOTE_DIR}/{Path(path).name}" for path in local)
    try:
        for path, remote in zip(local, (model, tokenizer, *weights), strict=True):
            run(["push", str(path), remote], "adb push", shell=False)
        figures = {}
        for length, prompt in prompts.items():
            if prompt is None:
                continue
            argv = [binary, f"--model_path={model}", f"--tokenizer_path={tokenizer}", f"--prompt={prompt}",
                    f"--seq_len={length + new_tokens}", "--temperature=0",
                    *(f"--data_path={path}" for path in weights)]
            # adb joins the words after `shell` with spaces for the device's shell, so each is quoted for it
            ran = run([shlex.quote(word) for word in argv], "llama_main")
            try:
                figures[str(length)] = parse_observer(ran.stdout)
            except ValueError as error:
                return device.failed(f"llama_main: {error}: {device.tail(ran.stdout)}")
    except device.AdbFailed as failure:
        return device.failed(str(failure))
    return {"status": "ran", "serial": serial, "prompt_lengths": figures}
