"""A language model's ExecuTorch artifact with its weights apart (routes/executorch/lm_package.py): the plan names
it a zip where the LM head stays float; an LM head tied to the embedding is stored once, on both of lm_lower's
paths (export_llm's, transformers' static-cache export); the pair gives the logits the one .pte gives, through the
build's generator and ExecuTorch's LLM runner."""

import copy
import zipfile
from types import SimpleNamespace

import pytest
import torch
from test_generation import LM, write

import mobilebuild.routes  # noqa: F401  (the route families register their stages)
from mobilebuild.plan import graph, recipe
from mobilebuild.routes.executorch import lm_package
from mobilebuild.worker import archive

TIED = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64,
        "tie_word_embeddings": True}
EMBEDDING_BYTES = 4096 * 64 * 4


def test_the_plan_packs_program_and_weights_where_the_lm_head_stays_float(tmp_path):
    data = copy.deepcopy(LM)
    data["targets"] = [{"backend": "xnnpack", "runtime": "executorch"},
                       {"backend": "xnnpack", "runtime": "executorch", "precision": "8da4w", "name": "q"},
                       {"backend": "xnnpack", "runtime": "executorch", "precision": "8da4w", "name": "head",
                        "quantize": {"exclude": ["lm_head"]}}]
    write(tmp_path, data)
    (loaded,) = recipe.load_all(tmp_path)
    outputs = {node.task_name: node.output for node in graph.recipe_nodes(loaded, str(tmp_path))
               if node.stage == "lm_lower"}
    assert outputs == {"lm_lower:lm-xnnpack-executorch": "artifacts/lm/lm-xnnpack-executorch.zip",
                       "lm_lower:lm-q": "artifacts/lm/lm-q.pte", "lm_lower:lm-head": "artifacts/lm/lm-head.zip"}


def _model(model_type):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    extra = {"head_dim": 32, "sliding_window": 16} if model_type == "gemma3_text" else {}
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **TIED, **extra)).eval()


def _both(model_type, scratch):
    """(the one .pte's bytes, the zip of program and weights) of a tiny tied model on lm_lower's path for it."""
    from mobilebuild.routes.executorch.worker import export_llm, lm_lower
    from mobilebuild.routes.executorch.worker.setup import ensure_flatc

    ensure_flatc()
    model, packed = _model(model_type), scratch / "apart.zip"
    config = SimpleNamespace(precision="fp32", group_size=None, max_context=32)
    if model_type == "llama":
        assert export_llm.fits(model, "fp32")
        inline = export_llm.program_bytes(model, "fp32", 32, None, str(scratch))
        (scratch / "apart").mkdir()
        export_llm.write_program(model, "fp32", 32, None, str(scratch / "apart"), weights_apart=True)
        folder = scratch / "apart"
    else:
        inline = lm_lower.program_bytes(_model(model_type), config)
        manager, folder = lm_lower.lowered(model, config, weights_apart=True), scratch
        manager.save(str(folder / lm_package.PROGRAM))
        manager.write_tensor_data_to_file(str(folder))
    archive.write_zip({name: folder / name for name in (lm_package.PROGRAM, lm_package.WEIGHTS)}, packed)
    return inline, packed


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_a_tied_lm_head_is_stored_once_with_the_weights_apart_and_gives_the_same_logits(tmp_path, model_type):
    from mobilebuild.routes.executorch.worker import runtime as et_runtime

    inline, packed = _both(model_type, tmp_path)
    with zipfile.ZipFile(packed) as archived:
        sizes = {entry.filename: entry.file_size for entry in archived.infolist()}
    assert set(sizes) == {lm_package.PROGRAM, lm_package.WEIGHTS} and sizes[lm_package.PROGRAM] < EMBEDDING_BYTES / 8
    assert len(inline) - packed.stat().st_size > 0.9 * EMBEDDING_BYTES  # the embedding's second copy, gone
    prompt, config = torch.arange(1, 9).view(1, 8), SimpleNamespace()
    one, pair = et_runtime.generator(inline, config), et_runtime.generator(packed, config)
    assert torch.equal(one.forward(prompt, 0), pair.forward(prompt, 0))
    assert torch.equal(one.forward(torch.tensor([[7]]), 8), pair.forward(torch.tensor([[7]]), 8))


@pytest.mark.slow
def test_the_llm_runner_generates_from_the_program_and_its_weights_as_the_generator_does(tmp_path):
    from mobilebuild.routes.executorch.worker import llm_runner
    from mobilebuild.routes.executorch.worker import runtime as et_runtime
    from mobilebuild.worker import lm

    _, packed = _both("llama", tmp_path)
    generator = et_runtime.generator(packed, SimpleNamespace())
    tokenizer, prompts = llm_runner.runner_tokenizer(tmp_path, None, [16], vocab=4096)
    found = llm_runner.host_timings(packed, tmp_path, [16], 4, 0, 1, vocab=4096)
    prompt = torch.tensor([list(llm_runner.prompt_text(16).encode())])
    assert found["16"]["tokens"] == lm.greedy(generator, prompt, 4)[1]
