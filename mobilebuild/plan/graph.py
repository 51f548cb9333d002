"""Recipes -> a graph of nodes: one file artifact each, identical nodes merged. Names, configs and paths only.

A recipe gives its weights (trained, or from a checkpoint), each target's chain (plan.chain, walking the stages its
route names) and, per target, a verification and a benchmark; a manifest gathers them. Every node's up-to-date key
is `Node.key`: its stage, its settings and the toolchain versions; doit tracks its input files' contents.
"""

import os

from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import routes, stages
from mobilebuild.plan.chain import ARTIFACTS_DIR, CHAIN, Chain, forget_source_files, model_source, out_dir, source_files
from mobilebuild.plan.node import Node
from mobilebuild.plan.recipe import default_thresholds

__all__ = ["ARTIFACTS_DIR", "Node", "build", "out_dir", "recipe_nodes", "select_device"]

SERIAL_ENV_VARS = ("MOBILEBUILD_ADB_SERIAL", "ANDROID_SERIAL")
# The per-layer comparison takes at most this many of verification's inputs: each layer's SQNR sums thousands of
# values per input, and MobileNetV2's three int8 targets took 30.7 s on verification's 64 (the examples' other int8
# targets, 3.3 s)
LAYERS_SAMPLES = 16


def select_device(configured_serial=None, env=None):
    """The Android device to benchmark on: the recipe's serial, else $MOBILEBUILD_ADB_SERIAL, else $ANDROID_SERIAL;
    or None. The selection keys the bench node."""
    env = os.environ if env is None else env
    for candidate in (configured_serial, *(env.get(name) for name in SERIAL_ENV_VARS)):
        if candidate:
            return candidate
    return None


