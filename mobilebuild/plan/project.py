"""The project's graph: every recipe below the repository's recipes/ folder, as nodes. Its one home, read by the
doit tasks (once per doit process) and the release."""

from mobilebuild.plan import graph, recipe


def nodes(root):
    """Every node of every recipe under `root`; raises RecipeErrors with every problem found."""
    return tuple(graph.build(recipe.load_all(root), root))


def by_recipe(root):
    """The nodes of each recipe, in recipe order."""
    found = {}
    for node in nodes(root):
        found.setdefault(node.recipe, []).append(node)
    return found
