"""One target's chain of nodes, from its weights to its shipped artifact, and the built-in stages' planners.

The graph walks `CHAIN` (this module's planners) then the route's own stages (`Stage.plan`, from its route
module); each planner adds its node, or none where the target does not need it (no pruning, a float target's
quantization). Targets that share settings get the same node names, so their nodes merge. Names, settings and
paths only.
"""

import functools
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import routes, stages, toolchain
from mobilebuild.plan.node import Node
from mobilebuild.plan.settings import MODEL_LIBRARIES, ModelSource, Quantization

ARTIFACTS_DIR = "artifacts"


def out_dir(recipe):
    return f"{ARTIFACTS_DIR}/{recipe.name}"


SOURCE_KEYS = ("torchvision", "quantizable", "factory", "timm", "transformers", "config", "pretrained", "kwargs")
HUB_SOURCES = MODEL_LIBRARIES  # a model source named after its library


def model_source(model, inputs=(), generative=False) -> ModelSource:
    """What the stages build the model from: the recipe's source; the inputs' names, each passed to the parameter of
    forward of that name where it has one (worker/named_inputs.py), where there are several or the model is a hub
    library's (a torchvision or factory model of one input takes it by position, and keeps its nodes' settings); the
    library of models that builds it, whose version keys its nodes (checked_node): a hub source's, and transformers
    for a language model (`generative`), which the LM stages run as a transformers model whatever its source."""
    found = {k: model[k] for k in SOURCE_KEYS if k in model}
    hub = next((key for key in HUB_SOURCES if key in model), None)
    library = hub or ("transformers" if generative else None)
    if library:
        found["library"] = library
    if hub or len(inputs) > 1:
        found["inputs"] = [spec["name"] for spec in inputs]
    return found


def recipe_source(recipe) -> ModelSource:
    """model_source of a recipe's model."""
    return model_source(recipe.model, recipe.inputs, generative=bool(recipe.generate))


