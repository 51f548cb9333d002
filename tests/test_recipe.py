"""Recipe loading: defaults from the schema, one line per problem naming file and field, paths kept inside."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, tiny_recipe

from mobilebuild.errors import RecipeErrors
from mobilebuild.plan import recipe, routes


def write(root, data, name="tiny.yaml"):
    path = root / "recipes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def problems(root, data, name="tiny.yaml"):
    write(root, data, name)
    with pytest.raises(RecipeErrors) as caught:
        recipe.load_all(root)
    return [str(e) for e in caught.value.errors]


def test_defaults_come_from_the_schema(tmp_path):
    write(tmp_path, {"name": "m", "model": {"torchvision": "mobilenet_v2"}, "input": {"shape": [1, 3, 4, 4]},
                     "targets": [{"backend": "xnnpack"}]})
    (loaded,) = recipe.load_all(tmp_path)
    assert loaded.file == "recipes/tiny.yaml"
    assert loaded.fuse == "auto" and loaded.script == "script"
    assert loaded.inputs == [{"name": "input", "shape": [1, 3, 4, 4], "dtype": "float32",
                              "memory_format": "contiguous"}]
    calibration = {"source": "random", "batches": 8, "seed": 0, "kwargs": {}}
    assert loaded.quantize == {"mode": "static", "calibration": calibration}
    assert loaded.prune is False and loaded.targets[0].prune is False
    assert loaded.model["seed"] == 0 and loaded.model["quantizable"] is False
    assert loaded.targets[0].optimize == {"blocklist": [], "preserved_methods": [], "bundled_inputs": True}
    assert len(loaded.sha256) == 64


def test_recipes_are_found_at_any_depth(tmp_path):
    write(tmp_path, tiny_recipe("a"), "team/vision/a.yaml")
    write(tmp_path, tiny_recipe("b"), "b.yml")
    assert [r.name for r in recipe.load_all(tmp_path)] == ["b", "a"]


@pytest.mark.parametrize("change, expected", [
    (lambda r: r.update(colour="blue"), "recipes/tiny.yaml: (top level): unknown key 'colour'"),
    (lambda r: r["targets"].append({"backend": "xnnpak"}), "recipes/tiny.yaml: targets[2].backend: expected one of"),
    (lambda r: r["targets"].append({"backend": "onnx", "runtime": "tflite"}),
     "recipes/tiny.yaml: targets[2].runtime: expected one of"),
    (lambda r: r["input"].update(shape=[1, 3, "8", 8]),
     'recipes/tiny.yaml: input.shape[2]: expected a size (an integer of at least 1) or a dim name from dims, got "8"'),
    (lambda r: r["input"].update(shape=[1, 3, "x", 8]),
     "recipes/tiny.yaml: input.shape[2]: 'x' is not a dim declared under dims (none declared)"),
    (lambda r: r.pop("name"), "recipes/tiny.yaml: (top level): missing required key 'name'"),
    (lambda r: r["model"].update(torchvision="resnet18"),
     "recipes/tiny.yaml: model: expected exactly one model source"),
    (lambda r: r["model"].update(checkpoint="w.pt", train={"function": "a:b"}),
     "recipes/tiny.yaml: model: 'checkpoint' and 'train' are exclusive"),
    (lambda r: r.update(fuse="yes"), "recipes/tiny.yaml: fuse: expected 'auto', false, or a list"),
    (lambda r: r.update(script="compile"), 'recipes/tiny.yaml: script: expected one of "script", "trace"'),
    (lambda r: r["quantize"]["calibration"].update(source="images"),
     "recipes/tiny.yaml: quantize.calibration: missing required key 'path'"),
    (lambda r: r["targets"][0].update(optimize={"blocklist": ["FOLD_EVERYTHING"]}),
     "recipes/tiny.yaml: targets[0].optimize.blocklist[0]: expected one of"),
    (lambda r: r["targets"].append({"backend": "xnnpack"}),
     "recipes/tiny.yaml: targets[2]: duplicate target id 'xnnpack'"),
])
def test_each_problem_is_one_line_naming_file_and_field(tmp_path, change, expected):
    data = tiny_recipe()
    change(data)
    found = problems(tmp_path, data)
    assert any(line.startswith(expected) for line in found), found
    assert all("\n" not in line for line in found)


def test_a_misspelling_gets_a_did_you_mean(tmp_path):
    data = tiny_recipe()
    data["targets"][0].update(optimise={}, backend="qnnpak")
    data["colour"] = "blue"
    found = problems(tmp_path, data)
    assert any(line.startswith("recipes/tiny.yaml: targets[0]: unknown key 'optimise' (allowed: ")
               and line.endswith("; did you mean 'optimize'?") for line in found), found
    assert any(line.startswith("recipes/tiny.yaml: targets[0].backend: expected one of ")
               and line.endswith('got "qnnpak"; did you mean "qnnpack"?') for line in found), found
    assert any(line.startswith("recipes/tiny.yaml: (top level): unknown key 'colour'") and "did you mean" not in line
               for line in found), found  # nothing close: no guess


def test_yaml_syntax_errors_name_the_line(tmp_path):
    (line,) = problems(tmp_path, "name: x\nmodel: [\n")
    assert line.startswith("recipes/tiny.yaml: line 3, column 1: invalid YAML")


def test_a_recipe_must_be_a_mapping(tmp_path):
    (line,) = problems(tmp_path, "- just\n- a list\n")
    assert line.startswith("recipes/tiny.yaml: expected a mapping")


def test_duplicate_names_across_files(tmp_path):
    write(tmp_path, tiny_recipe("same"), "a.yaml")
    (line,) = problems(tmp_path, tiny_recipe("same"), "b.yaml")
    assert line == "recipes/b.yaml: name: duplicate recipe name 'same' (also in recipes/a.yaml)"


@pytest.mark.parametrize("path, message", [
    ("../../outside.pt", "leaves the repository"),
    ("/etc/passwd", "expected a path relative to the recipe, got absolute path"),
    ("missing.pt", "'missing.pt' does not exist"),
    ("escape/weights.pt", "leaves the repository"),
])
def test_paths_stay_inside_the_repository(tmp_path, path, message):
    repo = tmp_path / "repo"
    (repo / "recipes").mkdir(parents=True)
    (tmp_path / "outside.pt").write_bytes(b"x")
    os.symlink(tmp_path, repo / "recipes" / "escape")
    data = tiny_recipe()
    data["model"]["checkpoint"] = path
    (line,) = problems(repo, data)
    assert line.startswith("recipes/tiny.yaml: model.checkpoint: ") and message in line


def test_paths_resolve_relative_to_the_recipe(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "w.pt").write_bytes(b"x")
    data = tiny_recipe()
    data["model"]["checkpoint"] = "../../weights/w.pt"
    write(tmp_path, data, "team/tiny.yaml")
    (loaded,) = recipe.load_all(tmp_path)
    assert loaded.model["checkpoint"] == "weights/w.pt"


def test_field_path_formatting():
    assert recipe.field_path(["targets", 1, "backend"]) == "targets[1].backend"
    assert recipe.field_path(["input", "shape", 0]) == "input.shape[0]"
    assert recipe.field_path([]) == ""


def test_validated_recipes_are_cached_by_content(tmp_path, monkeypatch):
    path = write(tmp_path, tiny_recipe())
    (first,) = recipe.load_all(tmp_path)

    def no_validation():
        raise AssertionError("validated again")

    monkeypatch.setattr(recipe, "_validator", no_validation)
    (again,) = recipe.load_all(tmp_path)
    assert again == first
    edited = path.read_text().replace("batches: 16", "batches: 3")
    assert edited != path.read_text()
    path.write_text(edited)
    with pytest.raises(AssertionError, match="validated again"):
        recipe.load_all(tmp_path)


# --- the schema editors read --------------------------------------------------------------------------------------

EDITOR_HINT = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")


def test_the_schema_file_is_what_the_route_families_make():
    """recipe.schema.json is generated (`mobilebuild schema --write`): built-in families only, in a fresh process."""
    made = subprocess.run([sys.executable, "-m", "mobilebuild.cli", "schema"], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout
    assert made == recipe.SCHEMA_PATH.read_text(), "run `mobilebuild schema --write`"


def test_a_family_adding_a_setting_drifts_from_the_schema_file(monkeypatch):
    assert recipe.schema_text() == recipe.SCHEMA_PATH.read_text()
    monkeypatch.setitem(routes.get("onnx", "onnxruntime").section.schema["properties"], "new", {"type": "integer"})
    assert recipe.schema_text() != recipe.SCHEMA_PATH.read_text()


@pytest.mark.parametrize("path", sorted([*REPO.glob("recipes/*.yaml"), *REPO.glob("examples/*/*.yaml")]),
                         ids=lambda path: path.name)
def test_each_bundled_recipe_points_an_editor_at_the_schema_and_is_valid_there(path):
    import jsonschema

    hint = EDITOR_HINT.match(path.read_text().splitlines()[0])
    assert hint, f"{path}: first line: # yaml-language-server: $schema=<relative path to recipe.schema.json>"
    schema_file = (path.parent / hint[1]).resolve()
    assert schema_file == recipe.SCHEMA_PATH.resolve()
    errors = list(jsonschema.Draft202012Validator(json.loads(schema_file.read_text())).iter_errors(
        yaml.safe_load(path.read_text())))
    assert errors == []  # what an editor shows: LiteRT targets and every family's section included
