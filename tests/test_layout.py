"""The package's layers, read from its source: no import cycle between modules, nor between its packages (lazy imports
included, since they only hide one), the plan layer imports neither torch nor doit, the worker side never doit, the
engine (doit) layer never torch, nor what runs the build's tasks through it (tasks.py, check, tune, the CLI)."""

import ast
import re
import sys
from pathlib import Path

import pytest

from mobilebuild.routes.executorch import plan as executorch

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


FAMILY_WORKER = re.compile(r"mobilebuild\.routes\.(\w+)\.worker(\.|$)")


def family(name):
    """The route family a module of mobilebuild.routes belongs to (mobilebuild.routes.onnx.worker.export -> onnx), or
    None (the registry, mobilebuild.routes itself, and modules elsewhere)."""
    parts = name.split(".")
    return parts[2] if parts[:2] == ["mobilebuild", "routes"] and len(parts) > 2 else None


def package(name):
    """The package below mobilebuild a module belongs to (mobilebuild.engine.execute -> mobilebuild.engine); a module
    at the top (mobilebuild.tasks) is its own. A route family's plan half and its worker half are two: they stand on
    different floors (mobilebuild.routes.onnx, mobilebuild.routes.onnx.worker)."""
    if family(name):
        return ".".join(name.split(".")[:4 if FAMILY_WORKER.match(name) else 3])
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
    # what every family's stages share; it registers the families (their plan halves), and runs their worker
    # halves' stages by the module a request names
    ("mobilebuild.worker", ("doit", "mobilebuild.engine", "mobilebuild.results", "mobilebuild.preflight",
                            "mobilebuild.tune", "mobilebuild.tasks", "mobilebuild.cli")),
    ("mobilebuild.engine", ("torch", "mobilebuild.tasks", "mobilebuild.preflight", "mobilebuild.tune",
                            "mobilebuild.cli", "mobilebuild.routes")),
    ("mobilebuild.results", ("torch", "doit", "mobilebuild.routes")),
    ("mobilebuild.preflight", ("mobilebuild.routes",)),
    # the emulated aarch64 environment's set-up runs before torch matters, on the host
    ("mobilebuild.arm64", ("torch", "doit", "mobilebuild.engine", "mobilebuild.worker", "mobilebuild.results",
                           "mobilebuild.routes", "mobilebuild.preflight", "mobilebuild.tune", "mobilebuild.tasks",
                           "mobilebuild.cli")),
    # a route family's worker half: its stages, runtime and runners, on top of what the worker shares
    ("mobilebuild.routes.*.worker", ("doit", "mobilebuild.engine", "mobilebuild.results", "mobilebuild.preflight",
                                     "mobilebuild.tune", "mobilebuild.tasks", "mobilebuild.cli")),
    # a route family's plan half registers it in the plan layer; its worker half runs in the worker, named by string
    ("mobilebuild.routes", ("torch", "doit", "mobilebuild.engine", "mobilebuild.results", "mobilebuild.preflight",
                            "mobilebuild.tune", "mobilebuild.tasks", "mobilebuild.cli", "mobilebuild.worker")),
])
def test_each_layer_imports_only_what_it_may(layer, forbidden):
    offending = {name: sorted(i for i in imports(path) if i.split(".")[0] in forbidden or i.startswith(forbidden)
                              or FAMILY_WORKER.match(i) and not in_layer(name, "mobilebuild.routes.*.worker"))
                 for name, path in MODULES.items() if in_layer(name, layer)}
    assert {name: found for name, found in offending.items() if found} == {}


def in_layer(name, layer):
    """mobilebuild.routes.*.worker: every family's worker half; mobilebuild.routes: the registry and the plan
    halves."""
    if layer == "mobilebuild.routes.*.worker":
        return bool(FAMILY_WORKER.match(name))
    if layer == "mobilebuild.routes" and FAMILY_WORKER.match(name):
        return False
    return name == layer or name.startswith(f"{layer}.")


