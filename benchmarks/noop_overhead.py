"""Up-to-date (no-op) `doit` over generated monorepos against bare doit with as many file tasks.

Measures the wall time, CPU time and peak RSS of `python -m doit` when nothing is left to build, for each size N
(default 10, 50 and 200 recipes), in
  mobilebuild: a temporary repo with the real dodo.py and N recipes x 5 targets (xnnpack, qnnpack, ExecuTorch
              xnnpack, onnx fp32 and int8) of a tiny Conv-BN-ReLU + Linear model in five variants, built once for
              real beforehand (recipes of the same variant share their artifacts through the artifact cache, so
              200 recipes cost five real builds);
  bare doit:  a temporary dodo.py with as many file tasks as `doit list --all` shows there (group tasks left
              out), chained through one file_dep each, one target each and a config_changed uptodate;
  doit, same graph: for reference, a dodo.py that reads mobilebuild's own graph from a JSON file (the same tasks,
              file_deps, targets and keys in a config_changed, each action writing its target): what doit itself
              costs for this graph, whose tasks read about three files each where the bare chain's read one.
All run K times (default 7) as subprocesses, interleaved, after one untimed warm-up each; medians are compared.
Every timed run must execute nothing. One more mobilebuild no-op runs with a PYTHONPATH whose `torch` raises on
import.

Targets: at the largest size median(mobilebuild) <= 1.5x median(bare doit) (the same-graph ratio is reported too);
from the smallest size to the largest, time and peak RSS grow at most linearly with the number of tasks; torch is
never imported by a no-op run.

    .venv/bin/python benchmarks/noop_overhead.py [--recipes 10 50 200] [--repeats 7]
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

import yaml
from _bench import PYTHON, REPO, bytecode_env, fail, interleave, measure, median, summary, table, verdict

TARGET_RATIO = 1.5
VARIANTS = 5
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


# mobilebuild's graph as plain doit: the same file tasks, read from graph.json (written by GRAPH_DUMP in the monorepo)
SAME_GRAPH_DODO = textwrap.dedent('''
    import json
    from pathlib import Path

    from doit.tools import config_changed

    DOIT_CONFIG = {"default_tasks": ["file"], "verbosity": 2}
    GRAPH = json.loads(Path("graph.json").read_text())


    def write(target):
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(target)


    def task_file():
        for name, deps, target, key in GRAPH:
            yield {"name": name, "actions": [(write, [target])], "file_dep": deps, "targets": [target],
                   "uptodate": [config_changed(key)]}
''')
GRAPH_DUMP = ("import json, sys; import mobilebuild.routes; from mobilebuild.plan import project; "
              "json.dump([[n.task_name, n.dependencies(), n.output, n.key()] for n in project.nodes('.')], "
              "open(sys.argv[1], 'w'))")


def recipe(index):
    team = TEAMS[index % len(TEAMS)]
    return team, {
        "name": f"{team}_net_{index:02d}",
        "model": {"factory": "tinynet:make", "kwargs": {"width": 2 + index % VARIANTS}, "seed": index % VARIANTS,
                  "batchnorm_stats": 1},
        "input": {"shape": [1, 3, 8, 8]},
        # One or two calibration batches: the cold build only has to exist, not be accurate.
        "quantize": {"calibration": {"source": "random", "batches": 1, "seed": 0}},
        "script": ("trace", "script")[index % VARIANTS % 2],
        "benchmark": {"warmup": 1, "iters": 5},  # likewise: the timings only have to exist
        # and pass: a failed verification runs again on every build, and these random nets calibrated on one
        # batch are poor int8 models
        "verify": {"samples": 2, "thresholds": {"int8": {"sqnr_db": 0, "cosine": 0, "max_rel_error": 100,
                                                         "top1_agreement": 0}}},
        "targets": [{"backend": "xnnpack"}, {"backend": "qnnpack"}, {"backend": "xnnpack", "runtime": "executorch"},
                    {"backend": "onnx"}, {"backend": "onnx", "precision": "int8", "name": "onnx-int8"}],
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


def make_same_graph(graph_root, root, env):
    """A plain doit dodo over mobilebuild's graph of `graph_root`, with the repository files that graph reads."""
    (root / "dodo.py").write_text(SAME_GRAPH_DODO)
    dumped = measure([PYTHON, "-c", GRAPH_DUMP, str(root / "graph.json")], graph_root, env)
    if dumped.returncode:
        fail("could not read mobilebuild's graph", dumped)
    shutil.copy(graph_root / "tinynet.py", root / "tinynet.py")


def build_once(root, label, env=None):
    run = measure([PYTHON, "-m", "doit", "-n", "2"], root, env)  # only the setup: both cores
    if run.returncode:
        fail(f"{label}: the build failed", run)
    # In a parallel build a manifest may be written before a benchmark it records finishes (it observes results
    # rather than waiting on them); the next run refreshes it. Settle that before measuring no-ops.
    settle = measure([PYTHON, "-m", "doit"], root, env)
    if settle.returncode:
        fail(f"{label}: the settling build failed", settle)
    executed = sum(line.startswith(".  ") for line in run.output.splitlines())
    print(f"cold build of {label}: {executed} tasks in {run.seconds:.1f} s (peak RSS {run.peak_rss_mb:.0f} MB)")
    return run


