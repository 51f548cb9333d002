"""The project's graph: every recipe below the repository's recipes/ folder, as nodes. Its one home, read by the
doit tasks (once per doit process) and the release."""

from mobilebuild.plan import graph, recipe


def nodes(root):
    """Every node of every valid recipe under `root`."""
    return load(root)[0]


def load(root):
    """(every node of every valid recipe under `root`, {recipe file: its problems, one line each} of the others): an
    invalid recipe is an error for that recipe alone."""
    recipes, problems = recipe.load_each(root)
    nodes, planning = graph.build_each(recipes, root)
    invalid = {}
    for problem in problems + planning:
        invalid.setdefault(str(problem.file or recipe.RECIPE_DIR), []).append(str(problem))
    return tuple(nodes), invalid


def by_recipe(root):
    """The nodes of each recipe, in recipe order."""
    found = {}
    for node in nodes(root):
        found.setdefault(node.recipe, []).append(node)
    return found
