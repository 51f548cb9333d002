"""`mobilebuild tune` (issue 14): the search on fake outcomes (no torch, no build), the patch of the recipe file, bad
input as one line each, and a real tune of the model with one broken block (tests/test_exclude.py)."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
import yaml
from conftest import tiny_recipe

from mobilebuild.plan import graph, recipe
from mobilebuild.tune import command, patch, search
from mobilebuild.worker import metrics

# --- the search, on outcomes made up to behave like the broken model's ----------------------------------------------

RANKING = ["fc", "broken.1", "head", "broken.0", "stem", "act"]  # what the eager layers stage ranks on it


def broken_model(candidate):
    """Passes with the whole broken block float (its parent: eager mode re-quantizes between two float islands), with
    any observer but moving_average; more float layers cost latency."""
    fixed = "broken" in candidate.exclude and candidate.observer != "moving_average"
    sqnr = 31.0 if fixed else 4.0 + candidate.floats / 10
    return search.Outcome(missed=[] if fixed else [f"sqnr_db {sqnr:.4g} < 15"], metrics={"sqnr_db": sqnr},
                          median_ms=1.0 + 0.1 * candidate.floats + (0.02 if candidate.observer == "minmax" else 0),
                          size_bytes=1000 + 100 * candidate.floats)


def run_search(oracle, observers=(None, "minmax", "moving_average"), budget=16, ranking=RANKING):
    results, rounds, asked = {}, [], []

    def ranked():
        asked.append(True)
        return ranking

    for batch in search.plan(list(observers), ranked, budget, results):
        assert batch and not any(candidate in results for candidate in batch)  # never one built before
        rounds.append(batch)
        results.update({candidate: oracle(candidate) for candidate in batch})
    return results, rounds, asked


def test_the_search_finds_the_broken_block_and_nothing_more_within_the_budget():
    results, rounds, _ = run_search(broken_model)
    chosen = search.winner(results)
    assert chosen.exclude == ("broken",) and chosen.floats == 2
    assert chosen.observer is None  # minmax passes too, but is slower
    assert len(results) <= 16
    # observers first, then the walk (1, 2, 4 layers), the drops, the drops together, the observers again
    assert [len(batch) for batch in rounds] == [3, 1, 1, 1, 4, 1, 2]
    assert [c.exclude for c in rounds[3]] == [("fc", "broken", "head")]  # the top 4, the block's two grouped


def test_the_walk_also_tries_the_observer_that_did_best_alone():
    """MobileNetV2 (random weights) on ExecuTorch: minmax alone gives 17 dB but top-1 agreement 0.09; its classifier
    float gives 0.92 but 14 dB with the recipe's histogram. Both together pass, with one float layer."""
    def mobilenet(candidate):
        sqnr = 17.1 if candidate.observer == "minmax" else 13.7
        top1 = 0.92 if "classifier" in candidate.exclude else 0.09
        missed = [f"sqnr_db {sqnr} < 15"] * (sqnr < 15) + [f"top1_agreement {top1} < 0.8"] * (top1 < 0.8)
        return search.Outcome(missed=missed, metrics={"sqnr_db": sqnr}, median_ms=2.0 + candidate.floats,
                              size_bytes=1000)

    results, rounds, _ = run_search(mobilenet, ranking=["classifier", "features.7.conv", "features.15.conv"])
    chosen = search.winner(results)
    assert (chosen.exclude, chosen.observer, chosen.floats) == (("classifier",), "minmax", 1)
    assert [len(batch) for batch in rounds][:2] == [3, 2]  # the observers, then k = 1 with histogram and minmax


def test_the_search_stops_at_the_first_round_when_an_observer_alone_meets_the_goal():
    def minmax_is_enough(candidate):
        fine = candidate.observer == "minmax"
        return search.Outcome(missed=[] if fine else ["sqnr_db 9 < 15"], metrics={"sqnr_db": 20 if fine else 9},
                              median_ms=1.0)

    results, rounds, asked = run_search(minmax_is_enough)
    assert len(rounds) == 1 and not asked  # the ranking is never needed
    assert search.winner(results) == search.Candidate((), "minmax", 0)


def test_a_goal_out_of_reach_ends_with_the_best_candidate_within_the_budget():
    def never(candidate):
        sqnr = 4.0 + candidate.floats
        return search.Outcome(missed=[f"sqnr_db {sqnr} < 60"], metrics={"sqnr_db": sqnr}, median_ms=1.0)

    results, _, _ = run_search(never, budget=7)
    assert len(results) == 7 and search.winner(results) is None
    best = search.best_effort(results)
    assert best.floats == max(c.floats for c in results)


