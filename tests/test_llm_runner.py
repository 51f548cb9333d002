"""ExecuTorch's LLM runner as the timing harness (routes/executorch/worker/llm_runner.py): the byte-level tokenizer,
llama_main's statistics line, the adb flow against the fake `adb` of test_device (this machine has neither adb nor a
device), and (slow) the runner's Python binding on a real export_llm program, its greedy tokens as the generator's."""

import json
from types import SimpleNamespace

import pytest
import torch
from test_device import SERIAL, FakeAdb

from mobilebuild.routes.executorch.worker import llm_runner

LLAMA_MAIN = "/data/local/tmp/llama_main"
PROMPTS = {16: llm_runner.prompt_text(16), 64: llm_runner.prompt_text(64)}
# llama_main's statistics line, as the runner printed it for the tiny byte-level Llama of the slow test below
OBSERVER = ('PyTorchObserver {"prefill_token_per_sec":64000,"prompt_tokens":64,"generated_tokens":15,'
            '"model_load_start_ms":1795725853893,"model_load_end_ms":1795725853894,'
            '"inference_start_ms":1795725853973,"inference_end_ms":1795725853988,"prompt_eval_end_ms":1795725853974,'
            '"first_token_ms":1795725853976,"aggregate_sampling_time_ms":0,"SCALING_FACTOR_UNITS_PER_SECOND":1000}')


def test_the_byte_level_tokenizer_gives_each_byte_its_own_id_and_the_runners_copy_no_decoder(tmp_path):
    from mobilebuild.worker.tokenizer import Tokenizer, byte_level

    tokenizer = Tokenizer(byte_level(tmp_path / "tokenizer.json"))
    text = "def f(x):\n    return x  # é, ü\t"
    assert tokenizer.encode(text) == list(text.encode()) and tokenizer.decode(tokenizer.encode(text)) == text
    path, prompts = llm_runner.runner_tokenizer(tmp_path, None, [16, 64])
    assert json.loads(path.read_text())["decoder"] is None
    assert [len(tokenizer.encode(prompts[length])) for length in (16, 64)] == [16, 64]
    assert len(tokenizer.encode(llm_runner.prompt_text(64))) == 64


def test_the_runner_times_export_llms_programs_with_a_tokenizer_or_a_byte_vocabulary():
    assert llm_runner.refusal(["forward", "get_max_seq_len"], 256) is None
    assert "export_llm's programs" in llm_runner.refusal(["forward"], 256)
    assert "name the model's in generate.tokenizer" in llm_runner.refusal(["forward", "get_max_seq_len"], 64)
    assert llm_runner.refusal(["forward", "get_max_seq_len"], 64, "tokenizer.json") is None


def test_parses_llama_mains_statistics_line():
    found = llm_runner.parse_observer(f"Once upon a time\n{OBSERVER}\n")
    assert found == {"ttft_ms": 3, "decode_ms_per_token": 12 / 14, "generated": 15, "prompt_tokens": 64}
    with pytest.raises(ValueError, match="no 'PyTorchObserver"):
        llm_runner.parse_observer("Segmentation fault\n")


@pytest.fixture
def adb(tmp_path, monkeypatch):
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    fake = FakeAdb(directory)
    fake.reply("ls", f"{LLAMA_MAIN}\n")
    fake.reply("benchmark", OBSERVER + "\n")
    return fake


@pytest.fixture
def files(tmp_path):
    program, tokenizer = tmp_path / "lm-xnnpack-executorch.pte", tmp_path / "tokenizer.json"
    program.write_bytes(b"not really a program")
    tokenizer.write_text("{}")
    return program, tokenizer


def test_on_a_device_it_pushes_the_program_and_tokenizer_and_runs_llama_main_per_prompt_length(adb, files):
    found = llm_runner.time_on_device(*files, serial=SERIAL, prompts=PROMPTS, new_tokens=8)
    assert found["status"] == "ran" and set(found["prompt_lengths"]) == {"16", "64"}
    assert found["prompt_lengths"]["64"]["ttft_ms"] == 3
    calls = adb.calls
    assert calls[:2] == [["devices"], ["-s", SERIAL, "shell", "ls", LLAMA_MAIN]]
    assert [call[2:4] for call in calls[2:4]] == [["push", str(files[0])], ["push", str(files[1])]]
    run = calls[4]
    assert run[3:6] == [LLAMA_MAIN, "--model_path=/data/local/tmp/lm-xnnpack-executorch.pte",
                        "--tokenizer_path=/data/local/tmp/tokenizer.json"]
    assert run[6] == f"'--prompt={llm_runner.prompt_text(16)}'"  # quoted for the device's shell
    assert run[7:] == ["--seq_len=24", "--temperature=0"]


