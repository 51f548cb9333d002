"""`mobilebuild`: the same doit tasks as `doit` in the repository root, plus commands that need no build.

    mobilebuild build [--no-cache | --cache-read-only] [TASK | RECIPE FILE | FOLDER ...]
                                         build, verify, benchmark and report (or the named tasks, or everything of
                                         the named recipes: `doit <recipe>` too); doit options pass;
                                         --no-cache neither reads nor fills the shared artifact cache,
                                         --cache-read-only reads it and never writes to it
    mobilebuild build --dask ADDRESS|local [-n N] [TASK...]
                                         the same build with the stages run on Dask workers (a scheduler's address,
                                         or `local`: a LocalCluster of one worker process per core); files move
                                         through the shared artifact cache, which every worker must reach
    mobilebuild release [--out DIR] [--recipe NAME]... [--target ID]... [--allow-failed]
                                         copy the built, verified artifacts into DIR (default release/) with
                                         release.json: sha256, bytes, stage chain, toolchain, verification, timings
    mobilebuild release ... --signing-key KEY
                                         the same, with release.json signed (Ed25519; `mobilebuild keygen`)
    mobilebuild verify-release DIR [--trusted-key KEY]... [--keep-scratch] [--scratch DIR]
                                         check release.json's signature (with trusted keys) and every file's hash,
                                         then rebuild from the recipes in a scratch folder; exit 1 listing each file
                                         that differs from the release
    mobilebuild verify-release DIR --signature-only --trusted-key KEY
                                         the signature and hashes only, in seconds (no torch, no repository)
    mobilebuild keygen NAME [--out FILE] an Ed25519 key pair for the cache or releases: the private key to NAME.key,
                                         the public key and where each goes printed
    mobilebuild cache stats|clear|prune --max-size SIZE
                                         the shared artifact cache ($MOBILEBUILD_CACHE, default ~/.cache/mobilebuild;
                                         $MOBILEBUILD_CACHE_SIGNING_KEY signs entries,
                                         $MOBILEBUILD_CACHE_TRUSTED_KEYS checks them, $MOBILEBUILD_CACHE_READ_ONLY=1)
    mobilebuild arm64 setup|status       make (or show) the emulated aarch64 environment that runs each CPU artifact
                                         on ARM CPU models (QEMU user mode; docs/arm64.md); builds plan ARM nodes
                                         where it exists
    mobilebuild schema [--write]         the recipe schema as the route families make it (--write: into
                                         mobilebuild/recipe.schema.json, which editors read)
    mobilebuild validate [PATH...]       check recipes (files or folders; default: recipes/) without building
    mobilebuild check RECIPE [--json] [--target ID]
                                         pre-flight: each target built up to its artifact by the build's own tasks
                                         (shared with the build), run once on this host, what blocks it, what runs
                                         outside the delegate, and the architecture advice that applies (exit 0
                                         fine, 1 blocked, 2 bad recipe)
    mobilebuild tune RECIPE --target ID [--goal recipe|defaults|NAME=VALUE] [--max-candidates 16] [--write]
                   [--dask ADDRESS|local] [-n N]
                                         the fewest layers kept float (quantize.exclude, walking the per-layer error
                                         ranking) and the observer that make an int8 target meet its thresholds: a
                                         table of candidates (each a cached node of the build), then the winner as a
                                         patch of the recipe (applied with --write); exit 0 met, 1 not met, 2 bad input
    mobilebuild bench [--baseline FILE] [--save-baseline FILE] [--tolerance 0.10]
                                         benchmark every artifact; compare with, or save, a baseline of medians
    mobilebuild report                   rewrite artifacts/report.{md,html} from existing results
    mobilebuild graph [-o FILE]          the task graph as Graphviz DOT (SVG/PNG too where `dot` is installed)
    mobilebuild list|clean|forget|info ...   doit's own commands over the same tasks
    mobilebuild why TASK...              why each task would run (the recipe fields, toolchain and files that changed)
                                         or that it is up to date, then its up-to-date key's parts
"""

import argparse
import os
import sys
from pathlib import Path

import mobilebuild.routes  # noqa: F401 - registers the built-in route families before anything plans
from mobilebuild import signing
from mobilebuild.engine import commands, distributed
from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import graph, recipe
from mobilebuild.results import baseline, release


