"""Checking a whole recipe: its model's structure (structure.py, or what an earlier check found for the same model:
recorded.py), each target's shipped artifact made by the build's own tasks (shipped.py), then what the artifact, the
model and the recipe's verify settings (verification.py) say for each target (targets.py)."""

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import project, recipe, routes, toolchain
from mobilebuild.preflight.advice import BLOCKING
from mobilebuild.preflight.recorded import Memory, cached_structure, remember_structure, structure_key
from mobilebuild.preflight.shipped import make
from mobilebuild.preflight.targets import TargetCheck
from mobilebuild.preflight.verification import RecipeVerification
from mobilebuild.worker.quiet import quiet


def _load(recipe_path, root, only):
    """The recipe and its targets' routes; a bad recipe raises (RecipeErrors or MobileBuildError)."""
    loaded = recipe.load(recipe_path, root)
    if loaded.generate:
        raise MobileBuildError("check does not cover language models yet (generate:): `mobilebuild build` builds "
                               "each target and verifies it token by token (docs/llm.md)", file=loaded.file,
                               field="generate")
    known = [target.id for target in loaded.targets]
    unknown = [name for name in only or () if name not in known]
    if unknown:
        raise MobileBuildError(f"no target {', '.join(map(repr, unknown))} in the recipe (targets: "
                               f"{', '.join(known)})", file=loaded.file, field="targets")
    chosen, problems = [], []
    for target in loaded.targets:
        if only and target.id not in only:
            continue
        try:
            route = routes.route_for(target, loaded.file)
            toolchain.interpreter(target.toolchain, loaded.file, root, f"targets[{target.index}].toolchain")
        except MobileBuildError as exc:
            problems.append(exc)
            continue
        chosen.append((target, route))
    if problems:
        raise RecipeErrors(problems)
    return loaded, chosen


def _artifacts(loaded, chosen, root):
    """({target id: the node that writes its shipped artifact}, every node of the project by task name): the build's
    own graph, of which the recipe must be part."""
    nodes, invalid = project.load(root)
    if loaded.file in invalid:  # valid alone, not beside the others (a duplicate name)
        raise RecipeErrors([MobileBuildError(line) for line in invalid[loaded.file]])
    by_task = {node.task_name: node for node in nodes}
    shipped_nodes = {node.describes["target"]: node for node in nodes
                     if node.recipe_file == loaded.file and "target" in node.describes}
    if not shipped_nodes:
        raise MobileBuildError(f"not a recipe of this repository: check runs the build's own tasks, which build the "
                               f"recipes under {recipe.RECIPE_DIR}/", file=loaded.file)
    return {target.id: shipped_nodes[target.id] for target, _ in chosen}, by_task


@dataclass
class Model:
    """The recipe's model as the checks of its targets see it: the recipe, and what its structure says (structure.py's
    facts: activations after each layer, whether it converts its own input to NHWC, the structure of its outputs and
    their tensors' names, whether it has QuantStubs of its own, findings, notes). `cached`: the facts are an earlier
    check's, for the same model, inputs, fusion, code and versions."""

    recipe: object
    activations: list
    converts_to_nhwc: bool
    findings: list
    notes: list
    outputs_structure: object = None
    own_stubs: bool = False
    cached: bool = False
    output_names: list | None = None

    @property
    def inputs(self):
        return self.recipe.inputs

    @property
    def outputs(self):
        return self.recipe.outputs


def model_facts(loaded, root, memory):
    """The model's structure facts: an earlier check's for the same key, else analysed now (torch, the model built
    and fused) and remembered."""
    key = structure_key(loaded, root)
    facts = cached_structure(memory, key)
    if facts is not None:
        return _model(loaded, facts, cached=True)
    from mobilebuild.preflight.structure import analyse  # torch, and the model's own imports (torchvision)

    with _quiet():
        try:
            facts = analyse(loaded, root)
        except MobileBuildError as exc:
            raise exc.located(loaded.file) from None
    remember_structure(memory, key, facts)
    return _model(loaded, facts)


def _model(loaded, facts, cached=False):
    return Model(loaded, facts["activations"], facts["converts_to_nhwc"], facts["findings"], facts["notes"],
                 facts.get("outputs"), facts.get("own_stubs", False), cached, facts.get("output_names"))


def _quiet():
    """torch.ao and torch.jit warn about deprecations on every call; the findings are what the user reads."""
    return quiet(logs=None, output=False)


def run(recipe_path, root, targets=None, on_model=None, on_target=None):
    """Check every target of the recipe at `recipe_path` (relative to `root`, the repository, or absolute), or only
    the target ids in `targets`: each target's artifact is made by the build's own tasks (reusing what a build
    made, and left for the build to reuse), then inspected. `on_model(report)` is called once the model's structure
    is known, `on_target(result)` as each target finishes. Returns the report: JSON-able, findings per target. A bad
    recipe, or a model that cannot be built from it, raises MobileBuildError (or RecipeErrors) with one line per
    problem."""
    root = Path(root).resolve()
    loaded, chosen = _load(recipe_path, root, targets)
    with contextlib.chdir(root):
        artifacts, nodes = _artifacts(loaded, chosen, root)
        started = time.perf_counter()
        memory = Memory(root, loaded.name)
        model = model_facts(loaded, root, memory)
        versions = {name: toolchain.versions()[name] for name in routes.runtime_packages()}
        report = {"recipe": loaded.name, "file": loaded.file, "versions": versions,
                  "families": routes.installed_families(toolchain.installed()),
                  "model": {"findings": model.findings, "notes": model.notes, "cached": model.cached,
                            "seconds": round(time.perf_counter() - started, 2)}}
        if on_model:
            on_model(report)

        by_task = {artifacts[target.id].task_name: (target, route) for target, route in chosen}
        verification = RecipeVerification(root, model.output_names, memory)
        results, last = {}, [time.perf_counter()]

        def finished(task_name, outcome):
            target, route = by_task[task_name]
            check = TargetCheck(target, route, model, artifacts[target.id], nodes, memory, verification)
            with _quiet():
                check.run(outcome)
            results[target.id] = {"target": target.id, "backend": route.backend, "runtime": route.runtime,
                                  "precision": route.precision(target), **check.facts, "findings": check.findings,
                                  "notes": check.notes, "seconds": round(time.perf_counter() - last[0], 2)}
            last[0] = time.perf_counter()
            if on_target:
                on_target(results[target.id])

        make(list(by_task), finished, verify_tasks={task_name: f"verify:{artifacts[target.id].name}"
                                                    for task_name, (target, _) in by_task.items()})
    ordered = [results[target.id] for target, _ in chosen]
    every = model.findings + [item for result in ordered for item in result["findings"]]
    blocking = sum(item["kind"] in BLOCKING for item in every)
    return {**report, "targets": ordered, "blocking": blocking, "advice": len(every) - blocking,
            "exit_code": 1 if blocking else 0}