def test_on_a_device_a_program_with_its_weights_apart_gets_them_pushed_and_named_its_data_path(adb, files, tmp_path):
    weights = tmp_path / "model.ptd"
    weights.write_bytes(b"not really weights")
    found = llm_runner.time_on_device(*files, serial=SERIAL, prompts={16: PROMPTS[16]}, new_tokens=8,
                                      weights_path=weights)
    assert found["status"] == "ran"
    assert [call[2:4] for call in adb.calls[2:5]] == [["push", str(path)] for path in (*files, weights)]
    assert adb.calls[5][-1] == "--data_path=/data/local/tmp/model.ptd"


def test_without_a_device_or_its_runner_it_says_why_in_one_line(adb, files):
    found = llm_runner.time_on_device(*files, serial=None, prompts={16: PROMPTS[16]}, new_tokens=8)
    assert found["status"] == "skipped" and "no device selected" in found["reason"]
    adb.reply("ls", f"ls: {LLAMA_MAIN}: No such file or directory\n", exit=1)
    found = llm_runner.time_on_device(*files, serial=SERIAL, prompts={16: PROMPTS[16]}, new_tokens=8)
    assert found["status"] == "skipped" and found["reason"].startswith(f"{LLAMA_MAIN} not found on device {SERIAL}")
    assert "llama_main" in found["reason"] and "\n" not in found["reason"]


def test_output_without_the_statistics_line_fails(adb, files):
    adb.reply("benchmark", "E 00:00:00 method.cpp:819] Missing operator: llama::custom_sdpa.out\n")
    found = llm_runner.time_on_device(*files, serial=SERIAL, prompts={16: PROMPTS[16]}, new_tokens=8)
    assert found["status"] == "failed" and "Missing operator" in found["reason"]


def export_llm_program(tmp_path, vocab):
    """A tiny random Llama of `vocab` tokens through export_llm: (the program's path, the build's generator of it)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from mobilebuild.routes.executorch.worker import export_llm
    from mobilebuild.routes.executorch.worker import runtime as et_runtime
    from mobilebuild.routes.executorch.worker.setup import ensure_flatc

    ensure_flatc()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128)).eval()
    program = tmp_path / "lm.pte"
    program.write_bytes(export_llm.program_bytes(model, "fp32", 96, 32, str(tmp_path)))
    return program, et_runtime.Generator(program.read_bytes())


@pytest.mark.slow
def test_the_runner_on_the_host_generates_the_generators_greedy_tokens(tmp_path):
    """A tiny byte-level Llama through export_llm: ExecuTorch's runner (text in, the byte tokenizer) and the build's
    generator (token ids in) continue each prompt with the same tokens; the runner's timings are positive."""
    from mobilebuild.routes.executorch.worker import runtime as et_runtime
    from mobilebuild.worker import lm
    from mobilebuild.worker.stages import lm_bench

    program, generator = export_llm_program(tmp_path, 256)
    found = llm_runner.time_on_host(program, llm_runner.runner_tokenizer(tmp_path, None, [])[0], PROMPTS,
                                    new_tokens=8, warmup=1, runs=2)
    for length in (16, 64):
        prompt = torch.tensor([list(llm_runner.prompt_text(length).encode())])
        assert found[str(length)]["tokens"] == lm.greedy(generator, prompt, 8)[1]
        assert found[str(length)]["ttft_ms"] > 0 and found[str(length)]["decode_ms_per_token"] > 0

    # lm_bench times it both ways: the runner an app embeds (the report ranks on it), the generator as a cross-check
    config = SimpleNamespace(runtime="executorch", runtime_module=et_runtime.__name__, prompt_lengths=[16],
                             new_tokens=8, timing={"warmup": 1, "iters": 16, "threads": 1})
    timed = lm_bench.measure({"config": config, "path": str(program), "label": "lm", "scratch": str(tmp_path),
                             "tokenizer": None})
    assert timed["harness"] == llm_runner.HARNESS and timed["generator"]["harness"] == lm_bench.GENERATOR
    for harness in (timed, timed["generator"]):
        assert harness["decode_tokens_per_s"] > 0 and harness["prompt_lengths"]["16"]["ttft_ms"] > 0


