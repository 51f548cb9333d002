"""A fresh checkout with a warm shared artifact cache against a cold build of the bundled examples.

  cold: `python -m doit` (build, verify, benchmark, report) in a fresh copy of the repository's recipes, with an
        empty cache folder ($MOBILEBUILD_CACHE), which the build fills;
  warm: the same in a second fresh copy, at another path, with that cache: every node is fetched, none is built.
The warm build's artifacts must equal the cold build's byte for byte (benchmark results too: they are fetched).

Target: warm <= 0.10x cold (issue: monorepo scale).

    /work/venv/bin/python benchmarks/warm_cache.py [--recipes perf_recipe.yaml ...]
"""

import argparse
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from _bench import PYTHON, REPO, bytecode_env, fail, measure, table, verdict

TARGET_RATIO = 0.10


def checkout(root, recipes):
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root)
    for name in recipes:
        shutil.copy(REPO / "recipes" / name, root / "recipes" / name)


def digests(root):
    artifacts = root / "artifacts"
    return {p.relative_to(artifacts).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(artifacts.rglob("*")) if p.is_file() and p.parent.name != "plots"
            and p.name not in ("manifest.json", "report.md", "report.html")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", nargs="+", default=sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        env = {**bytecode_env(scratch), "MOBILEBUILD_CACHE": str(scratch / "cache"),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        runs = {}
        for name in ("cold", "warm"):
            root = scratch / name
            checkout(root, options.recipes)
            print(f"  {name} build of {', '.join(options.recipes)} ...", flush=True)
            runs[name] = measure([PYTHON, "-m", "doit"], root, env)
            if runs[name].returncode:
                fail(f"the {name} build failed", runs[name])
            print(f"  {name}: {runs[name].seconds:.1f} s", flush=True)
        fetched = runs["warm"].output.count("(from the cache)")
        # manifests are never cached: they record results as they are now, written in the build's own process
        built = sum(line.startswith("   artifacts/") and "(from the cache)" not in line
                    and "/manifest.json " not in line for line in runs["warm"].output.splitlines())
        same = digests(scratch / "cold") == digests(scratch / "warm")
        ratio = runs["warm"].seconds / runs["cold"].seconds
        table(["", "cold", "warm", "ratio"],
              [["wall (s)", f"{runs['cold'].seconds:.1f}", f"{runs['warm'].seconds:.1f}", f"{ratio:.3f}x"],
               ["CPU user+sys (s)", f"{runs['cold'].cpu_seconds:.1f}", f"{runs['warm'].cpu_seconds:.1f}",
                f"{runs['warm'].cpu_seconds / runs['cold'].cpu_seconds:.3f}x"]])
        print(f"  warm build: {fetched} nodes fetched from the cache, {built} built; artifacts identical: {same}")
        if not same:
            fail("the warm build's artifacts differ from the cold build's")
        return verdict(ratio <= TARGET_RATIO and built == 0,
                       f"warm-cache build {ratio:.3f}x the cold build (target <= {TARGET_RATIO}x), {built} built")


if __name__ == "__main__":
    raise SystemExit(main())