def test_a_family_imports_no_other_familys_worker_half():
    """Only a family's own code runs its stages; what two families share lives in mobilebuild.worker."""
    offending = {name: sorted(i for i in imports(path) if FAMILY_WORKER.match(i) and family(i) != family(name))
                 for name, path in MODULES.items()}
    assert {name: found for name, found in offending.items() if found} == {}


# --- a route owns everything about its target family -------------------------------------------------------------

def _route_names():
    import mobilebuild.routes  # noqa: F401 - the built-in families
    from mobilebuild.plan import routes

    found = set(executorch.BACKEND_NAMES)  # the delegates ExecuTorch's targets name
    for route in routes.all_routes():
        found |= {route.backend, route.runtime, route.runs_in.name}
    return found


def _constants(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {value for element in node.elts for value in _constants(element)}
    return set()


def _compound(text, names):
    """Whether `text` joins route names ("executorch/xnnpack": a backend keyed with its runtime)."""
    parts = text.split("/")
    return len(parts) > 1 and all(part in names for part in parts)


def route_name_uses(source, names):
    """Comparisons with a route's backend, runtime or delegate name, and tables keyed by two or more of them, or by
    compound keys of them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            constants = set().union(*(_constants(part) for part in (node.left, *node.comparators)))
            hits = constants & names | {text for text in constants if _compound(text, names)}
            found += [(node.lineno, name) for name in sorted(hits)]
        elif isinstance(node, ast.Dict):
            constants = {key.value for key in node.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)}
            compound = {text for text in constants if _compound(text, names)}
            keys = constants & names
            if len(keys) > 1 or compound:
                found += [(node.lineno, name) for name in sorted(keys | compound)]
    return found


# torch's quantized engine is named like the route that uses it (qnnpack): the FX quantizer picks its backend config
TORCH_ENGINE_MODULES = ("mobilebuild.worker.stages.fx_quantize",)


def test_nothing_outside_the_route_families_compares_backend_names():
    names = _route_names()
    offending = {name: found for name, path in MODULES.items()
                 if family(name) is None and name not in TORCH_ENGINE_MODULES
                 for found in [route_name_uses(path.read_text(), names)] if found}
    assert offending == {}


def test_the_backend_name_check_finds_a_comparison_and_a_table():
    names = {"xnnpack", "onnx"}
    assert route_name_uses('if route.backend == "xnnpack":\n    pass\n', names) == [(1, "xnnpack")]
    assert route_name_uses('ok = runtime in ("onnx", "x")\n', names) == [(1, "onnx")]
    assert route_name_uses('TABLE = {"xnnpack": 1, "onnx": 2}\n', names) == [(1, "onnx"), (1, "xnnpack")]
    assert route_name_uses('facts = {"xnnpack": True, "version": 1}\n', names) == []
    assert route_name_uses('FUSION = {"onnx/xnnpack": (1, 2)}\n', names) == [(1, "onnx/xnnpack")]
    assert route_name_uses('if key == "xnnpack/onnx":\n    pass\n', names) == [(1, "xnnpack/onnx")]
    assert route_name_uses('path = {"docs/onnx.md": 1}\n', names) == []


def code_named(path):
    """The modules of ours a source names by string ("mobilebuild.x.y", or "mobilebuild.x.y:Name")."""
    strings = {node.value for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return {text.partition(":")[0] for text in strings if re.fullmatch(r"mobilebuild(\.\w+)+(:[\w.]+)?", text)}


def test_the_plan_side_names_by_string_only_worker_code_that_exists():
    """The plan layer and the families' plan halves name the code a stage worker runs (stages, runtimes, layer
    methods, emulated-ARM runners: across a process boundary), the probe another interpreter runs, and the code of
    the in-process stages that read results (the plot); each name is a module of the package, and a family names
    only its own worker half and what the worker shares."""
    for name, path in MODULES.items():
        if not (name.startswith("mobilebuild.plan") or in_layer(name, "mobilebuild.routes")):
            continue
        for named in code_named(path):
            assert named in MODULES, (name, named)
            allowed = named.startswith(("mobilebuild.worker.", "mobilebuild.probe", "mobilebuild.results.")) or (
                FAMILY_WORKER.match(named) and family(named) == family(name))
            assert allowed, (name, named)


def test_every_registered_stage_and_runtime_names_a_module_that_exists():
    import mobilebuild.routes  # noqa: F401 - the built-in families
    from mobilebuild.plan import routes, stages

    named = {stage.module_path for stage in stages.all_stages()}
    for route in routes.all_routes():
        named |= {route.runs_in.module, *((route.runs_in.arm64.runner,) if route.runs_in.arm64 else ()),
                  *((route.generation.layers,) if route.generation and route.generation.layers else ())}
    assert named - set(MODULES) == set()


# Runs in the emulated aarch64 Python, which has the runtimes' wheels and numpy only (worker/guest/__init__.py)
def guest_modules():
    return {name: path for name, path in MODULES.items()
            if name.startswith("mobilebuild.worker.guest") or FAMILY_WORKER.match(name) and name.endswith(".guest")}


GUEST_TORCH = ("mobilebuild.routes.torchscript.worker.guest", "mobilebuild.routes.executorch.worker.guest")


def test_code_for_the_emulated_python_imports_nothing_it_lacks():
    """Nothing of mobilebuild (its dependencies are not there), torch only in the runners of torch's artifacts."""
    allowed = {"numpy", "onnxruntime", "ai_edge_litert", "executorch", "ncnn"}
    offending = {}
    assert len(guest_modules()) >= 6
    for name, path in guest_modules().items():
        found = {i for i in imports(path) if i.split(".")[0] not in allowed | set(sys.stdlib_module_names)}
        found = {i for i in found if i.split(".")[0] != "torch"} if name in GUEST_TORCH else found
        if found:
            offending[name] = sorted(found)
    assert offending == {}