def project_tasks():
    """The repository's tasks as doit loads them: its dodo.py where it has one (a project registers its own routes
    and stages there before importing mobilebuild.tasks, and every command must see them), else mobilebuild.tasks."""
    if not Path("dodo.py").is_file():
        from mobilebuild import tasks

        return tasks
    if "dodo" not in sys.modules:
        import importlib.util

        sys.path.insert(0, os.getcwd())  # as doit does: the dodo file imports the project's modules
        spec = importlib.util.spec_from_file_location("dodo", "dodo.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["dodo"] = module
        spec.loader.exec_module(module)
    return sys.modules["dodo"]


def run_doit(args):
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from mobilebuild.engine import doit_reporters

    plugins = {"COMMAND": commands.PLUGINS, "REPORTER": doit_reporters.PLUGINS}
    return DoitMain(ModuleTaskLoader(project_tasks()), extra_config=plugins).run(args)


def _recipe_files(paths):
    for path in map(Path, paths):
        if path.is_dir():
            yield from recipe.recipe_files(path)
        else:
            yield path


# What an "ok" of validate covers: an input shape the model refuses, say, passes it and fails the build.
GRAMMAR_ONLY = ("validate checks the grammar, the files and the graph, not the model: `mobilebuild check RECIPE` "
                "builds it and runs each target on this host")


def validate(paths, root="."):
    """Check recipes and the graph they make; print one line per problem. Returns the exit status."""
    root = Path(root)
    files = list(_recipe_files(paths)) if paths else recipe.discover(root)
    if not files:
        print("no recipe files found", file=sys.stderr)
        return 2
    try:
        recipes = recipe.load_all(root, files)
        graph.build(recipes, root)
    except RecipeErrors as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 1
    for item in recipes:
        print(f"ok {item.file}: {item.name} -> {', '.join(t.id for t in item.targets)}")
    print(GRAMMAR_ONLY)
    return 0


def bench(args):
    parser = argparse.ArgumentParser(prog="mobilebuild bench", description="Benchmark every artifact; gate on a "
                                     "baseline of medians.")
    parser.add_argument("--baseline", type=Path, help="fail when a target is slower than this saved baseline")
    parser.add_argument("--save-baseline", type=Path, help="write the current medians to this file")
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed slow-down (default 0.10: 10%%)")
    options = parser.parse_args(args)
    if options.baseline and not options.baseline.is_file():
        parser.error(f"--baseline {options.baseline}: no such file")
    status = run_doit(["run", "benchmark"])
    from mobilebuild.results import report_data

    manifests = report_data.load_manifests(graph.ARTIFACTS_DIR)
    if options.save_baseline:
        baseline.save(manifests, options.save_baseline)
    if options.baseline and baseline.compare(manifests, options.baseline, options.tolerance):
        return 1
    return status


def cache_command(args):
    from mobilebuild.engine import cache

    parser = argparse.ArgumentParser(prog="mobilebuild cache", description="The shared artifact cache.")
    parser.add_argument("action", choices=["stats", "prune", "clear"])
    parser.add_argument("--max-size", type=cache.parse_size, help="prune: keep at most this much, e.g. 2GB")
    options = parser.parse_args(args)
    url = cache.default_url()
    if url is None:
        print("the artifact cache is off (MOBILEBUILD_CACHE)")
        return 0
    if options.action == "prune" and options.max_size is None:
        parser.error("prune needs --max-size")
    try:
        shared = cache.from_environment()
        if options.action == "prune":
            found = shared.prune(options.max_size)
        else:
            found = shared.stats() if options.action == "stats" else shared.clear()
    except (OSError, ValueError, ImportError, MobileBuildError) as exc:  # storage, fsspec driver, read-only, keys
        print(f"mobilebuild cache {options.action}: {str(exc).replace(url, cache.redact(url))}", file=sys.stderr)
        return 1
    print(f"{shared.location}: " + ", ".join(f"{key} {value}" for key, value in found.items() if key != "location"))
    return 0


def build_on_dask(address, args):
    """doit in threads, one per Dask worker thread, each handing its node to the cluster (distributed.py)."""
    with distributed.cluster(address) as slots:
        rest = args[1:] if args[:1] == ["build"] else args
        if not {"-n", "--process"} & set(rest):
            rest = ["-n", str(slots), *rest]
        return run_doit(["run", "-P", "thread", *rest])  # no task named: doit runs the default, build


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"], ["help"]) and len(args) == 1:
        print(__doc__.strip())
        return 0
    if args[:1] == ["keygen"]:
        return signing.keygen_command(args[1:])
    if args[:1] == ["verify-release"] and "--signature-only" in args:
        return release.verify_release_command(args[1:])  # the release alone: no project, no torch
    if args[:1] not in (["cache"], ["bench"]):
        project_tasks()  # the project's own routes, registered before anything plans
    if args[:1] == ["check"]:
        from mobilebuild.preflight import check_command  # imports torch (and doit): only for this command

        return check_command(args[1:])
    if args[:1] == ["tune"]:
        from mobilebuild.tune.command import tune_command

        return tune_command(args[1:])
    if args[:1] == ["validate"]:
        return validate(args[1:])
    if args[:1] == ["schema"]:
        return schema_command(args[1:])
    if args[:1] == ["arm64"]:
        from mobilebuild.arm64.command import arm64_command
        from mobilebuild.plan import routes

        return arm64_command(args[1:], routes.arm64_runtimes())
    if args[:1] == ["bench"]:
        return bench(args[1:])
    if args[:1] == ["release"]:
        return release.release_command(args[1:])
    if args[:1] == ["verify-release"]:
        return release.verify_release_command(args[1:])
    if args[:1] == ["cache"]:
        return cache_command(args[1:])
    if "--no-cache" in args:
        args.remove("--no-cache")
        os.environ["MOBILEBUILD_CACHE"] = "off"  # the workers, Dask's too, inherit it
    if "--cache-read-only" in args:
        args.remove("--cache-read-only")
        os.environ["MOBILEBUILD_CACHE_READ_ONLY"] = "1"
    if "--dask" in args[:-1]:
        at = args.index("--dask")
        address = args[at + 1]
        del args[at:at + 2]
        try:
            return build_on_dask(address, args)
        except MobileBuildError as exc:
            print(f"mobilebuild build: {exc}", file=sys.stderr)
            return 2
    if args[:1] == ["build"]:
        try:
            rest = recipe_tasks(args[1:])
        except ValueError as exc:
            print(f"mobilebuild build: {exc}", file=sys.stderr)
            return 2
        return run_doit(["run", *rest] if rest else ["run", "build"])
    return run_doit(args)


def schema_command(args):
    """recipe.schema.json as the registered route families make it: printed, or written with --write."""
    if args not in ([], ["--write"]):
        print("usage: mobilebuild schema [--write]")
        return 2
    text = recipe.schema_text()
    if args:
        recipe.SCHEMA_PATH.write_text(text)
        print(f"wrote {recipe.SCHEMA_PATH}")
    else:
        print(text, end="")
    return 0


def recipe_tasks(args, root="."):
    """`build` arguments with each recipe file or folder replaced by the tasks that build, verify and benchmark its
    recipes (an invalid one: its `invalid:` task, which fails with its problems). Raises ValueError for a path that
    holds no recipe of this repository."""
    if not any(_is_recipe_path(arg) for arg in args):
        return args
    from mobilebuild.plan import project

    nodes, invalid = project.load(root)
    by_file = {}
    for node in nodes:
        by_file.setdefault(node.recipe_file, [f"verified:{node.recipe}"]).append(node.task_name)
    expanded = []
    for arg in args:
        if not _is_recipe_path(arg):
            expanded.append(arg)
            continue
        files = [Path(os.path.relpath(path, root)).as_posix() for path in _recipe_files([arg])]
        unknown = [file for file in files if file not in by_file and file not in invalid]
        if unknown or not files:
            raise ValueError(f"{unknown[0] if unknown else arg} is not a recipe of this repository (recipes live "
                             f"in {recipe.RECIPE_DIR}/ as .yaml files)")
        for file in files:
            expanded += by_file.get(file) or [f"invalid:{file}"]
    return expanded


def _is_recipe_path(arg):
    return not arg.startswith("-") and (Path(arg).is_dir() or Path(arg).suffix in (".yaml", ".yml"))


if __name__ == "__main__":
    sys.exit(main())
