"""Cold build of recipes/mobilenet_v2.yaml through the doit graph against the same steps written by hand.

Measures the wall time, CPU time and peak RSS of
  mobilebuild: `python -m doit optimize:mobilenet_v2-xnnpack optimize:mobilenet_v2-qnnpack` in a fresh
               temporary repo holding dodo.py and recipes/mobilenet_v2.yaml only
               (7 tasks: checkpoint, fuse, quantize, script x2, optimize x2; one process);
  by hand:     `python benchmarks/mobilenet_v2_by_hand.py OUT` in a fresh folder: the same model, batch-norm
               statistics, fusion, qnnpack calibration, channels_last wrapper, scripting, optimize_for_mobile,
               bundled inputs and lite-interpreter saves, in one plain script (torch import included in both).
Both run N times (default 3) as subprocesses, interleaved; medians are compared. Then one more, untimed graph
build with doit's JSON reporter gives per-task times, and both builds' .ptl files are run through the lite
interpreter on one input: their outputs must match, so that both did the same work.

Target: median(mobilebuild) <= 1.15x median(by hand).

    /work/venv/bin/python benchmarks/cold_build.py [--repeats 3]
"""

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml
from _bench import PYTHON, REPO, bytecode_env, fail, interleave, measure, median, summary, table, verdict

TARGET_RATIO = 1.15
RECIPE = REPO / "recipes" / "mobilenet_v2.yaml"
BY_HAND = Path(__file__).with_name("mobilenet_v2_by_hand.py")
TARGETS = ("xnnpack", "qnnpack")
TASKS = 7


def graph_build(root, *doit_options, env=None):
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    # The example's PyTorch Mobile targets only: the by-hand script makes those two.
    data = yaml.safe_load(RECIPE.read_text())
    data["targets"] = [t for t in data["targets"] if t["backend"] in TARGETS and "runtime" not in t]
    (root / "recipes" / RECIPE.name).write_text(yaml.safe_dump(data))
    env = {**(env or os.environ), "MOBILEBUILD_CACHE": "off"}  # a cold build: nothing fetched
    # The artifacts alone: verification and benchmarks (which the manifest records) are work the by-hand script
    # does not do.
    run = measure([PYTHON, "-m", "doit", *doit_options, *(f"optimize:mobilenet_v2-{t}" for t in TARGETS)], root, env)
    run.artifacts = {t: root / "artifacts" / "mobilenet_v2" / f"mobilenet_v2-{t}.ptl" for t in TARGETS}
    return run


def hand_build(root, env=None):
    root.mkdir(parents=True)
    run = measure([PYTHON, str(BY_HAND), str(root)], root, env)
    run.artifacts = {t: root / f"mobilenet_v2-{t}.ptl" for t in TARGETS}
    return run


def check(name, run):
    missing = [str(p) for p in run.artifacts.values() if not p.is_file()]
    if run.returncode or missing:
        fail(f"{name}: rc {run.returncode}, missing {missing}", run)
    executed = sum(line.startswith(".  ") for line in run.output.splitlines())
    if name == "mobilebuild" and executed != TASKS:
        fail(f"mobilebuild executed {executed} tasks, expected {TASKS}", run)


def task_times(root):
    """{task: seconds} from doit's JSON reporter (an extra build: the timed ones keep the default reporter).
    A task's time includes doit's bookkeeping after it (hashing its file_dep and targets)."""
    run = graph_build(root, "-r", "json")
    if run.returncode:
        fail("the build with the JSON reporter failed", run)
    report = json.loads(run.output)
    times = {t["name"]: t["elapsed"] for t in report["tasks"] if ":" in t["name"] and t["elapsed"] is not None}
    return times, run.seconds


def hand_steps(run):
    """The `step <name> <seconds>` lines the by-hand script prints."""
    return dict((name, float(seconds)) for name, _, seconds in
                (line[len("step "):].rpartition(" ") for line in run.output.splitlines() if line.startswith("step ")))


def output_differences(graph_run, hand_run):
    """Largest output difference per target between the two builds' .ptl files, on one fixed input."""
    import torch  # only now: the timed runs are over
    from torch.jit.mobile import _load_for_lite_interpreter

    torch.backends.quantized.engine = "qnnpack"
    example = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1234))
    differences = {}
    for target in TARGETS:
        graph_out = _load_for_lite_interpreter(str(graph_run.artifacts[target]))(example)
        hand_out = _load_for_lite_interpreter(str(hand_run.artifacts[target]))(example)
        differences[target] = (graph_out - hand_out).abs().max().item()
    return differences


def breakdown(title, steps, total, outside):
    print(f"\n{title}")
    table(["step", "s"], [*[[name, f"{s:.2f}"] for name, s in steps.items()],
                          [f"outside the steps ({outside})", f"{total - sum(steps.values()):.2f}"],
                          ["total (wall)", f"{total:.2f}"]])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cold-build-bench-") as scratch:
        fresh = (Path(scratch, f"build-{n}") for n in itertools.count())  # a cold build never reuses a folder
        env = bytecode_env(scratch)
        contenders = {"by hand": lambda: hand_build(next(fresh), env),
                      "mobilebuild": lambda: graph_build(next(fresh), env=env)}
        print(f"{args.repeats} interleaved cold builds of each:")
        runs = interleave(contenders, args.repeats, check)
        tasks, tasks_total = task_times(next(fresh))
        differences = output_differences(runs["mobilebuild"][-1], runs["by hand"][-1])

    print()
    ratio = summary(runs, "by hand", "mobilebuild", digits=2)
    breakdown("mobilebuild, one extra build with -r json (the first task pays import torch)", tasks, tasks_total,
              "interpreter start and exit, doit, task loading")
    hand = runs["by hand"]
    steps = {name: median(hand_steps(r)[name] for r in hand) for name in hand_steps(hand[0])}
    breakdown("by hand, medians", steps, median(r.seconds for r in hand), "interpreter start and exit")
    same = all(d <= 1e-5 for d in differences.values())
    print("\nsame outputs: " + ", ".join(f"{t} max |diff| {d:.2g}" for t, d in differences.items()))
    return verdict(ratio <= TARGET_RATIO and same,
                   f"cold-build ratio {ratio:.2f}x (target <= {TARGET_RATIO:.2f}x)"
                   + ("" if same else ", but the two builds' outputs differ"))


if __name__ == "__main__":
    sys.exit(main())
