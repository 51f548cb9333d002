"""Checking a whole recipe: its model built once (structure.py), then each target's check (targets.py)."""

import time
from pathlib import Path

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import recipe, routes, toolchain
from mobilebuild.preflight.advice import BLOCKING
from mobilebuild.preflight.structure import Model
from mobilebuild.preflight.targets import TargetCheck
from mobilebuild.worker.quiet import quiet

VERSIONS = ("torch", "executorch", "onnxruntime")  # what the report's header names


def _load(recipe_path, root, only):
    """The recipe and its targets' routes; a bad recipe raises (RecipeErrors or MobileBuildError)."""
    loaded = recipe.load(recipe_path, root)
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
            interpreter = toolchain.interpreter(target.toolchain, loaded.file, root,
                                                f"targets[{target.index}].toolchain")
        except MobileBuildError as exc:
            problems.append(exc)
            continue
        chosen.append((target, route, interpreter))
    if problems:
        raise RecipeErrors(problems)
    return loaded, chosen


def _quiet():
    """torch.ao and torch.jit warn about deprecations on every call; the findings are what the user reads."""
    return quiet(logs=None, output=False)


def run(recipe_path, root, targets=None):
    """Check every target of the recipe at `recipe_path` (relative to `root`, or absolute), or only the target ids
    in `targets`. Returns the report: JSON-able, findings per target, seconds per check. A bad recipe, or a model
    that cannot be built from it, raises MobileBuildError (or RecipeErrors) with one line per problem."""
    root = Path(root)
    loaded, chosen = _load(recipe_path, root, targets)
    started = time.perf_counter()
    with _quiet():
        try:
            model = Model(loaded, root)
        except MobileBuildError as exc:
            raise exc.located(loaded.file) from None
        model_seconds = time.perf_counter() - started
        shared, results = {}, []
        for target, route, interpreter in chosen:
            started = time.perf_counter()
            check = TargetCheck(target, route, model, shared, interpreter)
            check.run()
            results.append({"target": target.id, "backend": route.backend, "runtime": route.runtime,
                            "precision": route.precision(target), **check.facts, "findings": check.findings,
                            "notes": check.notes, "seconds": round(time.perf_counter() - started, 2)})
    every = model.findings + [item for result in results for item in result["findings"]]
    blocking = sum(item["kind"] in BLOCKING for item in every)
    versions = {name: toolchain.versions()[name] for name in VERSIONS}
    return {"recipe": loaded.name, "file": loaded.file, "versions": versions,
            "model": {"findings": model.findings, "notes": model.notes, "seconds": round(model_seconds, 2)},
            "targets": results, "blocking": blocking, "advice": len(every) - blocking,
            "exit_code": 1 if blocking else 0}
