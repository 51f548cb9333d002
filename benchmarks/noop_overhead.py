"""Up-to-date (no-op) `doit` over a generated monorepo against bare doit with as many file tasks.

Measures the wall time, CPU time and peak RSS of `python -m doit` when nothing is left to build, in
  mobilebuild: a temporary repo with the real dodo.py and N recipes (default 50) x 2 targets (xnnpack, qnnpack)
              of a tiny Conv-BN-ReLU + Linear model, built once for real beforehand;
  bare doit:  a temporary dodo.py with as many file tasks as `doit list --all` shows there (group tasks left
              out), chained through one file_dep each, one target each and a config_changed uptodate.
Both run K times (default 7) as subprocesses, interleaved, after one untimed warm-up each; medians are compared.
Every timed run must execute nothing. One more mobilebuild no-op runs with a PYTHONPATH whose `torch` raises on
import.

Target: median(mobilebuild) <= 2x median(bare doit), and torch is never imported by the no-op run.

    /work/venv/bin/python benchmarks/noop_overhead.py [--recipes 50] [--repeats 7]
"""

import argparse
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import yaml

from _bench import PYTHON, REPO, bytecode_env, fail, interleave, measure, summary, verdict

TARGET_RATIO = 2.0
TEAMS = ("camera", "speech", "ocr", "pose", "ranking")

TINYNET = textwrap.dedent('''
    import torch
    from torch import nn


    class TinyNet(nn.Module):
        def __init__(self, width=4, classes=10):
            super().__init__()
            self.quant = torch.ao.quantization.QuantStub()
            self.conv = nn.Conv2d(3, width, 3, bias=False)
            self.bn = nn.BatchNorm2d(width)
            self.relu = nn.ReLU()
            self.head = nn.Linear(width * 6 * 6, classes)
            self.dequant = torch.ao.quantization.DeQuantStub()

        def forward(self, x):
            x = self.relu(self.bn(self.conv(self.quant(x))))
            return self.dequant(self.head(torch.flatten(x, 1)))


    def make(width=4, classes=10):
        return TinyNet(width, classes)
''')

# A chain of file tasks shaped like mobilebuild's: one action, file_dep, target and config_changed key each.
BARE_DODO = textwrap.dedent('''
    from pathlib import Path

    from doit.tools import config_changed

    COUNT = {count}
    DOIT_CONFIG = {{"default_tasks": ["file"], "verbosity": 2}}
    TOOLCHAIN = {{"python": "3", "torch": "2", "torchvision": "0", "stages_sha256": "0" * 64}}


    def write(target):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(target)


    def task_file():
        previous = "source.txt"
        for index in range(COUNT):
            target = f"out/{{index:04d}}.bin"
            key = {{"stage": "file", "config": {{"index": index, "input": {{"shape": [1, 3, 8, 8]}}}},
                   "toolchain": TOOLCHAIN}}
            yield {{"name": f"{{index:04d}}", "actions": [(write, [target])], "file_dep": [previous],
                   "targets": [target], "uptodate": [config_changed(key)]}}
            previous = target
''')


def recipe(index):
    team = TEAMS[index % len(TEAMS)]
    return team, {
        "name": f"{team}_net_{index:02d}",
        "model": {"factory": "tinynet:make", "kwargs": {"width": 2 + index % 7}, "seed": index,
                  "batchnorm_stats": 1},
        "input": {"shape": [1, 3, 8, 8]},
        # One or two calibration batches: the cold build only has to exist, not be accurate.
        "quantize": {"calibration": {"source": "random", "batches": 1 + index % 2, "seed": index}},
        "script": ("trace", "script")[index % 2],
        "benchmark": {"warmup": 1, "iters": 5},  # likewise: the timings only have to exist
        # and pass: a failed verification runs again on every build, and these random nets calibrated on one
        # batch are poor int8 models
        "verify": {"samples": 2, "thresholds": {"int8": {"sqnr_db": 0, "cosine": 0, "max_rel_error": 100,
                                                         "top1_agreement": 0}}},
        "targets": [{"backend": "xnnpack"}, {"backend": "qnnpack"}],
    }


def make_monorepo(root, count):
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    (root / "tinynet.py").write_text(TINYNET)
    for index in range(count):
        team, data = recipe(index)
        path = root / "recipes" / team / f"{data['name']}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))


