"""A cold build with `doit -n 2` (two processes, a stage worker each) against the same build run serially, and with
`--dask`, `mobilebuild build --dask local` (a LocalCluster of one single-threaded worker process per core).

Each builds the given example recipes (default: all) in a fresh copy, with the artifact cache off (Dask: a fresh,
empty cache, through which its files move), interleaved over N rounds (default 1: a cold build of every example
takes minutes); the medians are compared, and the builds' artifacts must be byte-identical (benchmark results and
manifests aside: they are measurements).

Target: serial / `-n 2` >= 1.6 (issue: monorepo scale), where the graph leaves two independent chains to run.

    /work/venv/bin/python benchmarks/parallel_build.py [--recipes perf_recipe.yaml digits.yaml] [--repeats 1] [--dask]
"""

import argparse
import hashlib
import itertools
import os
import shutil
import tempfile
from pathlib import Path

from _bench import PYTHON, REPO, bytecode_env, fail, interleave, measure, median, summary, verdict

TARGET_SPEEDUP = 1.6


def build(scratch, counter, recipes, *command):
    root = scratch / f"build-{next(counter)}"
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root)
    for name in recipes:
        shutil.copy(REPO / "recipes" / name, root / "recipes" / name)
    dask = "--dask" in command
    env = {**bytecode_env(scratch), "MOBILEBUILD_CACHE": str(root.with_name(f"{root.name}-cache")) if dask else "off",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
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
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch, counter = Path(scratch), itertools.count()
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


if __name__ == "__main__":
    raise SystemExit(main())
