"""The README and docs/: links that lead somewhere, a recipe that validates, and no count stated by hand that the
recipes contradict (docs/examples.md is written from a build by benchmarks/examples_facts.py). No torch here."""

import re

import pytest
from conftest import REPO

from mobilebuild.plan import recipe

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLES = REPO / "docs" / "examples.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [link for link in links if "://" not in link and not (page.parent / link).exists()]
    assert missing == []


def test_the_front_page_recipe_validates(tmp_path):
    text = (REPO / "README.md").read_text()
    (block,) = [block for block in re.findall(r"```yaml\n(.*?)```", text, re.S) if "targets:" in block]
    path = tmp_path / "recipes" / "example.yaml"
    path.parent.mkdir()
    path.write_text(block)
    loaded = recipe.load(path, tmp_path)
    assert [target.id for target in loaded.targets] == ["xnnpack", "qnnpack", "xnnpack-executorch", "onnx"]


def test_the_front_page_states_no_count_that_drifts():
    """Test, task, artifact and target counts change with every merge: the README names none (docs/examples.md has
    a build's)."""
    text = (REPO / "README.md").read_text()
    counted = r"\b\d[\d,]* (?:tests?|tasks?|deployable|artifacts?|targets?|recipes?|broken inputs?)\b"
    assert re.findall(counted, text) == []


def test_pyproject_points_at_sections_that_exist():
    text = (REPO / "pyproject.toml").read_text()
    readme = (REPO / "README.md").read_text()
    for section in re.findall(r"see README, ([A-Z][\w ]+)\)", text):
        assert f"\n## {section}\n" in readme, section
    for page in re.findall(r"see (docs/[\w.]+)\)", text):
        assert (REPO / page).is_file(), page


def test_the_examples_page_matches_the_recipes():
    """Written from a build; its counts must still be the recipes' (run benchmarks/examples_facts.py after changing
    the examples)."""
    text = EXAMPLES.read_text()
    assert "<!-- written by benchmarks/examples_facts.py from a build of the examples" in text
    recipes = {loaded.name: loaded for loaded in recipe.load_all(REPO)}
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+) \| [^|]+ \| ([^|]+) \|$", text, re.M)
    assert {name for name, *_ in rows} == set(recipes)
    for name, targets, built, pick in rows:
        ids = [target.id for target in recipes[name].targets]
        assert int(targets) == len(ids) and int(built) <= len(ids), name
        shipped = re.match(r"Ship (\S+) ", pick)
        assert shipped is None or shipped.group(1) in ids, (name, pick)
    total = sum(len(loaded.targets) for loaded in recipes.values())
    assert f"- {len(recipes)} recipes, {total} targets, " in text