def test_candidates_that_fail_to_build_are_never_winners():
    results = {search.Candidate(("a",), None, 1): search.Outcome(error="quantize:x: no module named 'a'"),
               search.Candidate((), None, 0): search.Outcome(missed=["sqnr_db 3 < 15"], metrics={"sqnr_db": 3.0})}
    assert search.winner(results) is None
    assert search.best_effort(results) == search.Candidate((), None, 0)


def test_ties_in_latency_go_to_the_better_sqnr():
    def outcome(ms, sqnr):
        return search.Outcome(metrics={"sqnr_db": sqnr}, median_ms=ms)

    results = {search.Candidate(("b",), "x", 1): outcome(1.00, 20), search.Candidate(("b",), "y", 1): outcome(1.02, 30),
               search.Candidate(("b",), "z", 1): outcome(1.50, 40),
               search.Candidate(("b", "c"), "x", 2): outcome(0.5, 50)}
    assert search.winner(results) == search.Candidate(("b",), "y", 1)
    # a median below the fastest one's p90 is no slower
    results[search.Candidate(("b",), "x", 1)].p90_ms = 1.6
    assert search.winner(results) == search.Candidate(("b",), "z", 1)


def test_neighbours_are_grouped_into_their_parent_module():
    assert search.grouped(["fc", "broken.1", "head", "broken.0"]) == ("fc", "broken", "head")
    # one level: scattered layers of a backbone never become the whole backbone
    assert search.grouped(["a.b.0", "a.b.1", "a.c"]) == ("a.b", "a.c")
    assert search.grouped(["features.7.conv.1", "features.7.conv.0", "features.8.conv.1"]) == (
        "features.7.conv", "features.8.conv.1")
    assert search.grouped(["fc", "head"]) == ("fc", "head")  # the model itself is no candidate
    assert search.grouped(["broken", "broken.0"]) == ("broken",)
    assert search.candidate(["broken.1", "broken.0"], None, RANKING).floats == 2
    assert search.steps(6) == [1, 2, 4, 6] and search.steps(1) == [1] and search.steps(0) == []


def test_judging_a_goal_skips_metrics_that_do_not_apply():
    found = {"sqnr_db": 14.0, "cosine": 0.99, "accuracy_drop": None, "max_rel_error": 0.6}
    goal = {"sqnr_db": 15, "cosine": 0.98, "accuracy_drop": 0.01, "max_rel_error": 0.5}
    assert metrics.failures(found, goal) == ["max_rel_error 0.6 > 0.5", "sqnr_db 14 < 15"]  # what tune judges with


# --- the patch: one target's quantize, the rest of the file as it was -----------------------------------------------

RECIPE_TEXT = """name: x  # the model
targets:
  - backend: xnnpack
  - backend: qnnpack   # int8
    optimize: {bundled_inputs: false}

  # more targets later
verify: {samples: 4}
"""


def test_the_patch_adds_a_quantize_line_to_the_target_and_keeps_comments():
    edited = patch.edit(RECIPE_TEXT, 1, {"exclude": ["broken"], "observer": "minmax"})
    assert edited == RECIPE_TEXT.replace("false}\n", "false}\n    quantize: {exclude: [broken], observer: minmax}\n")
    diff = patch.unified(RECIPE_TEXT, edited, "recipes/x.yaml")
    assert diff.startswith("--- a/recipes/x.yaml\n+++ b/recipes/x.yaml\n")
    assert [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("---", "+++")] == [
        "+    quantize: {exclude: [broken], observer: minmax}"]


@pytest.mark.parametrize("text, expected", [
    ("targets:\n- backend: qnnpack\n  quantize:\n    mode: static   # c\n  name: q\n",
     "targets:\n- backend: qnnpack\n  quantize: {mode: static, exclude: [a]}\n  name: q\n"),
    ("targets: [{backend: qnnpack}]\n", "targets: [{backend: qnnpack, quantize: {mode: static, exclude: [a]}}]\n"),
    ("targets:\n  - backend: qnnpack", "targets:\n  - backend: qnnpack\n    quantize: {mode: static, exclude: [a]}"),
])
def test_the_patch_replaces_or_adds_the_section_in_any_layout(text, expected):
    assert patch.edit(text, 0, {"mode": "static", "exclude": ["a"]}) == expected