def recipe_nodes(recipe, root):
    """The nodes one recipe needs, in dependency order."""
    out = out_dir(recipe)
    source = model_source(recipe.model)
    factory_files = source_files(root, recipe.model.get("factory"))
    common = {"recipe": recipe.name, "recipe_file": recipe.file}
    nodes = []

    weights = {}
    if "train" in recipe.model:
        train = recipe.model["train"]
        node = Node("train", recipe.name, settings=stages.TrainConfig(model=source, seed=recipe.model["seed"],
                                                                      train=train, inputs=recipe.inputs),
                    inputs={}, output=f"{out}/trained.pt",
                    files=factory_files + source_files(root, train["function"]), **common)
        nodes.append(node)
        weights = {"weights": node.output}
    if "checkpoint" in recipe.model:
        weights = {"weights": recipe.model["checkpoint"]}
    checkpoint = Node("checkpoint", recipe.name,
                      settings=stages.CheckpointConfig(model=source, seed=recipe.model["seed"],
                                                       batchnorm_stats=recipe.model["batchnorm_stats"],
                                                       inputs=recipe.inputs),
                      inputs=weights, output=f"{out}/checkpoint.pt", files=factory_files, **common)
    nodes.append(checkpoint)

    timing = {key: recipe.benchmark[key] for key in ("warmup", "iters", "threads")}
    eager_bench = Node("bench", f"{recipe.name}-eager",
                       settings=stages.BenchConfig(runtime="eager", runtime_module=f"{routes.RUNTIMES_PACKAGE}.eager",
                                                   model=source, inputs=recipe.inputs, timing=timing,
                                                   runs_on_host=True),
                       inputs={"checkpoint": checkpoint.output}, output=f"{out}/bench-eager.json", files=factory_files,
                       **common)
    results = [eager_bench]
    targets = []

    problems = []
    for target in recipe.targets:
        try:
            route = routes.route_for(target, recipe.file)
            chain = Chain(recipe, target, route, root, {"checkpoint": checkpoint})
            for name in (*CHAIN, *route.stages):
                node = stages.get(name).planner()(chain)
                if node is not None:
                    chain.nodes[name] = node
                    nodes.append(node)
            verification, verification_files = _verification(chain, root)
        except MobileBuildError as exc:
            problems.append(exc)
            continue
        final, precision = chain.nodes[route.final_stage], chain.precision
        fixed = fixed_shape(recipe, route, precision, (chain.quantization or {}).get("mode", "static"))
        runtime = {"runtime": route.loader, "runtime_module": route.runtime_module_path,
                   "engine": route.engine if route.quantizer == "eager" else None, "inputs": recipe.inputs,
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
        results.append(chain.node(
            "bench", f"{recipe.name}-{target.id}",
            stages.BenchConfig(**runtime, timing=timing, device=_device_settings(recipe.benchmark["device"], route)),
            {"artifact": final}, f"{out}/bench-{target.id}.json", fields=chain.fields))
        layers = _layers(chain, verification, verification_files)
        if layers is not None:
            results.append(layers)
        targets.append({"target": target.id, "backend": route.backend, "runtime": route.runtime,
                        "precision": precision, "path": final.output, "runs_on_host": route.runs_on_host,
                        "device_only": route.device_only, "delegate": final.config.get("delegate"),
                        "pruning": target.prune or None, "quantization": chain.quantization,
                        "interpreter": final.interpreter, "fixed_shape": fixed})
    if problems:
        raise RecipeErrors(problems)

    artifacts = list(_merged(nodes).values())
    manifest = Node(
        "manifest", recipe.name,
        settings=stages.ManifestConfig(
            recipe=recipe.name, recipe_file=recipe.file, recipe_sha256=recipe.sha256,
            artifacts=[{"stage": n.stage, "path": n.output, **n.describes} for n in artifacts],
            targets=targets, checkpoint=checkpoint.output, inputs=recipe.inputs, outputs=recipe.outputs,
            verification={n.name.removeprefix(f"{recipe.name}-"): n.output for n in results if n.stage == "verify"},
            benchmarks={n.name.removeprefix(f"{recipe.name}-"): n.output for n in results if n.stage == "bench"},
            layers={n.name.removeprefix(f"{recipe.name}-"): n.output for n in results if n.stage == "layers"} or None),
        inputs={n.task_name: n.output for n in artifacts + results}, output=f"{out}/manifest.json", **common)
    plot = Node("plot", recipe.name, settings=stages.PlotConfig(recipe=recipe.name),
                inputs={"manifest": manifest.output}, output=f"{ARTIFACTS_DIR}/plots/{recipe.name}.png", **common)
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


def fixed_shape(recipe, route, precision, mode="static"):
    """Why `route`'s artifact in `precision` (int8: quantized in quantize.mode `mode`) takes only the example's sizes
    of a recipe's dynamic dims (naming them), or None."""
    dims = sorted({dim["dim"] for spec in recipe.inputs for dim in spec.get("dynamic", ())})
    if not dims:
        return None
    if route.fixed_shapes:
        why = route.fixed_shapes
    elif precision == "int8" and route.int8_fixed_shapes and mode == "static":
        why = route.int8_fixed_shapes
    elif "script" in route.stages and recipe.script == "trace":
        why = "tracing records the example's sizes (script: script keeps them)"
    else:
        return None
    return f"dim{'s' if len(dims) > 1 else ''} {', '.join(dims)} fixed at the example size: {why}"


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
    files = source_files(root, chain.recipe.model.get("factory"),
                         evaluation.get("function") if isinstance(evaluation, dict) else None)
    if evaluation is not None:
        settings["evaluation"] = evaluation
    if evaluation == "calibration-holdout" and settings["calibration"]:
        files += chain.calibration_files(quantize)
    return settings, files


def _layers(chain, verification, files):
    """The per-layer comparison of an int8 artifact the host runs (verify.layers), or None: what it reads is what
    the target's verification reads, with the quantized model (eager), the lower stage's quantization settings
    (ExecuTorch, which it runs again) or the shipped artifact (ONNX)."""
    recipe, route, target = chain.recipe, chain.route, chain.target
    if chain.precision != "int8" or not route.runs_on_host or not recipe.verify.get("layers", True):
        return None
    final = chain.nodes[route.final_stage]
    inputs = {"model": chain.nodes["fuse"], "artifact": final}
    common = {"precision": chain.precision, "inputs": recipe.inputs, "model": chain.source, "fuse": recipe.fuse,
              "samples": min(verification["samples"], LAYERS_SAMPLES), "seed": verification["seed"],
              "top": recipe.verify.get("layers_top", 5), "evaluation": verification.get("evaluation"),
              "calibration": verification["calibration"]}
    if route.quantizer == "eager" and "quantize" in chain.nodes:
        settings = stages.LayersConfig(method="mobilebuild.worker.layers.eager", engine=route.engine,
                                       quantization=chain.quantization, **common)
        inputs["quantized"] = chain.nodes["quantize"]
    elif route.final_stage == "lower" and final.settings.delegate == "xnnpack":
        lowering = final.settings
        settings = stages.LayersConfig(method="mobilebuild.worker.layers.pt2e", weights=lowering.weights,
                                       options=lowering.options,
                                       exclude=getattr(lowering, "exclude", None),
                                       observer=getattr(lowering, "observer", None),
                                       mode=getattr(lowering, "mode", "static"),
                                       **{**common, "calibration": lowering.calibration})
        files = files + final.files  # calibration's files: it calibrates again
    elif route.final_stage == "export":
        settings = stages.LayersConfig(method="mobilebuild.worker.layers.onnx", options=final.settings.options,
                                       outputs=recipe.outputs, **common)
    else:
        return None
    return chain.node("layers", f"{recipe.name}-{target.id}", settings, inputs, f"{chain.out}/layers-{target.id}.json",
                      files=tuple(dict.fromkeys(files)), fields=chain.fields)


def _device_settings(device_config, route):
    """Which Android device benchmarks a TorchScript artifact; the selection keys the bench task."""
    if route.runtime != "pytorch-mobile":
        return None
    return {"serial": select_device(device_config.get("serial")), "binary": device_config["binary"],
            "use_bundled_input": device_config["use_bundled_input"]}


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
