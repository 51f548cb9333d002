"""Recipes -> a graph of nodes: one file artifact each, identical nodes merged. Names, configs and paths only.

Every node's up-to-date key is computed here (`Node.key`): its stage, the slice of the recipe it uses and the
toolchain versions; the contents of its input files are tracked by doit as file dependencies.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

from mobilebuild import backends, device, toolchain
from mobilebuild.errors import MobileBuildError, RecipeErrors

ARTIFACTS_DIR = "artifacts"

# Stage order, for listing and documentation; each is a doit task group.
STAGES = ("train", "checkpoint", "prune", "fuse", "quantize", "script", "optimize", "nnapi", "lower", "export",
          "verify", "bench", "manifest")


@dataclass(frozen=True)
class Node:
    stage: str
    name: str  # unique within its stage; the doit task is "<stage>:<name>"
    recipe: str
    recipe_file: str
    config: dict  # the part of the recipe this node uses, JSON-able
    inputs: dict  # role -> output path of an upstream node
    output: str
    files: tuple = ()  # files from outside the graph that the node reads
    describes: dict = field(default_factory=dict)  # backend/runtime, for the manifest
    # Where settings a stage names by their recipe-level field sit for this node, when elsewhere: a target's own
    # `prune` or `quantize`, the target itself for "targets". Not part of the key: reordering targets rebuilds nothing.
    fields: dict = field(default_factory=dict)
    interpreter: str | None = None  # another Python that runs the stage (a target's `toolchain`)

    @property
    def task_name(self):
        return f"{self.stage}:{self.name}"

    def key(self):
        return {"stage": self.stage, "config": self.config, "toolchain": toolchain.versions(self.interpreter)}

    def dependencies(self):
        return [*self.inputs.values(), *self.files]


def _source_files(root, *specs):
    """The repository files behind 'package.module:function' specs that live in the repository, found without
    importing anything, so that editing a factory rebuilds what it made."""
    found = []
    for spec in filter(None, specs):
        module = spec.split(":")[0].split(".")
        for candidate in (Path(root, *module).with_suffix(".py"), Path(root, *module, "__init__.py")):
            if candidate.is_file():
                found.append(candidate.relative_to(root).as_posix())
                break
    return tuple(found)


def _files_below(directory, root):
    """The files below `directory`, relative to `root` and sorted, and which of them are symlinks. Read from directory
    entries, without a stat per plain file: a calibration folder may hold thousands of images, listed at every task
    load. Like Path.rglob, it does not enter symlinked folders and skips unreadable ones."""
    prefix = os.path.join(root, "")
    files, links, pending = [], [], [os.path.join(root, directory)]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
            elif entry.is_file():  # a symlink to a file is a file here, and a link to check
                name = entry.path[len(prefix):].replace(os.sep, "/")
                files.append(name)
                if entry.is_symlink():
                    links.append(name)
    return sorted(files), links


def _escaping(links, root):
    """The symlinks that lead outside the repository: recipe paths must stay inside it, links included."""
    inside = Path(root).resolve()
    return [link for link in links if not Path(root, link).resolve().is_relative_to(inside)]


def _model_source(model):
    keys = ("torchvision", "quantizable", "factory", "kwargs")
    return {k: model[k] for k in keys if k in model}


def recipe_nodes(recipe, root):
    """The nodes one recipe needs, in dependency order."""
    out = out_dir(recipe)
    source = _model_source(recipe.model)
    source_files = _source_files(root, recipe.model.get("factory"))
    common = {"recipe": recipe.name, "recipe_file": recipe.file}
    nodes = []

    weights = {}
    if "train" in recipe.model:
        train = recipe.model["train"]
        node = Node("train", recipe.name, config={"model": source, "seed": recipe.model["seed"], "train": train,
                                                  "input": recipe.input},
                    inputs={}, output=f"{out}/trained.pt",
                    files=source_files + _source_files(root, train["function"]), **common)
        nodes.append(node)
        weights = {"weights": node.output}
    if "checkpoint" in recipe.model:
        weights = {"weights": recipe.model["checkpoint"]}
    checkpoint = Node("checkpoint", recipe.name,
                      config={"model": source, "seed": recipe.model["seed"],
                              "batchnorm_stats": recipe.model["batchnorm_stats"], "input": recipe.input},
                      inputs=weights,
                      output=f"{out}/checkpoint.pt", files=source_files, **common)
    nodes.append(checkpoint)

    timing = {key: recipe.benchmark[key] for key in ("warmup", "iters", "threads")}
    eager_bench = Node("bench", f"{recipe.name}-eager",
                       config={"runtime": "eager", "model": source, "input": recipe.input, "timing": timing,
                               "runs_on_host": True},
                       inputs={"checkpoint": checkpoint.output}, output=f"{out}/bench-eager.json", files=source_files,
                       **common)
    results = [eager_bench]
    targets = []

    problems = []
    for target in recipe.targets:
        try:
            route = backends.route_for(target, recipe.file)
        except MobileBuildError as exc:
            problems.append(exc)
            continue
        # A target with its own pruning or quantization gets its own chain from there on, named after it;
        # targets that share the recipe's settings share the nodes.
        own_weights = target.prune != recipe.prune
        own_quantization = own_weights or target.quantize != recipe.quantize
        fields = _own_fields(recipe, target)
        weights_tag = f"-{target.id}" if own_weights else ""
        weights_in = {"checkpoint": checkpoint.output}
        pruned = None
        if target.prune:
            pruned = Node("prune", recipe.name + weights_tag, config={"model": source, "prune": target.prune},
                          inputs={"checkpoint": checkpoint.output}, output=f"{out}/pruned{weights_tag}.pt",
                          files=source_files, fields=fields if own_weights else {}, **common)
            nodes.append(pruned)
            weights_in = {"checkpoint": pruned.output}
        fused = Node("fuse", recipe.name + weights_tag,
                     config={"model": source, "fuse": recipe.fuse, "input": recipe.input},
                     inputs=weights_in, output=f"{out}/fused{weights_tag}.pt", files=source_files, **common)
        nodes.append(fused)
        precision = route.precision(target)
        model_inputs = {"model": fused.output}
        quantization = None
        if precision == "int8" and route.quantizer == "eager":
            try:
                quantized = _quantize_node(recipe, target, route, fused, source_files, root, own_quantization,
                                           fields if own_quantization else {})
            except MobileBuildError as exc:
                problems.append(exc)
                continue
            nodes.append(quantized)
            model_inputs["quantized"] = quantized.output
        if precision == "int8":
            quantization = {"mode": target.quantize["mode"], "weights": target.quantize.get("weights")}
        try:
            final, made = _final_nodes(recipe, target, route, precision, model_inputs, quantization, own_quantization,
                                       fields, root, source_files)
        except MobileBuildError as exc:
            problems.append(exc)
            continue
        nodes += [*made, final]
        runtime = {"runtime": route.loader, "engine": route.engine if route.quantizer == "eager" else None,
                   "input": recipe.input, "runs_on_host": route.runs_on_host, "host_reason": route.host_reason}
        results.append(Node(
            "verify", f"{recipe.name}-{target.id}",
            config={**runtime, "model": source, "precision": precision, "pruning": target.prune,
                    **_verify_settings(recipe.verify, precision)},
            # a pruned artifact is checked against the pruned eager model: the build must not change it further
            inputs={"artifact": final.output, "checkpoint": (pruned or checkpoint).output},
            output=f"{out}/verify-{target.id}.json",
            files=_source_files(root, recipe.model.get("factory"), recipe.verify.get("evaluation", {}).get("function")),
            fields=fields, **common))
        results.append(Node(
            "bench", f"{recipe.name}-{target.id}",
            config={**runtime, "timing": timing, "device": _device_settings(recipe.benchmark["device"], route)},
            inputs={"artifact": final.output}, output=f"{out}/bench-{target.id}.json", fields=fields, **common))
        targets.append({"target": target.id, "backend": route.backend, "runtime": route.runtime,
                        "precision": precision, "path": final.output, "runs_on_host": route.runs_on_host,
                        "device_only": route.device_only, "delegate": final.config.get("delegate"),
                        "pruning": target.prune or None, "quantization": quantization,
                        "interpreter": final.interpreter})
    if problems:
        raise RecipeErrors(problems)

    artifacts = list({node.task_name: node for node in nodes}.values())
    manifest = Node(
        "manifest", recipe.name,
        config={"recipe": recipe.name, "recipe_file": recipe.file, "recipe_sha256": recipe.sha256,
                "artifacts": [{"stage": n.stage, "path": n.output, **n.describes} for n in artifacts],
                "targets": targets, "checkpoint": checkpoint.output,
                "verification": {n.name.removeprefix(f"{recipe.name}-"): n.output for n in results
                                 if n.stage == "verify"},
                "benchmarks": {n.name.removeprefix(f"{recipe.name}-"): n.output for n in results
                               if n.stage == "bench"}},
        inputs={n.task_name: n.output for n in artifacts + results}, output=f"{out}/manifest.json", **common)
    return artifacts + results + [manifest]


def _final_nodes(recipe, target, route, precision, model_inputs, quantization, own_quantization, fields, root,
                 source_files):
    """The node that writes the shipped artifact, and the TorchScript node before it where the route has one.
    Nodes that read the pickled fused model list the factory's source among their files: unpickling imports it."""
    out = out_dir(recipe)
    common = {"recipe": recipe.name, "recipe_file": recipe.file, "fields": fields,
              "describes": {"backend": route.backend, "runtime": route.runtime, "target": target.id}}
    name = f"{recipe.name}-{target.id}"
    output = f"{out}/{name}{route.suffix}"
    interpreter = toolchain.interpreter(target.toolchain, recipe.file, root, f"targets[{target.index}].toolchain")
    if route.through_torchscript:
        script_name = f"{recipe.name}-{target.id}" if own_quantization else f"{recipe.name}-{route.tag(precision)}"
        scripted = Node("script", script_name,
                        config={"mode": recipe.script, "precision": precision, "engine": route.engine,
                                "quantization": quantization, "input": recipe.input},
                        inputs=model_inputs, output=f"{out}/scripted-{script_name.removeprefix(recipe.name + '-')}.pt",
                        files=source_files, recipe=recipe.name, recipe_file=recipe.file)
        final = Node("optimize", name,
                     config={"backend": route.backend, "engine": route.engine if precision == "int8" else None,
                             "options": target.optimize, "script_mode": recipe.script, "input": recipe.input},
                     inputs={"scripted": scripted.output}, output=output, interpreter=interpreter, **common)
        return final, [scripted]
    config = {"precision": precision, "input": recipe.input}
    files = source_files
    if route.final_stage == "nnapi":
        config.update(mode=target.nnapi["mode"], engine=route.engine, quantization=quantization,
                      options={"bundled_inputs": target.optimize["bundled_inputs"]})
    else:
        if precision == "int8":
            if target.quantize["mode"] != "static":
                raise MobileBuildError(f"{route.backend} ({route.runtime}) quantizes with calibration data only: "
                                       f"expected mode 'static', got {target.quantize['mode']!r}",
                                       file=recipe.file, field=fields.get("quantize.mode", "quantize.mode"))
            config.update(calibration=target.quantize["calibration"], weights=target.quantize.get("weights"))
            files += _calibration_files(recipe, target.quantize, fields.get("quantize.calibration",
                                                                            "quantize.calibration"), root)
        if route.final_stage == "lower":
            options = dict(target.executorch)
            config.update(delegate=options.pop("delegate", route.delegate), options=options)
        else:
            config.update(options=dict(target.onnx))
        model_inputs = {"model": model_inputs["model"]}
    return Node(route.final_stage, name, config=config, inputs=model_inputs, output=output, files=files,
                interpreter=interpreter, **common), []