def test_a_winner_with_the_recipes_own_settings_needs_no_patch():
    assert patch.edit(RECIPE_TEXT, 1, {}) == RECIPE_TEXT  # not an empty `quantize: {}` added


def test_an_aliased_target_gets_no_patch():
    text = "base: &t {backend: qnnpack}\ntargets: [*t, *t]\n"
    assert patch.edit(text, 0, {"exclude": ["a"]}) is None


# --- bad input: one line each, exit 2, before anything is built ------------------------------------------------------

TARGETS = [{"backend": "xnnpack"}, {"backend": "qnnpack"},
           {"backend": "nnapi", "nnapi": {"mode": "full"}}, {"backend": "onnx", "precision": "int8"}]


@pytest.fixture
def tiny_project(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "w.pt").write_bytes(b"x")
    data = tiny_recipe(targets=TARGETS)
    data["model"]["checkpoint"] = "../weights/w.pt"
    (tmp_path / "recipes" / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("args, line", [
    (["recipes/nope.yaml", "--target", "qnnpack"], "mobilebuild tune: recipes/nope.yaml: no such recipe file"),
    (["recipes/tiny.yaml", "--target", "qnn"],
     "recipes/tiny.yaml: --target: no target 'qnn' in the recipe (its targets: xnnpack, qnnpack, nnapi, onnx)"),
    (["recipes/tiny.yaml", "--target", "xnnpack"],
     "recipes/tiny.yaml: targets[0]: xnnpack is fp32: tune chooses int8 settings (quantize.exclude, "
     "quantize.observer); its int8 targets that run here: qnnpack, onnx"),
    (["recipes/tiny.yaml", "--target", "nnapi"],
     "recipes/tiny.yaml: targets[2]: nnapi runs only on an Android 8.1+ device with NNAPI; the host checks that the "
     "artifact loads and records its structure: tune needs verify and bench results from this host; its int8 "
     "targets that run here: qnnpack, onnx"),
    (["recipes/tiny.yaml", "--target", "qnnpack", "--goal", "sqnr=20"],
     "mobilebuild tune: --goal: no threshold 'sqnr' (expected recipe, defaults or NAME=VALUE with NAME one of "
     "sqnr_db, cosine, max_rel_error, top1_agreement, accuracy_drop)"),
    (["recipes/tiny.yaml", "--target", "qnnpack", "--goal", "sqnr_db=high"],
     "mobilebuild tune: --goal sqnr_db: expected a number, got 'high'"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_project, capsys, args, line):
    assert command.tune_command(args) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == line and captured.out == ""


def test_the_generated_recipe_plans_with_the_users_files_and_only_candidates(tiny_project, monkeypatch):
    options = command.parser().parse_args(["recipes/tiny.yaml", "--target", "qnnpack"])
    session = command.Session(tiny_project, options)
    candidates = [search.Candidate((), None, 0), search.Candidate(("broken",), "minmax", 2)]
    nodes = session.write(candidates)
    assert session.tune_file == ".mobilebuild/tune/tiny.yaml"
    generated = recipe.load(session.tune_file, tiny_project)
    assert generated.name == "tiny.tune" and generated.model["checkpoint"] == "weights/w.pt"
    assert [t.id for t in generated.targets] == [session.cid(c) for c in candidates]
    assert session.cid(candidates[0]) == "qnnpack-f0-histogram"
    assert re.fullmatch(r"qnnpack-f2-[0-9a-f]{6}-minmax", session.cid(candidates[1]))
    assert generated.targets[1].quantize["exclude"] == ["broken"]
    assert generated.targets[1].quantize["observer"] == "minmax"
    assert "observer" not in generated.targets[0].quantize  # the recipe's own: the user's nodes' keys
    assert {"verify:tiny.tune-qnnpack-f0-histogram", "layers:tiny.tune-qnnpack-f0-histogram"} <= set(nodes)
    user = {n.task_name: n for n in graph.recipe_nodes(recipe.load("recipes/tiny.yaml", tiny_project), tiny_project)}
    # the baseline is the user's target: the same keys, so the shared cache hands its artifacts over
    assert nodes["optimize:tiny.tune-qnnpack-f0-histogram"].key() == user["optimize:tiny-qnnpack"].key()
    # the project plans it only while the variable names it
    assert recipe.discover(tiny_project) == [tiny_project / "recipes" / "tiny.yaml"]
    monkeypatch.setenv(recipe.EXTRA_RECIPES_VARIABLE, session.tune_file)
    assert recipe.discover(tiny_project)[-1] == tiny_project / session.tune_file


def test_tune_is_in_the_usage():
    from mobilebuild import cli

    assert "mobilebuild tune RECIPE --target ID" in cli.__doc__


# --- a real tune -----------------------------------------------------------------------------------------------------

def tune(project, *args, env=None):
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "mobilebuild.cli", "tune", *args], cwd=project.root,
                            capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=900)
    return result, time.perf_counter() - started


@pytest.mark.slow
def test_tune_keeps_the_broken_block_float_and_says_so_as_a_patch(project, poisoned_torch):
    from test_exclude import OUTLIER

    (project.root / "outlier_net.py").write_text(OUTLIER)
    data = tiny_recipe("plain", model={"factory": "outlier_net:make", "seed": 0}, script="script",
                       targets=[{"backend": "xnnpack"}, {"backend": "qnnpack"}], benchmark={"warmup": 1, "iters": 3})
    path = project.write_recipe(data)
    before = path.read_text()

    first, cold = tune(project, "recipes/plain.yaml", "--target", "qnnpack")
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    rows = [line for line in lines if line[:1].isdigit() and "  " in line and "candidates in" not in line]
    assert 4 <= len(rows) <= command.DEFAULT_BUDGET
    assert "meets the goal" not in rows[0]  # the recipe's own settings fail
    winner = next(line for line in lines if line.startswith("winner: "))
    assert "float layers (broken)" in winner, first.stdout
    assert "quantize: {exclude: [broken]" in first.stdout
    patch_file = project.root / ".mobilebuild" / "tune" / "plain-qnnpack.patch"
    assert patch_file.read_text() in first.stdout and "+  quantize: {exclude: [broken]" in patch_file.read_text()
    assert "iterations" not in first.stderr  # the table's rows are the progress: no stage progress lines
    assert path.read_text() == before  # shown, not applied
    # the candidates were nodes of the build, not of the user's recipe, and a plain build does not see them
    listed = project.run("list", "--all")
    assert "plain.tune" not in listed.stdout and "verify:plain-qnnpack" in listed.stdout

    second, cached = tune(project, "recipes/plain.yaml", "--target", "qnnpack", env=poisoned_torch)
    assert second.returncode == 0 and cached < cold / 3, (cold, cached, second.stderr)  # torch never imported
    assert next(line for line in second.stdout.splitlines() if line.startswith("winner: ")) == winner
    assert "tasks built" not in second.stdout

    unmet, _ = tune(project, "recipes/plain.yaml", "--target", "qnnpack", "--goal", "sqnr_db=80",
                    "--max-candidates", "8")
    assert unmet.returncode == 1, unmet.stdout + unmet.stderr
    assert "no candidate meets the goal within 8 candidates; the best, #" in unmet.stdout

    unmeasured, _ = tune(project, "recipes/plain.yaml", "--target", "qnnpack", "--goal", "accuracy_drop=0.01")
    assert unmeasured.returncode == 2
    assert unmeasured.stderr.strip().splitlines()[-1] == (
        "recipes/plain.yaml: --goal accuracy_drop: tune cannot meet it: no candidate's verification reports "
        "accuracy_drop (accuracy needs labelled evaluation data: verify.evaluation returning inputs and labels); it "
        "can meet sqnr_db, cosine, max_rel_error, top1_agreement")

    written, _ = tune(project, "recipes/plain.yaml", "--target", "qnnpack", "--write")
    assert written.returncode == 0 and "wrote recipes/plain.yaml" in written.stdout
    assert yaml.safe_load(path.read_text())["targets"][1]["quantize"]["exclude"] == ["broken"]
    rebuilt = project.run()
    assert "verified:plain" not in rebuilt.stderr, rebuilt.stdout + rebuilt.stderr
    assert json.loads(project.artifact("plain/verify-qnnpack.json").read_text())["status"] == "passed"

    assert (project.root / "artifacts" / "plain.tune").is_dir()
    cleaned = subprocess.run([sys.executable, "-m", "mobilebuild.cli", "clean"], cwd=project.root,
                             capture_output=True, text=True, timeout=600)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (project.root / "artifacts").exists() and not (project.root / command.TUNE_DIR).exists()
