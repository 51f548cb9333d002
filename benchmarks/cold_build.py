"""Cold build of recipes/mobilenet_v2.yaml through the doit graph against the same steps written by hand.

Measures the wall time and peak RSS of
  mobilebuild: `python -m doit` in a fresh temporary repo holding dodo.py and recipes/mobilenet_v2.yaml only
               (8 tasks: checkpoint, fuse, quantize, script x2, optimize x2, manifest; one process);
  by hand:     `python benchmarks/mobilenet_v2_by_hand.py OUT` in a fresh folder: the same model, batch-norm
               statistics, fusion, qnnpack calibration, channels_last wrapper, scripting, optimize_for_mobile,
               bundled inputs and lite-interpreter saves, in one plain script (torch import included in both).
Both run N times (default 3) as subprocesses, interleaved; medians are compared. Afterwards both pairs of .ptl
files are loaded with the lite interpreter and must give the same outputs, so that both did the same work.

Target: median(mobilebuild) <= 1.15x median(by hand).

    /work/venv/bin/python benchmarks/cold_build.py [--repeats 3]
"""

import argparse
import itertools
import re
import shutil
import sys
import tempfile
from pathlib import Path

from _bench import PYTHON, REPO, fail, interleave, measure, median, summary, table, verdict

TARGET_RATIO = 1.15
RECIPE = REPO / "recipes" / "mobilenet_v2.yaml"
BY_HAND = Path(__file__).with_name("mobilenet_v2_by_hand.py")
TARGETS = ("xnnpack", "qnnpack")
TASKS = 8
# execute.run_node prints "   <artifact> (<size> MB, <seconds> s)" after each task.
TASK_LINE = re.compile(r"^\.  (\S+)$")
TIME_LINE = re.compile(r"^   \S+ \([\d.]+ MB, ([\d.]+) s\)$")


def graph_build(root):
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    shutil.copy(RECIPE, root / "recipes" / RECIPE.name)
    run = measure([PYTHON, "-m", "doit"], root)
    run.artifacts = {t: root / "artifacts" / "mobilenet_v2" / f"mobilenet_v2-{t}.ptl" for t in TARGETS}
    run.steps = stage_times(run.output)
    return run


def hand_build(root):
    root.mkdir(parents=True)
    run = measure([PYTHON, str(BY_HAND), str(root)], root)
    run.artifacts = {t: root / f"mobilenet_v2-{t}.ptl" for t in TARGETS}
    run.steps = {line[5:].rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                 for line in run.output.splitlines() if line.startswith("step ")}
    return run


def stage_times(output):
    times, task = {}, None
    for line in output.splitlines():
        if match := TASK_LINE.match(line):
            task = match.group(1)
        elif (match := TIME_LINE.match(line)) and task:
            times[task] = float(match.group(1))
    return times


def check(name, run):
    missing = [str(p) for p in run.artifacts.values() if not p.is_file()]
    if run.returncode or missing:
        fail(f"{name}: rc {run.returncode}, missing {missing}", run)
    if name == "mobilebuild" and len(run.steps) != TASKS:
        fail(f"mobilebuild ran {len(run.steps)} tasks, expected {TASKS}: {sorted(run.steps)}", run)


def same_outputs(graph_run, hand_run):
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


def step_table(title, runs):
    print(f"\n{title} (median s)")
    table(["step", "s"], [[name, f"{median(r.steps[name] for r in runs):.2f}"] for name in runs[0].steps])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cold-build-bench-") as scratch:
        fresh = (Path(scratch, f"build-{n}") for n in itertools.count())  # a cold build never reuses a folder
        contenders = {"by hand": lambda: hand_build(next(fresh)), "mobilebuild": lambda: graph_build(next(fresh))}
        print(f"{args.repeats} interleaved cold builds of each:")
        runs = interleave(contenders, args.repeats, check)
        differences = same_outputs(runs["mobilebuild"][-1], runs["by hand"][-1])

    print()
    ratio = summary(runs, "by hand", "mobilebuild", digits=2)
    step_table("mobilebuild tasks, as execute.run_node prints them (0.1 s steps; the first pays import torch)",
               runs["mobilebuild"])
    outside = median(r.seconds - sum(r.steps.values()) for r in runs["mobilebuild"])
    print(f"outside tasks (interpreter, doit, task loading): {outside:.2f} s")
    step_table("by hand", runs["by hand"])
    same = all(d <= 1e-5 for d in differences.values())
    print("\nsame outputs: " + ", ".join(f"{t} max |diff| {d:.2g}" for t, d in differences.items()))
    return verdict(ratio <= TARGET_RATIO and same,
                   f"cold-build ratio {ratio:.2f}x (target <= {TARGET_RATIO:.2f}x)"
                   + ("" if same else ", but the two builds' outputs differ"))


if __name__ == "__main__":
    sys.exit(main())
