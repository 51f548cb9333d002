"""`mobilebuild`: the same doit tasks as `doit` in the repository root, plus commands that need no build.

    mobilebuild build [TASK...]      build everything (or the named tasks); doit options pass through
    mobilebuild validate [PATH...]   check recipes (files or folders; default: recipes/) without building
    mobilebuild list|clean|forget|info ...   doit's own commands over the same tasks
"""

import sys
from pathlib import Path

from mobilebuild import graph, recipe
from mobilebuild.errors import RecipeErrors


def run_doit(args):
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from mobilebuild import tasks

    return DoitMain(ModuleTaskLoader(tasks)).run(args)


def _recipe_files(paths, root):
    for path in map(Path, paths):
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in recipe.RECIPE_SUFFIXES and p.is_file())
        else:
            yield path


def validate(paths, root="."):
    """Check recipes and the graph they make; print one line per problem. Returns the exit status."""
    root = Path(root)
    files = list(_recipe_files(paths, root)) if paths else recipe.discover(root)
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
    return 0


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help") and len(args) == 1:
        print(__doc__.strip())
        return 0
    if args and args[0] == "validate":
        return validate(args[1:])
    if args and args[0] == "build":
        return run_doit(["run", *args[1:]] if len(args) > 1 else ["run", "build"])
    return run_doit(args)


if __name__ == "__main__":
    sys.exit(main())
