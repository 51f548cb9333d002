"""The registry of targets: one `Route` per backend x runtime, the single entry everything else derives from.

A route family (TorchScript, NNAPI, ExecuTorch, ONNX Runtime, LiteRT) is one folder under `mobilebuild.routes` whose
plan.py registers its routes with everything about them: its own final stages and their planners (plan.stages), how
it makes int8, the runtime that loads its artifacts, its per-layer diagnosis, its `mobilebuild check`, its report
family, structure column and notes, the packages whose versions key its nodes (and the extra that installs them)
and its recipe section. The rest of the package asks the route and never compares backend names. A project's dodo.py
registers its own the same way. No torch here.
"""

from collections.abc import Callable
from dataclasses import dataclass

from mobilebuild.errors import MobileBuildError
from mobilebuild.plan.registry import Registry
from mobilebuild.plan.settings import MODEL_LIBRARIES, MODEL_LIBRARY_EXTRA

DEVICE_ONLY = "runs only on {where}; the host checks that the artifact loads and records its structure"
# The runtime module of the eager reference every artifact is compared with
EAGER_RUNTIME = "mobilebuild.worker.runtimes.eager"


@dataclass(frozen=True)
class Int8:
    """How a route makes int8. "eager": the quantize stage, with `engine`'s qconfig, before the route's stages;
    "final": the final stage quantizes itself from the recipe's calibration data (pt2e, onnxruntime)."""

    by: str
    engine: str | None = None
    # quantize.observer's choices, the default first (empty: it takes no observer setting)
    observers: tuple = ()
    # quantize.mode's choices where the final stage quantizes: static (calibrated) and, where its stage has it,
    # dynamic (weights int8 ahead of time, activations quantized at run time; no calibration)
    modes: tuple = ("static",)
    fixed_shapes: str | None = None  # why its static int8 artifacts take the example's sizes only
    # the weight granularity its artifacts must have where quantize.weights is unset (per_tensor, per_channel);
    # None: the quantizer's own default
    weights: str | None = None


@dataclass(frozen=True)
class Arm64:
    """How a runtime's artifacts run in the emulated aarch64 Python (plan/arm64.py): its runner there (the family's
    worker/guest.py, which imports only the standard library, numpy and the runtime), and the aarch64 wheels it needs
    (pinned to the host's versions by the setup). `setup`: a module with `wheels(version_of)` (more name==version
    wheels), `missing_tools()` (the host tools it lacks, from Debian's TOOLS_PACKAGE) and `make_loadable(sysroot,
    site, work)` (-> ["NAME=value" environment entries the emulated process needs]), which the setup calls after
    installing the wheels (routes/torchscript/torch_libs.py); or None."""

    runner: str
    wheels: tuple
    setup: object = None


@dataclass(frozen=True)
class Runtime:
    """Where a route's artifacts run, and what people are told about them."""

    name: str  # the runtime's name in results
    family: str  # the report's name for it ("ExecuTorch")
    # the worker-side module that loads and inspects its artifacts (worker/runtimes/__init__.py): its family's
    # worker/runtime.py, or a module that comes with a project's route
    module: str
    device_only: str | None = None  # where it runs, when the host cannot run it
    fixed_shapes: str | None = None  # why its artifacts take the example's sizes only (no dynamic dims)
    packages: tuple = ()  # the packages besides torch whose versions shape the artifact
    package: str | None = None  # the one that names the runtime's version in `mobilebuild check`'s header
    structure: Callable | None = None  # verify's host facts about the artifact -> one line for the report
    notes: Callable | None = None  # verify's host facts about the artifact -> the report's notes on it, [lines]
    # the Android device and benchmark binary that time a target's artifact there too: (the recipe's
    # benchmark.device) -> the bench stage's device settings, or None: its artifacts are not timed on a device
    device_bench: Callable | None = None
    arm64: Arm64 | None = None  # how its artifacts run on emulated ARM CPUs; None: they do not
    # the extra of mobilebuild that installs `packages` (pip install 'mobilebuild[extra]'); None: the core install
    extra: str | None = None
    # why its host timings are not ranked against the others' (a software GPU driver's): shown, left out of "Ship"
    unranked: str | None = None