@functools.lru_cache(maxsize=None)
def library_version(distribution):
    """The installed version, read from package metadata (importing the library costs seconds); None if absent."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def model_files(root, model):
    """The repository files the model is made from: a factory's module, a transformers `pretrained` folder's files."""
    return source_files(root, model.get("factory")) + (folder_files(root, model["pretrained"])
                                                       if "pretrained" in model else ())


@functools.lru_cache(maxsize=None)
def folder_files(root, folder):
    """The files below a model folder, relative to `root`, looked up once per process."""
    return tuple(files_below(folder, root)[0])


def source_files(root, *specs):
    """The repository files behind 'package.module:function' specs that live in the repository, found without
    importing anything, so that editing a factory rebuilds what it made."""
    return tuple(found for found in (_module_file(root, spec) for spec in specs if spec) if found)


@functools.lru_cache(maxsize=None)
def _module_file(root, spec):
    """Asked for every node of every recipe that shares a factory: looked up once per process."""
    module = spec.split(":")[0].split(".")
    for candidate in (Path(root, *module).with_suffix(".py"), Path(root, *module, "__init__.py")):
        if candidate.is_file():
            return candidate.relative_to(root).as_posix()
    return None


def forget_source_files():
    _module_file.cache_clear()
    folder_files.cache_clear()


@dataclass
class Chain:
    """What a stage's planner knows: the recipe, the target and its route, and the nodes made before it."""

    recipe: object
    target: object
    route: object
    root: str
    nodes: dict  # stage -> the node it made for this target ("checkpoint": the recipe's)
    precision: str = field(init=False)
    fields: dict = field(init=False)  # see Node.fields
    own_weights: bool = field(init=False)  # its own pruning: its own chain from the weights on
    own_quantization: bool = field(init=False)

    def __post_init__(self):
        recipe, target = self.recipe, self.target
        self.precision = self.route.precision(target)
        self.own_weights = target.prune != recipe.prune
        self.own_quantization = self.own_weights or target.quantize != recipe.quantize
        self.fields = {"targets": f"targets[{target.index}]"}
        if self.own_weights:
            self.fields["prune"] = f"targets[{target.index}].prune"
        for key, value in target.quantize.items():
            if value != recipe.quantize.get(key):
                self.fields[f"quantize.{key}"] = f"targets[{target.index}].quantize.{key}"

    @property
    def out(self):
        return out_dir(self.recipe)

    @property
    def source(self):
        return recipe_source(self.recipe)

    @property
    def source_files(self):
        return model_files(self.root, self.recipe.model)

    @property
    def settings(self):
        """The target's own section for its route (`nnapi:`, `executorch:`, `onnx:`)."""
        return dict(self.target.settings.get(self.route.settings, {})) if self.route.settings else {}

    @property
    def quantization(self) -> Quantization | None:
        """How an int8 model was quantized, for the stages that rebuild it and for the manifest."""
        if self.precision != "int8":
            return None
        found = Quantization(mode=self.target.quantize["mode"], weights=self.weights)
        if self.excluded:  # only where set: other recipes keep their keys
            found["exclude"] = self.excluded
        return found

    @property
    def weights(self):
        """quantize.weights, or where the recipe leaves it open the granularity the route's runtime needs."""
        return self.target.quantize.get("weights") or (self.route.int8.weights if self.route.int8 else None)

    @property
    def excluded(self):
        """quantize.exclude, the one place it is read from the target; None where unset."""
        return self.target.quantize.get("exclude") or None

    def quantize_options(self):
        """(exclude, observer): the target's quantize.exclude and quantize.observer as its route takes them, None
        where unset. Module names are checked by the stages, which have the model."""
        settings, route, file = self.target.quantize, self.route, self.recipe.file
        exclude, observer = self.excluded, settings.get("observer")
        if observer is not None and observer not in route.observers:
            choices = f"expected one of {', '.join(route.observers)}" if route.observers else "it takes none"
            raise MobileBuildError(f"{route.backend} ({route.runtime}) has no observer {observer!r}: {choices}",
                                   file=file, field=self.where("quantize.observer"))
        if observer is not None and settings["mode"] != "static":
            raise MobileBuildError(f"an observer calibrates static quantization; mode {settings['mode']!r} observes "
                                   "no activations: leave observer out", file=file,
                                   field=self.where("quantize.observer"))
        if exclude and settings["mode"] == "qat":
            raise MobileBuildError("a QAT checkpoint was trained with what it quantizes fixed: keep modules in float "
                                   "when preparing it for training, and leave exclude out", file=file,
                                   field=self.where("quantize.exclude"))
        return exclude, observer

    def where(self, name):
        return self.fields.get(name, name)

    def error(self, message, name):
        """A problem with the recipe field `name` of this target (where the target sets it, if it does)."""
        return MobileBuildError(message, file=self.recipe.file, field=self.where(name))

    def node(self, stage, name, settings, inputs, output, **extra):
        """A node of `stage` for this target (see checked_node), keyed on its route's packages."""
        return checked_node(self.recipe, stage, name, settings, inputs, output, packages=self.route.runs_in.packages,
                            **extra)

    def shipped(self, stage, settings, inputs, files=(), suffix=None):
        """The node that writes the target's shipped artifact (named with the route's suffix, or `suffix`)."""
        name = f"{self.recipe.name}-{self.target.id}"
        interpreter = toolchain.interpreter(self.target.toolchain, self.recipe.file, self.root,
                                            f"targets[{self.target.index}].toolchain")
        return self.node(stage, name, settings, inputs, f"{self.out}/{name}{suffix or self.route.suffix}", files=files,
                         fields=self.fields, interpreter=interpreter,
                         describes={"backend": self.route.backend, "runtime": self.route.runtime,
                                    "target": self.target.id})

    def layers_node(self, settings, inputs, files):
        """The per-layer comparison's node of this target (a route's `Checks.layers` makes its settings)."""
        name = f"{self.recipe.name}-{self.target.id}"
        return self.node("layers", name, settings, {"model": self.nodes["fuse"],
                                                    "artifact": self.nodes[self.route.final_stage], **inputs},
                         f"{self.out}/layers-{self.target.id}.json", files=tuple(dict.fromkeys(files)),
                         fields=self.fields)

    def model_inputs(self):
        """The fused model, and its eager quantization where the chain has one."""
        found = {"model": self.nodes["fuse"]}
        if "quantize" in self.nodes:
            found["quantized"] = self.nodes["quantize"]
        return found

    def calibration_files(self, settings):
        """The files calibration reads, so that changing them re-runs it."""
        calibration = settings["calibration"]
        if calibration["source"] == "function":
            return source_files(self.root, calibration["function"])
        if calibration["source"] != "images":
            return ()
        where = self.where("quantize.calibration")
        files, links = files_below(calibration["path"], self.root)
        if not files:
            raise MobileBuildError(f"calibration folder {calibration['path']!r} holds no files",
                                   file=self.recipe.file, field=f"{where}.path")
        outside = escaping(links, self.root)
        if outside:
            raise MobileBuildError(f"{outside[0]} leaves the repository (a symlink); calibration images must "
                                   "stay inside it", file=self.recipe.file, field=f"{where}.path")
        return tuple(files)

    def final_mode(self):
        """quantize.mode of a route whose final stage quantizes the float model (route.final_modes): static reads
        calibration data, dynamic none; neither converts a QAT checkpoint."""
        mode, route = self.target.quantize["mode"], self.route
        if mode not in route.final_modes:
            takes = " or ".join(repr(m) for m in route.final_modes)
            why = ("it quantizes the float model in its final stage and takes no QAT checkpoint" if mode == "qat"
                   else "it quantizes with calibration data only")
            raise MobileBuildError(f"{route.backend} ({route.runtime}) cannot build mode {mode!r}: {why}; expected "
                                   f"mode {takes}", file=self.recipe.file, field=self.where("quantize.mode"))
        return mode

    def final_quantization(self):
        """{calibration, weights, exclude, observer} and the files they read, of a route that quantizes in its final
        stage; dynamic mode: {mode, weights, exclude}, no calibration and no files of it (`mode` is keyed only where
        it is not static: static recipes keep their keys)."""
        if self.precision != "int8":
            return {}, self.source_files
        mode = self.final_mode()
        exclude, observer = self.quantize_options()
        weights = self.target.quantize.get("weights")
        if mode == "dynamic":
            return {"mode": mode, "weights": weights, "exclude": exclude}, self.source_files
        calibration, files = self.static_only()
        return ({"calibration": calibration, "weights": weights, "exclude": exclude, "observer": observer},
                self.source_files + files)

    def static_only(self):
        """The calibration settings of a route that quantizes with calibration data only."""
        if self.target.quantize["mode"] != "static":
            raise MobileBuildError(f"{self.route.backend} ({self.route.runtime}) quantizes with calibration data only: "
                                   f"expected mode 'static', got {self.target.quantize['mode']!r}",
                                   file=self.recipe.file, field=self.where("quantize.mode"))
        return self.target.quantize["calibration"], self.calibration_files(self.target.quantize)


