"""A fresh checkout with a warm shared artifact cache against a cold build, of the bundled examples or of a
generated monorepo.

  cold: `python -m doit` (build, verify, benchmark, plots, report) in a fresh copy of the recipes, with an empty
        cache folder ($MOBILEBUILD_CACHE), which the build fills;
  warm: the same in a second fresh copy, at another path, with that cache: every node is fetched, none is built
        (the manifests are written, the report rendered; the plots are fetched like the rest).
The warm build's artifacts must equal the cold build's byte for byte (benchmark results and plots too: they are
fetched).

Targets: warm <= 0.10x cold for the examples; <= 0.05x for a monorepo of 40 small recipes x 2 targets (issue:
monorepo scale).

    .venv/bin/python benchmarks/warm_cache.py [--recipes perf_recipe.yaml ...]
    .venv/bin/python benchmarks/warm_cache.py --monorepo 40
"""

import argparse
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import yaml
from _bench import PYTHON, REPO, bytecode_env, fail, measure, table, verdict
from noop_overhead import TINYNET, recipe

TARGET_RATIO = {"examples": 0.10, "monorepo": 0.05}


def checkout(root, recipes):
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root)
    for name in recipes:
        shutil.copy(REPO / "recipes" / name, root / "recipes" / name)


def monorepo(root, count):
    """`count` small recipes (noop_overhead's tiny nets) with two targets each, xnnpack and qnnpack; a seed of its own
    each, so that the cold build builds every one of them (noop_overhead's recipes share five variants)."""
    (root / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", root)
    (root / "tinynet.py").write_text(TINYNET)
    for index in range(count):
        _, data = recipe(index)
        data["targets"] = data["targets"][:2]
        data["model"]["seed"] = index
        (root / "recipes" / f"{data['name']}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def digests(root):
    artifacts = root / "artifacts"
    return {p.relative_to(artifacts).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(artifacts.rglob("*")) if p.is_file()
            and p.name not in ("manifest.json", "report.md", "report.html")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", nargs="+", default=sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
    parser.add_argument("--monorepo", type=int, metavar="N", help="N generated small recipes instead")
    options = parser.parse_args()
    kind = "monorepo" if options.monorepo else "examples"
    what = f"{options.monorepo} small recipes x 2 targets" if options.monorepo else ", ".join(options.recipes)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        env = {**bytecode_env(scratch), "MOBILEBUILD_CACHE": str(scratch / "cache"),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        runs = {}
        for name in ("cold", "warm"):
            root = scratch / name
            if options.monorepo:
                monorepo(root, options.monorepo)
            else:
                checkout(root, options.recipes)
            print(f"  {name} build of {what} ...", flush=True)
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
        target = TARGET_RATIO[kind]
        return verdict(ratio <= target and built == 0,
                       f"warm-cache build of {what}: {ratio:.3f}x the cold build (target <= {target}x), {built} built")


if __name__ == "__main__":
    raise SystemExit(main())