def _own_fields(recipe, target):
    """Recipe-level fields -> where this target's own settings put them (see Node.fields). A target's `prune`
    replaces the recipe's; its `quantize` is merged key by key over the recipe's."""
    fields = {"targets": f"targets[{target.index}]"}
    if target.prune != recipe.prune:
        fields["prune"] = f"targets[{target.index}].prune"
    for key, value in target.quantize.items():
        if value != recipe.quantize.get(key):
            fields[f"quantize.{key}"] = f"targets[{target.index}].quantize.{key}"
    return fields


def _quantize_node(recipe, target, route, fused, source_files, root, own, fields):
    settings = target.quantize
    config = {"engine": route.engine, "mode": settings["mode"], "weights": settings.get("weights"),
              "input": recipe.input, "model": _model_source(recipe.model), "fuse": recipe.fuse}
    inputs, files = {"model": fused.output}, ()
    if settings["mode"] == "static":
        config["calibration"] = settings["calibration"]
        files = _calibration_files(recipe, settings, fields.get("quantize.calibration", "quantize.calibration"), root)
    elif settings["mode"] == "qat":
        inputs["trained"] = settings["checkpoint"]
    name = f"{recipe.name}-{target.id}" if own else f"{recipe.name}-{route.engine}"
    return Node("quantize", name, config=config, inputs=inputs,
                output=f"{out_dir(recipe)}/quantized-{name.removeprefix(recipe.name + '-')}.pt",
                files=source_files + files,
                fields=fields, recipe=recipe.name, recipe_file=recipe.file)