def checked_node(recipe, stage, name, settings, inputs, output, **extra):
    """A node of `stage` for `recipe`, its inputs ({role: upstream node, or a repository file}) checked against the
    stage's contract: every node of the graph is made here. A node that builds the model from a library of models
    is keyed on that library's version too (Node.packages), so that upgrading it rebuilds only what it builds."""
    stages.get(stage).check_inputs({role: source.stage if isinstance(source, Node) else stages.FILE
                                    for role, source in inputs.items()})
    library = (getattr(settings, "model", None) or {}).get("library")
    packages = (*extra.pop("packages", ()), *([library] if library else []))
    return Node(stage, name, recipe=recipe.name, recipe_file=recipe.file, settings=settings,
                inputs={role: source.output if isinstance(source, Node) else source for role, source in inputs.items()},
                output=output, time_limit=recipe.limits.get(stages.get(stage).limit), packages=packages,
                not_installed=routes.not_installed(packages, toolchain.installed(extra.get("interpreter"))), **extra)


def files_below(directory, root):
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


def escaping(links, root):
    """The symlinks that lead outside the repository: recipe paths must stay inside it, links included."""
    inside = Path(root).resolve()
    return [link for link in links if not Path(root, link).resolve().is_relative_to(inside)]


# --- the built-in stages' planners ------------------------------------------------------------------------------

def _weights_tag(chain):
    return f"-{chain.target.id}" if chain.own_weights else ""


def prune(chain):
    if not chain.target.prune:
        return None
    tag = _weights_tag(chain)
    config = stages.PruneConfig(model=chain.source, prune=chain.target.prune)
    return checked_node(chain.recipe, "prune", chain.recipe.name + tag, config,
                        {"checkpoint": chain.nodes["checkpoint"]}, f"{chain.out}/pruned{tag}.pt",
                        files=chain.source_files, fields=chain.fields if chain.own_weights else {})


def fuse(chain):
    tag = _weights_tag(chain)
    recipe = chain.recipe
    return checked_node(recipe, "fuse", recipe.name + tag,
                        stages.FuseConfig(model=chain.source, fuse=recipe.fuse, inputs=recipe.inputs),
                        {"checkpoint": chain.nodes.get("prune") or chain.nodes["checkpoint"]},
                        f"{chain.out}/fused{tag}.pt", files=chain.source_files)


def quantize(chain):
    """Eager quantization with the route's engine, for the int8 targets of routes that quantize that way."""
    route, recipe, settings = chain.route, chain.recipe, chain.target.quantize
    if chain.precision != "int8" or not route.quantizes_eagerly:
        return None
    inputs, files, calibration = {"model": chain.nodes["fuse"]}, (), None
    if settings["mode"] == "static":
        calibration = settings["calibration"]
        files = chain.calibration_files(settings)
    elif settings["mode"] == "qat":
        inputs["trained"] = settings["checkpoint"]
    # the granularity the route's runtime needs, where the recipe leaves it open, makes a node of the target's own
    weights = chain.weights
    own = chain.own_quantization or weights != settings.get("weights")
    name = f"{recipe.name}-{chain.target.id}" if own else f"{recipe.name}-{route.engine}"
    if own and chain.target.id == route.engine:  # not the engine's shared node (NNAPI's)
        name += "-own"
    exclude, observer = chain.quantize_options()
    config = stages.QuantizeConfig(engine=route.engine, mode=settings["mode"], weights=weights,
                                   inputs=recipe.inputs, model=chain.source, fuse=recipe.fuse, calibration=calibration,
                                   exclude=exclude, observer=observer)
    return checked_node(recipe, "quantize", name, config, inputs,
                        f"{chain.out}/quantized-{name.removeprefix(recipe.name + '-')}.pt",
                        files=chain.source_files + files, fields=chain.fields if chain.own_quantization else {})


# Before every route's own stages, and shared by the targets that share their settings: made by checked_node, not
# Chain.node, they run on torch alone and are keyed on no route's packages.
CHAIN = (prune, fuse, quantize)