def test_the_stage_code_digest_reads_every_worker_side_module():
    """A change to any code a stage runs rebuilds its nodes in a development checkout (plan/toolchain.py): the
    shared worker side and every family's worker half."""
    from mobilebuild.plan import toolchain

    read = {module_name(path) for path in toolchain.worker_sources()}
    assert read == {name for name in MODULES if name.startswith("mobilebuild.worker") or FAMILY_WORKER.match(name)}


# The packages only an extra installs (pyproject.toml): the core install has none of them
OPTIONAL = {"executorch", "torchao", "coremltools", "onnx", "onnxscript", "onnxruntime", "onnx_ir", "litert_torch",
            "ai_edge_litert", "ai_edge_quantizer", "jax", "jaxlib", "timm", "transformers", "tokenizers", "dask",
            "distributed", "ncnn", "pnnx"}


def import_time_imports(source):
    """The top-level modules a source imports as it is imported: at module level and in class bodies, not inside
    functions (those run only when called)."""
    found, pending = set(), list(ast.parse(source).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
        pending.extend(ast.iter_child_nodes(node))
    return found


def test_only_a_familys_worker_half_imports_an_extras_package_when_imported():
    """A core install (no extra) imports every module but a family's worker half without an ImportError: the
    optional packages are imported where they are used (docs/install.md)."""
    offending = {name: sorted(import_time_imports(path.read_text()) & OPTIONAL) for name, path in MODULES.items()
                 if not FAMILY_WORKER.match(name)}
    assert {name: found for name, found in offending.items() if found} == {}


def test_the_import_time_check_sees_module_and_class_level_imports_only():
    source = "import onnx\nclass A:\n    import jax\ndef f():\n    import timm\n"
    assert import_time_imports(source) == {"onnx", "jax"}