def file_tasks(root):
    """Names of the tasks that make files: subtasks are 'group:name'; the groups and `build` only gather them."""
    listed = measure([PYTHON, "-m", "doit", "list", "--all"], root)
    if listed.returncode:
        fail("doit list failed in the generated repo", listed)
    names = [line.split()[0] for line in listed.output.splitlines() if line.strip()]
    # render_report writes artifacts/report.{md,html}: a file task without a group
    return [name for name in names if ":" in name or name == "render_report"]


def make_bare(root, count):
    (root / "dodo.py").write_text(BARE_DODO.format(count=count))
    (root / "source.txt").write_text("source\n")


def build_once(root, label):
    run = measure([PYTHON, "-m", "doit", "-n", "2"], root)  # only the setup: both cores
    if run.returncode:
        fail(f"{label}: the build failed", run)
    # In a parallel build a manifest may be written before a benchmark it records finishes (it observes results
    # rather than waiting on them); the next run refreshes it. Settle that before measuring no-ops.
    settle = measure([PYTHON, "-m", "doit"], root)
    if settle.returncode:
        fail(f"{label}: the settling build failed", settle)
    executed = sum(line.startswith(".  ") for line in run.output.splitlines())
    print(f"cold build of {label}: {executed} tasks in {run.seconds:.1f} s (peak RSS {run.peak_rss_mb:.0f} MB)")
    return run


def noop_problem(run, tasks):
    """Why `run` was not an up-to-date run of `tasks` file tasks, or None."""
    lines = run.output.splitlines()
    executed = [line for line in lines if line.startswith(".  ")]
    skipped = sum(line.startswith("-- ") for line in lines)
    if run.returncode or executed or skipped != tasks:
        return f"rc {run.returncode}, {len(executed)} executed {executed[:3]}, {skipped}/{tasks} up to date"
    return None


def expect_noop(tasks):
    def check(name, run):
        problem = noop_problem(run, tasks)
        if problem:
            fail(f"{name}: not a no-op ({problem})", run)
    return check


def torch_free_noop(root, scratch, tasks):
    """An up-to-date run with a `torch` that raises on import and leaves a marker, so that an ImportError
    swallowed somewhere still shows. Returns (torch stayed out, the run)."""
    shim, marker = scratch / "poison", scratch / "torch-was-imported"
    (shim / "torch").mkdir(parents=True)
    (shim / "torch" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise ImportError('torch imported')\n")
    run = measure([PYTHON, "-m", "doit"], root, env={**bytecode_env(scratch), "PYTHONPATH": str(shim)})
    problem = noop_problem(run, tasks)
    if problem:
        print(f"poisoned-torch run: {problem}\n{run.output[-2000:]}\n{run.errors[-2000:]}")
    return not problem and not marker.exists(), run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="noop-bench-") as scratch:
        scratch = Path(scratch)
        graph, bare = scratch / "monorepo", scratch / "bare"
        graph.mkdir()
        bare.mkdir()
        make_monorepo(graph, args.recipes)
        tasks = len(file_tasks(graph))
        print(f"generated {args.recipes} recipes x 2 targets: {tasks} file tasks; bare dodo with {tasks} file tasks")
        make_bare(bare, tasks)
        build_once(graph, "the monorepo")
        build_once(bare, "the bare dodo")

        command, env = [PYTHON, "-m", "doit"], bytecode_env(scratch)
        contenders = {"bare doit": lambda: measure(command, bare, env),
                      "mobilebuild": lambda: measure(command, graph, env)}
        check = expect_noop(tasks)
        for name, contender in contenders.items():  # untimed: fills the page cache and the bytecode cache
            check(name, contender())
        print(f"{args.repeats} interleaved up-to-date runs of each:")
        runs = interleave(contenders, args.repeats, check)
        torch_free, poisoned = torch_free_noop(graph, scratch, tasks)

    print(f"\n{tasks} file tasks each")
    ratio = summary(runs, "bare doit", "mobilebuild")
    print(f"torch during the no-op: {'never imported' if torch_free else 'IMPORTED'} "
          f"(poisoned-torch run: rc {poisoned.returncode}, {poisoned.seconds:.3f} s)")
    return verdict(ratio <= TARGET_RATIO and torch_free,
                   f"no-op ratio {ratio:.2f}x (target <= {TARGET_RATIO:.2f}x), torch "
                   f"{'not ' if torch_free else ''}imported")


if __name__ == "__main__":
    sys.exit(main())