@dataclass(frozen=True)
class Section:
    """The target's own section of settings for a route (`nnapi:`, `onnx:`...), with its JSON Schema."""

    name: str
    schema: dict | None = None


# The activations XNNPACK and the GPU backends fold into the op before them, as its output clamp
CLAMPS = frozenset({"relu", "relu6", "hardtanh"})


@dataclass(frozen=True)
class ActivationFusion:
    """Which activations a target fuses into the layer before them ({"conv" | "linear": activation names}; a layer
    kind left out: no claim either way), and who fuses them: `mobilebuild check` advises on the others."""

    into: dict
    by: str


@dataclass(frozen=True)
class Checks:
    """What a route adds to the build and to `mobilebuild check`, each a function or None."""

    # the per-layer diagnosis node of an int8 target: (chain, verification settings, files) -> Node or None
    layers: Callable | None = None
    layer_methods: dict | None = None  # the layers results' method names -> how the report describes each
    # `mobilebuild check` for one target: (preflight.targets.TargetCheck) -> None, adding findings and notes
    preflight: Callable | None = None
    # a hint appended to a build error or fallback line: (TargetCheck, text) -> str
    hint: Callable | None = None
    # the interface findings of its outputs: (say, tree, context) -> [findings]; see preflight.interface
    outputs: Callable | None = None
    input_dtypes: tuple | None = None  # the input dtypes it takes; None: every dtype
    input_dtypes_why: str | None = None  # ... and why, for the others
    # why a recipe's artifact takes the example's sizes only, beyond the runtime's and int8's: (recipe) -> str or None
    fixed_shapes: Callable | None = None
    fusion: ActivationFusion | None = None  # the activations it fuses, for `mobilebuild check`'s advice


@dataclass(frozen=True)
class Generation:
    """How a route builds a decoder-only language model with its KV cache (a recipe with `generate:`): the stage
    that writes the artifact from the checkpoint, and its precisions (the first is the default). The route's runtime
    module gives `generator(path, config)`, which runs the artifact a step at a time (worker/lm.py). `layers`: the
    worker-side module that ranks a quantized target's layers (its `Quantizer`: worker/stages/lm_layers.py), or
    None. `device`: (benchmark.device) -> the Android device and runner that time the artifact there, or None: not
    on a device."""

    stage: str
    precisions: tuple
    layers: str | None = None
    device: Callable | None = None


