"""A cold build with `doit -n 2` (two processes, a stage worker each) against the same build run serially.

Both build the given example recipes (default: all) in fresh copies, with the artifact cache off, interleaved
over N rounds (default 1: a cold build of every example takes minutes); the medians are compared, and the two
builds' artifacts must be byte-identical (benchmark results and manifests aside: they are measurements).

Target: serial / parallel >= 1.6 (issue: monorepo scale), where the graph leaves two independent chains to run.

    /work/venv/bin/python benchmarks/parallel_build.py [--recipes perf_recipe.yaml digits.yaml] [--repeats 1]
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


def build(scratch, counter, recipes, *options):
    root = scratch / f"build-{next(counter)}"
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root)
    for name in recipes:
        shutil.copy(REPO / "recipes" / name, root / "recipes" / name)
    env = {**bytecode_env(scratch), "MOBILEBUILD_CACHE": "off",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = measure([PYTHON, "-m", "doit", *options], root, env)
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
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch, counter = Path(scratch), itertools.count()
        runs = interleave({"serial": lambda: build(scratch, counter, options.recipes),
                           "-n 2": lambda: build(scratch, counter, options.recipes, "-n", "2")},
                          options.repeats,
                          check=lambda name, run: run.returncode and fail(f"the {name} build failed", run))
        if artifacts(runs["serial"][0].root) != artifacts(runs["-n 2"][0].root):
            fail("the parallel build's artifacts differ from the serial build's")
        ratio = summary(runs, "serial", "-n 2", digits=1)
        speedup = 1 / ratio
        print(f"  artifacts identical; speed-up of -n 2: {speedup:.2f}x "
              f"(serial {median(r.seconds for r in runs['serial']):.1f} s)")
        return verdict(speedup >= TARGET_SPEEDUP, f"-n 2 is {speedup:.2f}x the serial build (target >= "
                       f"{TARGET_SPEEDUP}x)")


if __name__ == "__main__":
    raise SystemExit(main())
