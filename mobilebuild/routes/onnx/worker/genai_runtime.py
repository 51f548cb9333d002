"""onnxruntime-genai, the engine ONNX Runtime's LLM apps embed, running a model folder lm_genai zipped: the build's
generator (worker/lm.py) on its Generator, a step at a time (append_tokens, the logits of what was appended), and
the app's own loop (`app_runner`: append the prompt, then generate_next_token until the new tokens are made).

The zip is unpacked into a temporary folder that lives as long as the generator: the engine opens a folder."""

import statistics
import sys
import tempfile
import time
import zipfile

import torch

from mobilebuild.worker import quiet

# The loop the lm_bench stage times an artifact by, beside the generator (worker/stages/lm_bench.py)
HARNESS = "onnxruntime-genai's generation loop (generate_next_token)"


class Generator:
    """The engine's Generator, one per sequence: forward(tokens, position) appends the tokens at `position` (0
    starts a new sequence) and returns their logits [1, T, vocab]."""

    def __init__(self, path, max_length):
        import onnxruntime_genai as og

        self._og, self._folder = og, tempfile.TemporaryDirectory(prefix="mobilebuild-genai-")
        with zipfile.ZipFile(path) as archive:
            archive.extractall(self._folder.name)
        with quiet.native_stderr(once=True):
            self.model = og.Model(self._folder.name)
        self.max_length, self.generator, self.length = max_length, None, 0

    def new_sequence(self):
        settings = self._og.GeneratorParams(self.model)
        settings.set_search_options(do_sample=False, max_length=self.max_length, batch_size=1)
        self.generator, self.length = self._og.Generator(self.model, settings), 0
        return self.generator

    def forward(self, tokens, position):
        if position == 0 or self.generator is None:
            self.new_sequence()
        if position != self.length:
            raise ValueError(f"onnxruntime-genai appends tokens in order: position {position}, {self.length} held")
        self.generator.append_tokens(tokens.numpy())
        self.length += tokens.shape[1]
        return torch.from_numpy(self.generator.get_output("logits").copy()).float()


def generator(path, config):
    return Generator(path, config.max_context)


# --- the app's loop, lm_bench's runner (worker/runtimes: app_runner) -------------------------------------------------

def refusal_for(generator, tokenizer, vocab):
    """The engine takes token ids: it times every model."""
    return None


def host_timings(path, scratch, prompt_lengths, new_tokens, warmup, runs, tokenizer=None, vocab=None):
    """{length: {ttft_ms, decode_ms_per_token, runs, generated, tokens}}: the prompt appended, then
    generate_next_token (the engine's own greedy choice and step) until the new tokens are made; the first token's
    time from the prompt's append, the rest the decode steps."""
    engine = Generator(path, max(prompt_lengths) + new_tokens)
    found = {}
    for length in prompt_lengths:
        first_token, decode, tokens = [], [], []
        for index in range(warmup + runs):
            sequence = engine.new_sequence()
            stamps, tokens = [], []
            started = time.perf_counter()
            sequence.append_tokens(torch.zeros(1, length, dtype=torch.long).numpy())
            while len(tokens) < new_tokens and not sequence.is_done():
                sequence.generate_next_token()
                stamps.append(time.perf_counter())
                tokens.append(int(sequence.get_next_tokens()[0]))
            if index >= warmup:
                first_token.append((stamps[0] - started) * 1e3)
                if len(stamps) > 1:
                    decode.append((stamps[-1] - stamps[0]) * 1e3 / (len(stamps) - 1))
        found[str(length)] = {"ttft_ms": statistics.median(first_token),
                              "decode_ms_per_token": statistics.median(decode) if decode else None, "runs": runs,
                              "generated": len(tokens), "tokens": tokens}
    return found


app_runner = sys.modules[__name__]  # this module is its own app runner: HARNESS, refusal_for, host_timings
