"""The package's layers, read from its source: no import cycle between modules, nor between its packages (lazy imports
included, since they only hide one), the plan layer imports neither torch nor doit, the worker side never doit, the
engine (doit) layer never torch, nor what runs the build's tasks through it (tasks.py, check, tune, the CLI)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "mobilebuild"


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(path):
    """Every module `path` imports, at the top or inside a function."""
    name = module_name(path)
    return imports_of_source(path.read_text(), name if path.name == "__init__.py" else name.rpartition(".")[0])


def imports_of_source(source, package):
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from package import module`
    return found


def own_imports(path):
    return {name for name in imports(path) if name in MODULES and name != module_name(path)}


def cycles(graph):
    """Strongly connected components of an import graph ({module: modules it imports}) with more than one module
    (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_module_imports_itself_through_others():
    assert cycles({name: own_imports(path) for name, path in MODULES.items()}) == []


def package(name):
    """The package below mobilebuild a module belongs to (mobilebuild.engine.execute -> mobilebuild.engine); a module
    at the top (mobilebuild.tasks) is its own."""
    return ".".join(name.split(".")[:2])


def package_graph(graph):
    """{package: the other packages its modules import} of a module import graph."""
    found = {package(name): set() for name in graph}
    for name, imported in graph.items():
        found[package(name)].update(package(other) for other in imported if package(other) != package(name))
    return found


def test_no_package_imports_itself_through_others():
    """mobilebuild.engine imports nothing that imports it back (mobilebuild.tune importing the engine's runner,
    the engine's clean command importing tune's constants was one)."""
    assert cycles(package_graph({name: own_imports(path) for name, path in MODULES.items()})) == []


def test_the_package_check_finds_a_cycle_between_modules_that_do_not_form_one():
    graph = {"mobilebuild.engine.commands": {"mobilebuild.tune.command"}, "mobilebuild.tune.command": {
        "mobilebuild.tasks"}, "mobilebuild.tasks": {"mobilebuild.engine.execute"}, "mobilebuild.engine.execute": set()}
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == [["mobilebuild.engine", "mobilebuild.tasks", "mobilebuild.tune"]]


def test_the_cycle_check_finds_a_cycle_that_lazy_imports_hide(tmp_path):
    lazy = tmp_path / "mobilebuild_probe.py"
    lazy.write_text("def report():\n    from mobilebuild.engine import actions\n")
    assert "mobilebuild.engine.actions" in imports_of_source(lazy.read_text(), "mobilebuild.probe")
    graph = {"tasks": {"reporter"}, "reporter": {"execute"}, "execute": {"tasks"}, "store": set()}
    assert cycles(graph) == [["execute", "reporter", "tasks"]]


@pytest.mark.parametrize(("layer", "forbidden"), [
    ("mobilebuild.plan", ("torch", "doit", "mobilebuild.engine", "mobilebuild.worker", "mobilebuild.results",
                          "mobilebuild.preflight", "mobilebuild.routes")),
    ("mobilebuild.worker", ("doit", "mobilebuild.engine", "mobilebuild.results", "mobilebuild.routes")),
    ("mobilebuild.engine", ("torch", "mobilebuild.tasks", "mobilebuild.preflight", "mobilebuild.tune",
                            "mobilebuild.cli", "mobilebuild.routes")),
    ("mobilebuild.results", ("torch", "doit", "mobilebuild.routes")),
    ("mobilebuild.preflight", ("mobilebuild.routes",)),
    # a route family registers itself in the plan layer; its worker-side code runs in the worker, named by string
    ("mobilebuild.routes", ("torch", "doit", "mobilebuild.engine", "mobilebuild.results", "mobilebuild.preflight",
                            "mobilebuild.tune", "mobilebuild.tasks", "mobilebuild.cli")),
])
def test_each_layer_imports_only_what_it_may(layer, forbidden):
    offending = {name: sorted(i for i in imports(path) if i.split(".")[0] in forbidden or i.startswith(forbidden))
                 for name, path in MODULES.items() if name == layer or name.startswith(f"{layer}.")}
    assert {name: found for name, found in offending.items() if found} == {}