@pytest.mark.slow
def test_with_a_bpe_tokenizer_the_runner_generates_the_generators_greedy_tokens(tmp_path):
    """A tiny Llama of a BPE tokenizer's vocabulary (trained with Hugging Face tokenizers on Python's help texts):
    the runner, given that tokenizer, reads each prompt as the prompt length's tokens and continues it as the
    generator does from the same token ids."""
    from mobilebuild.examples import pydoc_lm
    from mobilebuild.worker import lm
    from mobilebuild.worker.tokenizer import Tokenizer

    tokenizer = pydoc_lm.bpe_tokenizer(tmp_path / "tokenizer.json", vocab_size=384)
    program, generator = export_llm_program(tmp_path, 384)
    path, prompts = llm_runner.runner_tokenizer(tmp_path, tokenizer, [16, 64])
    found = llm_runner.time_on_host(program, path, prompts, new_tokens=8, warmup=0, runs=1)
    for length in (16, 64):
        prompt = torch.tensor([Tokenizer(tokenizer).encode(prompts[length])])
        assert prompt.shape[1] == length == found[str(length)]["prompt_tokens"]
        assert found[str(length)]["tokens"] == lm.greedy(generator, prompt, 8)[1]


@pytest.mark.slow
def test_with_a_sentencepiece_model_the_runner_reads_prompts_of_the_prompt_lengths(tmp_path):
    """A SentencePiece BPE model (trained by sentencepiece on Python's help texts) is given to the runner as it is:
    it encodes each prompt as the prompt length's tokens and generates; its pieces are text, not token ids."""
    from pydoc_data.topics import topics

    import sentencepiece

    text = "\n".join(topics[name] for name in sorted(topics))
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(text.splitlines()),
                                             model_prefix=str(tmp_path / "tokenizer"), vocab_size=384,
                                             model_type="bpe", byte_fallback=True, minloglevel=2)
    program, _ = export_llm_program(tmp_path, 384)
    path, prompts = llm_runner.runner_tokenizer(tmp_path, tmp_path / "tokenizer.model", [16, 64])
    assert path == tmp_path / "tokenizer.model"
    found = llm_runner.time_on_host(program, path, prompts, new_tokens=8, warmup=0, runs=1)
    for length in ("16", "64"):
        assert found[length]["prompt_tokens"] == int(length) and found[length]["generated"] >= 1
        assert found[length]["tokens"] is None and found[length]["ttft_ms"] > 0


@pytest.mark.slow
def test_the_runners_tokenizer_covers_a_vocabulary_larger_than_the_tokenizers(tmp_path):
    """A model of 4096 ids with a tokenizer of 320 (a model's vocabulary is often padded past its tokenizer's): the
    random model generates ids the tokenizer lacks, which the runner decoded to other tokens' text (or invalid UTF-8);
    with a placeholder for each, the runner's greedy tokens are the generator's."""
    from mobilebuild.examples import pydoc_lm
    from mobilebuild.worker import lm
    from mobilebuild.worker.tokenizer import Tokenizer

    tokenizer = pydoc_lm.bpe_tokenizer(tmp_path / "tokenizer.json", vocab_size=320)
    program, generator = export_llm_program(tmp_path, 4096)
    path, prompts = llm_runner.runner_tokenizer(tmp_path, tokenizer, [16], vocab=4096)
    found = llm_runner.time_on_host(program, path, prompts, new_tokens=8, warmup=0, runs=1)
    expected = lm.greedy(generator, torch.tensor([Tokenizer(tokenizer).encode(prompts[16])]), 8)[1]
    assert max(expected) >= 320 and found["16"]["tokens"] == expected