def _calibration_files(recipe, settings, where, root):
    """The files calibration reads, so that changing them re-runs it."""
    calibration = settings["calibration"]
    if calibration["source"] == "function":
        return _source_files(root, calibration["function"])
    if calibration["source"] != "images":
        return ()
    files, links = _files_below(calibration["path"], root)
    if not files:
        raise MobileBuildError(f"calibration folder {calibration['path']!r} holds no files",
                               file=recipe.file, field=f"{where}.path")
    escaping = _escaping(links, root)
    if escaping:
        raise MobileBuildError(f"{escaping[0]} leaves the repository (a symlink); calibration images must "
                               "stay inside it", file=recipe.file, field=f"{where}.path")
    return tuple(files)


def out_dir(recipe):
    return f"{ARTIFACTS_DIR}/{recipe.name}"


def _verify_settings(verify, precision):
    settings = {"samples": verify["samples"], "seed": verify["seed"], "thresholds": verify["thresholds"][precision]}
    if "evaluation" in verify:
        settings["evaluation"] = verify["evaluation"]
    return settings


def _device_settings(device_config, route):
    """Which Android device benchmarks a TorchScript artifact; the selection keys the bench task."""
    if route.runtime != "pytorch-mobile":
        return None
    return {"serial": device.select_device(device_config.get("serial")), "binary": device_config["binary"],
            "use_bundled_input": device_config["use_bundled_input"]}


def build(recipes, root):
    """All nodes of all recipes; raises RecipeErrors with every problem found."""
    nodes, problems = [], []
    for recipe in recipes:
        try:
            nodes.extend(recipe_nodes(recipe, root))
        except RecipeErrors as exc:
            problems.extend(exc.errors)
    if problems:
        raise RecipeErrors(problems)
    return nodes