def noop_problem(run, tasks):
    """Why `run` was not an up-to-date run of `tasks` file tasks, or None. Bare doit lists each task it skips;
    mobilebuild's reporter says it in one line (`all N tasks up to date: nothing to do`)."""
    lines = run.output.splitlines()
    executed = [line for line in lines if line.startswith(".  ")]
    skipped = sum(line.startswith("-- ") for line in lines)
    one_line = len(lines) == 1 and re.fullmatch(r"all \d+ tasks up to date: nothing to do", lines[0])
    if run.returncode or executed or (skipped != tasks and not one_line):
        return f"rc {run.returncode}, {len(executed)} executed {executed[:3]}, {skipped}/{tasks} up to date"
    return None


def expect_noop(tasks):
    """tasks: {contender: how many file tasks its no-op skips}."""
    def check(name, run):
        problem = noop_problem(run, tasks[name])
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
    run = measure([PYTHON, "-m", "doit"], root, env={**bytecode_env(scratch),
                                                     "PYTHONPATH": os.pathsep.join([str(shim), str(REPO)])})
    problem = noop_problem(run, tasks)
    if problem:
        print(f"poisoned-torch run: {problem}\n{run.output[-2000:]}\n{run.errors[-2000:]}")
    return not problem and not marker.exists(), run


def measure_size(scratch, count, repeats, env):
    """Build a monorepo of `count` recipes, a bare dodo with as many file tasks and a plain doit dodo over the same
    graph; time their no-ops. Returns (monorepo, tasks, runs, ratio to bare doit, ratio to the same graph)."""
    graph, bare, same = scratch / f"monorepo-{count}", scratch / f"bare-{count}", scratch / f"same-{count}"
    for folder in (graph, bare, same):
        folder.mkdir()
    make_monorepo(graph, count)
    tasks = len(file_tasks(graph))
    print(f"generated {count} recipes x 5 targets: {tasks} file tasks; bare dodo with {tasks} file tasks")
    make_bare(bare, tasks)
    build_once(graph, f"the {count}-recipe monorepo", env)
    make_same_graph(graph, same, env)
    build_once(bare, "the bare dodo", env)
    build_once(same, "doit over the same graph", env)
    command = [PYTHON, "-m", "doit"]
    contenders = {"bare doit": lambda: measure(command, bare, env), "mobilebuild": lambda: measure(command, graph, env),
                  "doit, same graph": lambda: measure(command, same, env)}
    nodes = len(json.loads((same / "graph.json").read_text()))
    check = expect_noop({"bare doit": tasks, "mobilebuild": tasks, "doit, same graph": nodes})
    for name, contender in contenders.items():  # untimed: fills the page cache and the bytecode cache
        check(name, contender())
    print(f"{repeats} interleaved up-to-date runs of each:")
    runs = interleave(contenders, repeats, check)
    print(f"\n{count} recipes, {tasks} file tasks each")
    ratio = summary(runs, "bare doit", "mobilebuild")
    print()
    return graph, tasks, runs, ratio, summary(runs, "doit, same graph", "mobilebuild")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="noop-bench-") as scratch:
        scratch = Path(scratch)
        # this checkout's mobilebuild, whatever the interpreter has installed (an edit elsewhere would rebuild all)
        env = {**bytecode_env(scratch), "MOBILEBUILD_CACHE": str(scratch / "cache"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        sizes = {count: measure_size(scratch, count, args.repeats, env) for count in sorted(args.recipes)}
        rows = []
        for count, (_, tasks, runs, ratio, same_ratio) in sizes.items():
            seconds = median(r.seconds for r in runs["mobilebuild"])
            rss = median(r.peak_rss_mb for r in runs["mobilebuild"])
            rows.append([str(count), str(tasks), f"{seconds:.3f}", f"{seconds / tasks * 1e3:.3f}", f"{rss:.0f}",
                         f"{ratio:.2f}x", f"{same_ratio:.2f}x"])
        print()
        table(["recipes", "file tasks", "no-op (s)", "ms per task", "peak RSS (MB)", "vs bare doit",
               "vs doit, same graph"], rows)
        first, last = sizes[min(sizes)], sizes[max(sizes)]
        growth = last[1] / first[1]
        time_growth = median(r.seconds for r in last[2]["mobilebuild"]) / median(
            r.seconds for r in first[2]["mobilebuild"])
        rss_growth = median(r.peak_rss_mb for r in last[2]["mobilebuild"]) / median(
            r.peak_rss_mb for r in first[2]["mobilebuild"])
        print(f"from {min(sizes)} to {max(sizes)} recipes: tasks x{growth:.1f}, no-op time x{time_growth:.2f}, "
              f"peak RSS x{rss_growth:.2f}")
        torch_free, poisoned = torch_free_noop(last[0], scratch, last[1])
        print(f"torch during the no-op: {'never imported' if torch_free else 'IMPORTED'} "
              f"(poisoned-torch run: rc {poisoned.returncode}, {poisoned.seconds:.3f} s)")
        ratio = last[3]
        return verdict(ratio <= TARGET_RATIO and torch_free and time_growth <= growth and rss_growth <= growth,
                       f"no-op ratio at {max(sizes)} recipes {ratio:.2f}x (target <= {TARGET_RATIO:.2f}x; "
                       f"{last[4]:.2f}x doit over the same graph); time "
                       f"x{time_growth:.2f} and memory x{rss_growth:.2f} for x{growth:.1f} tasks; torch "
                       f"{'not ' if torch_free else ''}imported")


if __name__ == "__main__":
    sys.exit(main())