@dataclass(frozen=True)
class Route:
    backend: str
    runtime: str
    precisions: tuple  # the first is the default
    stages: tuple  # the stages from the fused model to the shipped artifact, the last one writing it
    suffix: str
    summary: str
    runs_in: Runtime  # the runtime its artifacts run in
    int8: Int8 | None = None
    section: Section | None = None
    # The target's precision when the route takes it from its own settings rather than `precision:` (NNAPI's mode).
    precision_of: Callable | None = None
    checks: Checks = Checks()
    default: bool = False  # the backend's runtime when a target names none
    generation: Generation | None = None  # its generative path; None: a `generate:` recipe is refused for it

    @property
    def key(self):
        return f"{self.backend}/{self.runtime}"

    @property
    def final_stage(self):
        """The stage that writes its artifact; None for a route of language models only (its Generation's)."""
        return self.stages[-1] if self.stages else None

    @property
    def runs_on_host(self):
        return self.runs_in.device_only is None

    @property
    def host_reason(self):
        return DEVICE_ONLY.format(where=self.runs_in.device_only) if self.runs_in.device_only else None

    @property
    def settings(self):
        """The name of its target section, or None."""
        return self.section.name if self.section else None

    @property
    def engine(self):
        return self.int8.engine if self.int8 else None

    @property
    def quantizes_eagerly(self):
        return self.int8 is not None and self.int8.by == "eager"

    @property
    def observers(self):
        return self.int8.observers if self.int8 else ()

    @property
    def final_modes(self):
        return self.int8.modes if self.int8 else ("static",)

    def precision(self, target):
        if self.precision_of is not None:
            return self.precision_of(target)
        return target.precision or (self.precisions or self.generation.precisions)[0]

    def tag(self, precision):
        engine = self.engine if precision == "int8" and self.quantizes_eagerly else None
        return f"{precision}-{engine}" if engine else precision

    def fixed_shape(self, recipe, precision, mode="static"):
        """Why this route's artifact in `precision` (int8: quantized in quantize.mode `mode`) takes only the
        example's sizes of a recipe's dynamic dims (naming them), or None."""
        dims = sorted({dim["dim"] for spec in recipe.inputs for dim in spec.get("dynamic", ())})
        if not dims:
            return None
        why = self.runs_in.fixed_shapes
        if why is None and precision == "int8" and self.int8 and mode == "static":
            why = self.int8.fixed_shapes
        if why is None and self.checks.fixed_shapes is not None:
            why = self.checks.fixed_shapes(recipe)
        if why is None:
            return None
        return f"dim{'s' if len(dims) > 1 else ''} {', '.join(dims)} fixed at the example size: {why}"


NONE = "—"  # a fact that is absent or does not apply, in the report and the route's structure column


def mapping(value):
    """A level of facts read from a file the reader does not trust: a dict, or an empty one."""
    return value if isinstance(value, dict) else {}


def text(value):
    """A fact as a table cell: NONE where it is absent."""
    return NONE if value is None or value == "" else str(value)


_ROUTES = Registry("route")


def register(route):
    """Add a route (a project's dodo.py may add its own before importing mobilebuild.tasks)."""
    return _ROUTES.add(route.key, route)


def all_routes():
    return _ROUTES.all()


def backends():
    return tuple(dict.fromkeys(route.backend for route in _ROUTES.all()))


def runtimes():
    return tuple(dict.fromkeys(route.runtime for route in _ROUTES.all()))


def get(backend, runtime):
    return _ROUTES.get(f"{backend}/{runtime}")


def precisions():
    """Every precision a target may name: the routes' and their generative paths'."""
    generative = (p for route in _ROUTES.all() if route.generation for p in route.generation.precisions)
    return tuple(dict.fromkeys([*(p for route in _ROUTES.all() for p in route.precisions), *generative]))


def default_runtime(backend):
    candidates = [route for route in _ROUTES.all() if route.backend == backend]
    chosen = next((route for route in candidates if route.default), candidates[0] if candidates else None)
    return chosen.runtime if chosen else None


def final_stages():
    """The stages that write a shipped artifact (a language model's too): what verify and bench may take."""
    return tuple(dict.fromkeys([*(route.final_stage for route in _ROUTES.all() if route.final_stage),
                                *(route.generation.stage for route in _ROUTES.all() if route.generation)]))


def distributions():
    """Every package whose version can change an artifact's bytes: torch's, the libraries of models, the routes' in
    registration order."""
    return tuple(dict.fromkeys(("torch", "torchvision", *MODEL_LIBRARIES,
                                *(d for r in _ROUTES.all() for d in r.runs_in.packages))))


