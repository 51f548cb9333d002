"""The project's graph (plan/project.py): the valid recipes' nodes, and the problems of the others, per file."""

import yaml
from conftest import tiny_recipe

from mobilebuild.plan import project


def write(root, relative, recipe):
    path = root / "recipes" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(recipe))


def test_invalid_recipes_are_left_out_and_named_by_file(tmp_path):
    write(tmp_path, "good.yaml", tiny_recipe("good"))
    write(tmp_path, "mine/schema.yaml", {**tiny_recipe("schema"), "colour": "blue"})
    write(tmp_path, "mine/copy.yaml", tiny_recipe("good"))
    write(tmp_path, "mine/missing_calibration.yaml",
          tiny_recipe("calib", quantize={"calibration": {"source": "images", "path": "nowhere"}}))

    nodes, invalid = project.load(tmp_path)

    assert {node.recipe for node in nodes} == {"good"}
    assert sorted(invalid) == ["recipes/mine/copy.yaml", "recipes/mine/missing_calibration.yaml",
                               "recipes/mine/schema.yaml"]
    assert [str(p) for p in invalid["recipes/mine/copy.yaml"]] == [
        "recipes/mine/copy.yaml: name: duplicate recipe name 'good' (also in recipes/good.yaml)"]
    assert all(str(p).startswith(f"{file}: ") for file, problems in invalid.items() for p in problems)
    assert project.nodes(tmp_path) == nodes
