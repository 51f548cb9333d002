"""benchmarks/lm_zoo.py's recipes: each model's published configuration plans for every language-model target, or
the plan refuses the target in one line (LiteRT's generative path takes Llama and Qwen2 only). No build here."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import lm_zoo  # noqa: E402


def test_every_zoo_model_plans_for_every_target_or_is_refused_in_one_line(tmp_path):
    from mobilebuild.examples import pydoc_lm

    (tmp_path / "recipes").mkdir()
    pydoc_lm.bpe_tokenizer(tmp_path / "recipes" / "tokenizer.json", vocab_size=512)
    for name in lm_zoo.MODELS:
        data = lm_zoo.recipe(name, 2, list(lm_zoo.TARGETS))
        assert data["model"]["config"]["num_hidden_layers"] == 2
        refused = lm_zoo.plan_refusals(tmp_path, data)
        litert = {target for target, settings in lm_zoo.TARGETS.items()
                  if settings.get("runtime", "").startswith("litert")}
        assert set(refused) == (litert if name.startswith("Gemma") else set()), refused
        assert all("model_type 'gemma3_text'" in line and "\n" not in line for line in refused.values()), refused
    assert not list((tmp_path / "recipes").glob("*.yaml"))  # each target planned alone, its recipe removed