def not_installed(packages, found):
    """One line naming what of `packages` is missing from `found` (toolchain.installed: a version or None each) and
    the extra that installs it, or None where every one is there."""
    missing = [name for name in packages if found.get(name, "") is None]
    if not missing:
        return None
    # the family whose packages these are (a node's: its route's, with its model library), the one with the most of
    # them where several fit (LiteRT-LM's are LiteRT's and its engine's); one that shares some with another family
    # (torchao: ExecuTorch's and LiteRT's) names the other's only where all of its are there
    family = max((route.runs_in for route in _ROUTES.all()
                  if route.runs_in.packages and set(route.runs_in.packages) <= set(packages)),
                 key=lambda runtime: len(runtime.packages), default=None)
    if family is None or family.extra is None:  # a library of models
        return f"{', '.join(missing)} is not installed here: pip install 'mobilebuild[{MODEL_LIBRARY_EXTRA}]'"
    return (f"{family.family} is not installed here ({', '.join(missing)} missing): pip install "
            f"'mobilebuild[{family.extra}]'")


def installed_families(found):
    """{a family's report name: None where it is installed, else the line saying what installs it}."""
    return {route.runs_in.family: not_installed(route.runs_in.packages, found) for route in _ROUTES.all()}


def runtime_packages():
    """The packages that name the registered runtimes' versions (torch first)."""
    return tuple(dict.fromkeys(("torch", *(r.runs_in.package for r in _ROUTES.all() if r.runs_in.package))))


def arm64_runtimes():
    """{runtime name: Arm64} of every runtime whose artifacts run on emulated ARM CPUs."""
    return {route.runs_in.name: route.runs_in.arm64 for route in _ROUTES.all() if route.runs_in.arm64 is not None}


def families():
    """{a recipe's runtime name: the report's family name}."""
    return {route.runtime: route.runs_in.family for route in _ROUTES.all()}


def layer_methods():
    """{a layers result's method name: how the report describes it}."""
    return {name: text for route in _ROUTES.all() for name, text in (route.checks.layer_methods or {}).items()}


def route_for(target, recipe_file, generative=False):
    """The route a recipe target takes, or a clear error for a combination this version cannot build. `generative`:
    for a recipe with `generate:`, whose targets take the route's generative path and its precisions."""
    runtime = target.runtime or default_runtime(target.backend)
    found = get(target.backend, runtime)
    where = f"targets[{target.index}]"
    if found is None:
        buildable = ", ".join(f"{r.backend} ({r.runtime})" for r in _ROUTES.all())
        raise MobileBuildError(
            f"backend {target.backend!r} with runtime {runtime!r} is not buildable by this version of mobilebuild "
            f"(buildable: {buildable})", file=recipe_file, field=where)
    if generative:
        return _generative(found, target, recipe_file, where)
    if not found.stages:
        raise MobileBuildError(f"{found.backend} ({found.runtime}) builds language models only (a recipe with "
                               "generate:)", file=recipe_file, field=f"{where}.runtime")
    if target.precision and found.precision_of is not None and target.precision != found.precision(target):
        raise MobileBuildError(f"{found.backend.upper()} takes its precision from {found.settings}.mode "
                               f"({target.settings[found.settings]['mode']!r} is {found.precision(target)}); leave "
                               "precision out", file=recipe_file, field=f"{where}.precision")
    if target.precision not in (None, *found.precisions):
        raise MobileBuildError(
            f"precision {target.precision!r} is not available for {found.backend} ({found.runtime}); expected one "
            f"of {', '.join(found.precisions)}", file=recipe_file, field=f"{where}.precision")
    return found


def _generative(route, target, recipe_file, where):
    if route.generation is None:
        able = ", ".join(f"{r.backend} ({r.runtime})" for r in _ROUTES.all() if r.generation)
        raise MobileBuildError(f"{route.backend} ({route.runtime}): generative path not wired yet (a recipe with "
                               f"generate: builds for {able})", file=recipe_file, field=f"{where}.backend")
    if target.precision not in (None, *route.generation.precisions):
        raise MobileBuildError(
            f"precision {target.precision!r} is not available for a language model on {route.backend} "
            f"({route.runtime}); expected one of {', '.join(route.generation.precisions)}", file=recipe_file,
            field=f"{where}.precision")
    return route


def generative_precision(route, target):
    return target.precision or route.generation.precisions[0]
