"""Recipes -> a graph of nodes: one file artifact each, identical nodes merged. Names, configs and paths only.

A recipe gives its weights (trained, or from a checkpoint), each target's chain (plan.chain, walking the stages its
route names) and, per target, a verification and a benchmark; a manifest gathers them. Every node's up-to-date key
is `Node.key`: its stage, its settings and the toolchain versions; doit tracks its input files' contents.
"""

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import arm64, generation, routes, stages
from mobilebuild.plan.chain import (
    ARTIFACTS_DIR,
    CHAIN,
    Chain,
    checked_node,
    forget_source_files,
    model_files,
    out_dir,
    recipe_source,
    source_files,
)
from mobilebuild.plan.node import Node
from mobilebuild.plan.recipe import default_thresholds

__all__ = ["ARTIFACTS_DIR", "LAYERS_SAMPLES", "Node", "build", "out_dir", "recipe_nodes"]

# The per-layer comparison takes at most this many of verification's inputs: each layer's SQNR sums thousands of
# values per input, and MobileNetV2's three int8 targets took 30.7 s on verification's 64 (the examples' other int8
# targets, 3.3 s)
LAYERS_SAMPLES = 16


def recipe_nodes(recipe, root):
    """The nodes one recipe needs, in dependency order."""
    out = out_dir(recipe)
    source = recipe_source(recipe)
    factory_files = model_files(root, recipe.model)
    nodes = []

    weights = {}
    if "train" in recipe.model:
        train = recipe.model["train"]
        node = checked_node(recipe, "train", recipe.name,
                            stages.TrainConfig(model=source, seed=recipe.model["seed"], train=train,
                                               inputs=recipe.inputs),
                            {}, f"{out}/trained.pt", files=factory_files + source_files(root, train["function"]))
        nodes.append(node)
        weights = {"weights": node}
    if "checkpoint" in recipe.model:
        weights = {"weights": recipe.model["checkpoint"]}
    checkpoint = checked_node(recipe, "checkpoint", recipe.name,
                              stages.CheckpointConfig(model=source, seed=recipe.model["seed"],
                                                      batchnorm_stats=recipe.model["batchnorm_stats"],
                                                      inputs=recipe.inputs),
                              weights, f"{out}/checkpoint.pt", files=factory_files)
    nodes.append(checkpoint)

    timing = {key: recipe.benchmark[key] for key in ("warmup", "iters", "threads")}
    if recipe.generate:
        eager_bench = checked_node(recipe, generation.BENCH, f"{recipe.name}-eager",
                                   generation.eager_bench_config(recipe, source), {"checkpoint": checkpoint},
                                   f"{out}/bench-eager.json", files=factory_files)
    else:
        eager_bench = checked_node(recipe, "bench", f"{recipe.name}-eager",
                                   stages.BenchConfig(runtime="eager",
                                                      runtime_module=routes.EAGER_RUNTIME,
                                                      model=source, inputs=recipe.inputs, timing=timing,
                                                      runs_on_host=True),
                                   {"checkpoint": checkpoint}, f"{out}/bench-eager.json", files=factory_files)
    results = [eager_bench]
    targets = []
    emulated = arm64.current() if recipe.verify.get("arm64", {}) is not False else None
    for cpu in (recipe.verify.get("arm64") or {}).get("cpus", ()) if emulated else ():
        if why := arm64.refused(cpu, emulated["qemu"]):
            raise RecipeErrors([MobileBuildError(why, file=recipe.file, field="verify.arm64.cpus")])

    problems = []
    for target in recipe.targets:
        try:
            route = routes.route_for(target, recipe.file, generative=bool(recipe.generate))
            chain = Chain(recipe, target, route, root, {"checkpoint": checkpoint})
            if recipe.generate:  # a language model: its own chain, verification and timing
                shipped, checks, entry = generation.target_nodes(chain, root)
                nodes.extend(shipped)
                results.extend(checks)
                targets.append(entry)
                continue
            for planner in (*CHAIN, *(stages.get(name).planner() for name in route.stages)):
                node = planner(chain)
                if node is not None:
                    chain.nodes[node.stage] = node
                    nodes.append(node)
            verification, verification_files = _verification(chain, root)
        except MobileBuildError as exc:
            problems.append(exc)
            continue
        final, precision = chain.nodes[route.final_stage], chain.precision
        fixed = route.fixed_shape(recipe, precision, (chain.quantization or {}).get("mode", "static"))
        runtime = {"runtime": route.runs_in.name, "runtime_module": route.runs_in.module,
                   "engine": route.engine if route.quantizes_eagerly else None, "inputs": recipe.inputs,
                   "runs_on_host": route.runs_on_host, "host_reason": route.host_reason}
        results.append(chain.node(
            "verify", f"{recipe.name}-{target.id}",
            stages.VerifyConfig(**runtime, model=source, precision=precision, pruning=target.prune,
                                outputs=recipe.outputs, fixed_shape=fixed,
                                **verification),
            # a pruned artifact is checked against the pruned eager model: the build must not change it further;
            # and measured against the unpruned one: what pruning cost
            {"artifact": final, "checkpoint": chain.nodes.get("prune") or checkpoint,
             **({"unpruned": checkpoint} if "prune" in chain.nodes else {})},
            f"{out}/verify-{target.id}.json", files=verification_files, fields=chain.fields))
        device = route.runs_in.device_bench
        results.append(chain.node(
            "bench", f"{recipe.name}-{target.id}",
            stages.BenchConfig(**runtime, timing=_timing_for(route, timing),
                               device=device(recipe.benchmark["device"]) if device is not None else None),
            {"artifact": final}, f"{out}/bench-{target.id}.json", fields=chain.fields))
        layers = _layers(chain, verification, verification_files)
        if layers is not None:
            results.append(layers)
        results.extend(_arm64(chain, emulated, runtime, verification, verification_files, fixed))
        targets.append({"target": target.id, "backend": route.backend, "runtime": route.runtime,
                        "precision": precision, "path": final.output, "runs_on_host": route.runs_on_host,
                        "device_only": route.runs_in.device_only, "delegate": final.config.get("delegate"),
                        "pruning": target.prune or None, "quantization": chain.quantization,
                        "interpreter": final.interpreter, "fixed_shape": fixed})
    if problems:
        raise RecipeErrors(problems)

    artifacts = list(_merged(nodes).values())
    manifest = checked_node(
        recipe, "manifest", recipe.name,
        stages.ManifestConfig(
            recipe=recipe.name, recipe_file=recipe.file, recipe_sha256=recipe.sha256,
            artifacts=[{"stage": n.stage, "path": n.output, **n.describes} for n in artifacts],
            targets=targets, checkpoint=checkpoint.output, inputs=recipe.inputs, outputs=recipe.outputs,
            verification={n.name.removeprefix(f"{recipe.name}-"): n.output for n in results
                          if n.stage in ("verify", generation.VERIFY)},
            benchmarks={n.name.removeprefix(f"{recipe.name}-"): n.output for n in results
                        if n.stage in ("bench", generation.BENCH)},
            layers={n.name.removeprefix(f"{recipe.name}-"): n.output for n in results
                    if n.stage in ("layers", generation.LAYERS)} or None,
            arm64=_arm64_results(recipe, results) or None),
        {n.task_name: n for n in artifacts + results}, f"{out}/manifest.json")
    plot = checked_node(recipe, "plot", recipe.name, stages.PlotConfig(recipe=recipe.name), {"manifest": manifest},
                        f"{ARTIFACTS_DIR}/plots/{recipe.name}.png")
    return artifacts + results + [manifest, plot]


