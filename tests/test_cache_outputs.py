"""Models whose outputs hold a cache object (GPT-2 with use_cache): verification flattens it as torch.export does;
where a route cannot take it, one line names the object and what works (not advice about control flow)."""

import pytest
import torch
from test_hub_sources import GPT2

from mobilebuild.errors import MobileBuildError
from mobilebuild.routes.executorch.worker import lower
from mobilebuild.routes.onnx.worker import export
from mobilebuild.routes.torchscript.worker import script
from mobilebuild.worker import outputs
from mobilebuild.worker.stages import modeling

SPECS = [{"name": "input_ids", "shape": [1, 8], "dtype": "int64", "memory_format": "contiguous", "range": [0, 100]}]


@pytest.fixture(scope="module")
def cached_gpt2():
    return modeling.build_model({"transformers": "AutoModelForCausalLM", "config": {**GPT2, "use_cache": True},
                                 "inputs": ["input_ids"]}, seed=0).eval()


def test_a_cache_output_flattens_as_torch_export_flattens_it(cached_gpt2):
    examples = modeling.example_inputs(SPECS)
    with torch.no_grad():
        found = outputs.leaves(cached_gpt2(*examples))
    assert [name for name, _ in found] == ["logits", "cache.key_cache.0", "cache.key_cache.1", "cache.value_cache.0",
                                           "cache.value_cache.1"]
    program = torch.export.export(cached_gpt2, examples, strict=False)
    exported = torch.utils._pytree.tree_leaves(program.module()(*examples))
    assert all(torch.allclose(mine, theirs, atol=1e-6) for (_, mine), theirs in zip(found, exported, strict=True))
    assert outputs.held_objects(cached_gpt2, examples) == "a DynamicCache at `cache`"


def test_torchscript_refuses_a_cache_output_in_one_line_naming_it(cached_gpt2):
    with pytest.raises(MobileBuildError) as caught:
        script.saved(cached_gpt2, "script", SPECS)
    message = str(caught.value)
    assert message.startswith("script: the model returns a DynamicCache at `cache`: TorchScript returns only")
    assert "leave use_cache out of the model's config" in message and "control flow" not in message


@pytest.mark.slow
def test_executorch_and_onnx_name_the_cache_and_the_failure_they_reproduce(cached_gpt2):
    """torch 2.12.1: torch.export captures the cache (transformers' pytree registration), then run_decompositions
    fails on the tensor constants the cache creates; the same happens to torch.export alone."""
    examples = modeling.example_inputs(SPECS)
    with pytest.raises(IndexError):  # the library alone
        torch.export.export(cached_gpt2, examples, strict=False).run_decompositions({})
    for build in (lambda: lower.lower_to_bytes(cached_gpt2, SPECS, "xnnpack", "fp32"),
                  lambda: export.export_float(cached_gpt2, SPECS)):
        with pytest.raises(MobileBuildError) as caught:
            build()
        message = caught.value.message
        assert message.startswith("the model returns a DynamicCache at `cache`; torch.export takes it apart")
        assert "(IndexError: list index out of range, with torch " in message and "control flow" not in message
