"""A cold build with `doit -n 2` (two processes, a stage worker each) against the same build run serially, and with
`--dask`, `mobilebuild build --dask local` (a LocalCluster of one single-threaded worker process per core).

Each builds the given example recipes (default: all) in a fresh copy, with the artifact cache off (Dask: a fresh,
empty cache, through which its files move), interleaved over N rounds (default 1: a cold build of every example
takes minutes); the medians are compared, and the builds' artifacts must be byte-identical (benchmark results and
manifests aside: they are measurements).

Target: serial / `-n 2` >= 1.6 (issue: monorepo scale), where the graph leaves two independent chains to run.

With --against REF, `-n 2` of this checkout's code against `-n 2` of the commit REF's (a git worktree of it, first on
the path of every process), instead: no slower, and the same bytes (issue 37: a measuring policy must cost a
two-core build nothing).

    .venv/bin/python benchmarks/parallel_build.py [--recipes perf_recipe.yaml digits.yaml] [--repeats 1] [--dask]
    .venv/bin/python benchmarks/parallel_build.py --against HEAD~1 [--repeats 2]
"""

import argparse
import hashlib
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from _bench import PYTHON, REPO, bytecode_env, fail, interleave, measure, median, summary, verdict

TARGET_SPEEDUP = 1.6


def build(scratch, counter, recipes, *command, code=REPO):
    root = scratch / f"build-{next(counter)}"
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root)
    for name in recipes:
        shutil.copy(REPO / "recipes" / name, root / "recipes" / name)
    dask = "--dask" in command
    env = {**bytecode_env(scratch), "MOBILEBUILD_CACHE": str(root.with_name(f"{root.name}-cache")) if dask else "off",
           "PYTHONPATH": os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])}
    run = measure([PYTHON, "-m", *(command if dask else ["doit", *command])], root, env)
    run.root = root
    return run


def artifacts(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "artifacts").rglob("*")) if p.is_file() and p.suffix != ".json"
            and p.parent.name != "plots" and not p.name.startswith("report")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", nargs="+", default=sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dask", action="store_true", help="also build on a LocalCluster of 2 Dask workers")
    parser.add_argument("--against", metavar="REF", help="compare -n 2 with -n 2 of the commit REF's code")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch, counter = Path(scratch), itertools.count()
        if options.against:
            return against(scratch, counter, options)
        contenders = {"serial": lambda: build(scratch, counter, options.recipes),
                      "-n 2": lambda: build(scratch, counter, options.recipes, "-n", "2")}
        if options.dask:
            contenders["dask"] = lambda: build(scratch, counter, options.recipes, "mobilebuild.cli", "build",
                                               "--dask", "local")
        runs = interleave(contenders, options.repeats,
                          check=lambda name, run: run.returncode and fail(f"the {name} build failed", run))
        for name in contenders:
            if artifacts(runs["serial"][0].root) != artifacts(runs[name][0].root):
                fail(f"the {name} build's artifacts differ from the serial build's")
        for name in list(contenders)[1:]:
            speedup = 1 / summary(runs, "serial", name, digits=1)
            print(f"  artifacts identical; speed-up of {name}: {speedup:.2f}x "
                  f"(serial {median(r.seconds for r in runs['serial']):.1f} s)\n")
        speedup = median(r.seconds for r in runs["serial"]) / median(r.seconds for r in runs["-n 2"])
        return verdict(speedup >= TARGET_SPEEDUP, f"-n 2 is {speedup:.2f}x the serial build (target >= "
                       f"{TARGET_SPEEDUP}x)")


def against(scratch, counter, options):
    """-n 2 of the commit `options.against` against -n 2 of this checkout: the speed ratio, and the same bytes."""
    code = scratch / "against"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(code), options.against],
                   check=True)
    try:
        baseline = f"-n 2 at {options.against}"
        contenders = {baseline: lambda: build(scratch, counter, options.recipes, "-n", "2", code=code),
                      "-n 2": lambda: build(scratch, counter, options.recipes, "-n", "2")}
        runs = interleave(contenders, options.repeats,
                          check=lambda name, run: run.returncode and fail(f"the {name} build failed", run))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(code)], check=True)
    if artifacts(runs[baseline][0].root) != artifacts(runs["-n 2"][0].root):
        fail(f"this checkout's artifacts differ from those of {options.against}")
    ratio = summary(runs, baseline, "-n 2", digits=1)
    print(f"  artifacts identical; -n 2 takes {ratio:.2f}x the time it took at {options.against}\n")
    return verdict(ratio <= 1.05, f"-n 2 is {ratio:.2f}x its time at {options.against} (target: no slower, within "
                   "5% for the noise of one machine)")


if __name__ == "__main__":
    raise SystemExit(main())