def _merged(nodes):
    """{task name: node}, a node the chains of several targets share once. Two different nodes under one name would
    leave one target built from the other's settings (a target's own quantization named like its engine's shared
    one did): a bug of ours."""
    found = {}
    for node in nodes:
        same = found.setdefault(node.task_name, node)
        if (same.key(), same.inputs, same.output) != (node.key(), node.inputs, node.output):
            raise AssertionError(f"two different nodes are both {node.task_name}")
    return found


def _verification(chain, root):
    """(the verify stage's settings from the recipe's `verify` and the target's calibration, the files it reads)."""
    verify, quantize = chain.recipe.verify, chain.target.quantize
    evaluation = verify.get("evaluation")
    calibrated = (chain.quantization or {}).get("mode") == "static"
    settings = {"samples": verify["samples"], "seed": verify["seed"],
                "thresholds": verify["thresholds"][chain.precision],
                "default_thresholds": default_thresholds(chain.precision), "calibrated": calibrated,
                # only where it matters: a new calibration re-verifies what it made, or what verifies on its holdout
                "calibration": quantize.get("calibration") if calibrated or evaluation == "calibration-holdout"
                else None}
    files = model_files(root, chain.recipe.model) + source_files(
        root, evaluation.get("function") if isinstance(evaluation, dict) else None)
    if evaluation is not None:
        settings["evaluation"] = evaluation
    if evaluation == "calibration-holdout" and settings["calibration"]:
        files += chain.calibration_files(quantize)
    return settings, files


