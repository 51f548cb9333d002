"""The bundled language model's training (mobilebuild/examples/pydoc_lm.py): the recipe's model is a few million
parameters, the held-out text is never trained on, and training is deterministic and learns."""

from pathlib import Path

import torch
import yaml

from mobilebuild.examples import pydoc_lm

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "llm" / "pydoc_lm.yaml"


def _llama(**sizes):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(**sizes))


def test_the_recipes_model_has_a_few_million_parameters_and_a_context_the_training_fills():
    recipe = yaml.safe_load(RECIPE.read_text())
    model = _llama(**recipe["model"]["config"])
    assert 2e6 <= sum(parameter.numel() for parameter in model.parameters()) <= 4e6
    assert pydoc_lm.WINDOW == recipe["generate"]["max_context"]  # every cache position is trained


def test_the_held_out_bytes_are_the_texts_end():
    trained, held_out = pydoc_lm._split()
    assert torch.equal(pydoc_lm.heldout(), held_out[:8192])
    assert len(trained) > 8 * len(held_out) and int(held_out.max()) < pydoc_lm.VOCABULARY


def test_training_is_deterministic_and_learns():
    tiny = {"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 256}
    text = pydoc_lm.heldout()[:513].view(1, -1)

    def loss(model):
        with torch.no_grad():
            logits = model(text[:, :-1]).logits[0]
        return float(torch.nn.functional.cross_entropy(logits, text[0, 1:]))

    before = loss(_llama(**tiny))
    first, second = (pydoc_lm.train(_llama(**tiny), steps=30) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert loss(first) < before - 1.0  # from about ln 256 = 5.5 nats per byte


def test_the_recipes_tokenizer_is_the_byte_level_one_it_says(tmp_path):
    from mobilebuild.worker.tokenizer import Tokenizer, byte_level

    shipped = RECIPE.parent / yaml.safe_load(RECIPE.read_text())["generate"]["tokenizer"]
    assert shipped.read_bytes() == byte_level(tmp_path / "tokenizer.json").read_bytes()
    text = pydoc_lm.heldout_text()[:256]
    assert Tokenizer(shipped).encode(text) == list(text.encode())  # token id = byte, as the model was trained