UNRANKED_ITERS = 20  # timed runs enough for a timing that is shown but never ranked (a software GPU driver's)


def _timing_for(route, timing):
    """The recipe's timing, its timed runs capped where the route's host timings are never ranked (they would take
    minutes on a software driver for a number nobody compares)."""
    if route.runs_in.unranked is None:
        return timing
    return {**timing, "iters": min(timing["iters"], UNRANKED_ITERS)}


def _layers(chain, verification, files):
    """The per-layer comparison of an int8 artifact the host runs (verify.layers), as its route plans it, or None."""
    recipe, route = chain.recipe, chain.route
    if chain.precision != "int8" or not route.runs_on_host or not recipe.verify.get("layers", True):
        return None
    if route.checks.layers is None:
        return None
    return route.checks.layers(chain, layers_common(chain, verification), files)


def _arm64(chain, environment, runtime, verification, files, fixed):
    """The target's nodes on each emulated ARM CPU of verify.arm64: a CPU artifact of a runtime the environment
    has (`mobilebuild arm64 setup`), none where there is no environment."""
    route, recipe = chain.route, chain.recipe
    if environment is None or not route.runs_on_host or route.runs_in.name not in environment["runtimes"]:
        return []
    settings = recipe.verify.get("arm64") or {}
    common = {key: verification[key] for key in ("samples", "seed", "thresholds", "evaluation", "calibration")
              if key in verification}
    common["samples"] = settings.get("samples", arm64.DEFAULT_SAMPLES)
    final = chain.nodes[route.final_stage]
    return [chain.node("arm64", f"{recipe.name}-{chain.target.id}-{cpu}", stages.Arm64Config(
                runtime=runtime["runtime"], runtime_module=runtime["runtime_module"], engine=runtime["engine"],
                runner=route.runs_in.arm64.runner, cpu=cpu,
                emulator=arm64.emulator(environment, cpu, route.runs_in.name), inputs=recipe.inputs, model=chain.source,
                precision=chain.precision, outputs=recipe.outputs, fixed_shape=fixed, **common),
                {"artifact": final, "checkpoint": chain.nodes.get("prune") or chain.nodes["checkpoint"]},
                f"{chain.out}/arm64-{chain.target.id}-{cpu}.json", files=files, fields=chain.fields,
                describes={"target": chain.target.id})
            for cpu in settings.get("cpus", arm64.DEFAULT_CPUS)]


def _arm64_results(recipe, results):
    """{target: {CPU model: its arm64 result}}."""
    found = {}
    for node in results:
        if node.stage == "arm64":
            found.setdefault(node.describes["target"], {})[node.settings.cpu] = node.output
    return found


def layers_common(chain, verification):
    """The per-layer comparison's settings every method shares: what it reads is what the target's verification
    reads."""
    recipe = chain.recipe
    return {"precision": chain.precision, "inputs": recipe.inputs, "model": chain.source, "fuse": recipe.fuse,
            "samples": min(verification["samples"], LAYERS_SAMPLES), "seed": verification["seed"],
            "top": recipe.verify.get("layers_top", 5), "evaluation": verification.get("evaluation"),
            "calibration": verification["calibration"]}


def build(recipes, root):
    """All nodes of all recipes; raises RecipeErrors with every problem found."""
    nodes, problems = build_each(recipes, root)
    if problems:
        raise RecipeErrors(problems)
    return nodes


def build_each(recipes, root):
    """(the nodes of every recipe that plans, the problems of those that do not)."""
    forget_source_files()  # files may have come or gone since an earlier plan in this process
    nodes, problems = [], []
    for recipe in recipes:
        try:
            nodes.extend(recipe_nodes(recipe, root))
        except RecipeErrors as exc:
            problems.extend(exc.errors)
    return nodes, problems
