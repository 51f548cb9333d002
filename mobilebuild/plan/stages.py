"""The stages of the graph and their contracts: the typed settings each one reads, the inputs it takes by role, and
which stages may feed each role (as ExecuTorch's export stages declare `valid_predecessor_stages`).

A stage's settings are a frozen dataclass built here, in the graph layer, from the recipe: what is in it keys the
node's up-to-date check, and nothing else reaches the stage. The code that runs a stage is its `module` on the
worker side (`run(inputs, config, output)`, `config` an instance of the stage's dataclass). No torch, no doit.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from mobilebuild.plan import routes
from mobilebuild.plan.registry import Registry
from mobilebuild.plan.settings import Fusion, ModelSource, Quantization

FILE = "file"  # an input that is a file of the repository (a checkpoint), not a node's output
SHIPPED = "shipped"  # an input that is a route's shipped artifact, whichever stage wrote it
STAGES_PACKAGE = "mobilebuild.worker.stages"


# --- the settings each stage reads -------------------------------------------------------------------------------

def when_set(default=None):
    """A setting added after nodes were keyed: left out of the key while it has its default, so recipes that do not
    use it keep their nodes' keys (and their cache entries)."""
    return field(default=default, metadata={"keyed_when_set": True})


@dataclass(frozen=True)
class TrainConfig:
    model: ModelSource
    seed: int
    train: dict  # {function, kwargs}
    inputs: list  # the inputs' specs (plan.recipe.input_specs)


@dataclass(frozen=True)
class CheckpointConfig:
    model: ModelSource
    seed: int
    batchnorm_stats: int  # batches of random input that re-estimate batch-norm statistics; 0: none
    inputs: list  # the inputs' specs (plan.recipe.input_specs)


@dataclass(frozen=True)
class PruneConfig:
    model: ModelSource
    prune: dict


@dataclass(frozen=True)
class FuseConfig:
    model: ModelSource
    fuse: Fusion
    inputs: list  # the inputs' specs (plan.recipe.input_specs)


@dataclass(frozen=True)
class QuantizeConfig:
    engine: str
    mode: str  # static | dynamic | qat
    weights: str | None
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    model: ModelSource
    fuse: Fusion  # the fused model is rebuilt from the source and fusion: it is stored as weights only
    calibration: dict | None = None  # static only
    exclude: list | None = when_set()  # quantize.exclude: module paths and classes kept in float
    observer: str | None = when_set()  # quantize.observer: the activation observer; None: the engine's default







@dataclass(frozen=True)
class VerifyConfig:
    runtime: str
    runtime_module: str
    engine: str | None
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    runs_on_host: bool
    host_reason: str | None
    model: ModelSource
    precision: str
    pruning: object
    samples: int
    seed: int
    thresholds: dict
    default_thresholds: dict | None = None  # what a recipe that sets none gets: looser ones are marked relaxed
    evaluation: dict | str | None = None  # a function, or "calibration-holdout"
    calibration: dict | None = None  # the calibration source, for calibration-holdout and the data mismatch note
    calibrated: bool = False  # whether the artifact was calibrated (static int8)
    outputs: list | None = None  # the recipe's names for the output tensors
    fixed_shape: str | None = None  # why the artifact takes the example's sizes only, for a recipe with dynamic dims


@dataclass(frozen=True)
class Arm64Config:
    """A CPU artifact on one emulated ARM CPU (worker/stages/arm64.py): verification's data and thresholds, the
    host runtime that runs it here for comparison, its runner in the emulated Python, and what keys the emulation
    (plan.arm64.emulator)."""

    runtime: str
    runtime_module: str
    runner: str  # its route family's module that runs it in the emulated Python (plan.routes.Arm64)
    engine: str | None
    cpu: str  # a name of plan.arm64.CPUS
    emulator: dict
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    model: ModelSource
    precision: str
    samples: int
    seed: int
    thresholds: dict
    evaluation: dict | str | None = None
    calibration: dict | None = None
    outputs: list | None = None
    fixed_shape: str | None = None


@dataclass(frozen=True)
class LayersConfig:
    # the dotted path of the worker-side module that compares (its `compare` hook: worker/stages/layers.py):
    # worker/layers/eager.py (the quantize stage's model, eager or FX graph mode), a route family's worker/layers.py
    method: str
    precision: str
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    model: ModelSource  # the model source and fusion the fused (float) model is rebuilt from
    fuse: Fusion
    samples: int  # verification's data: verify.samples, verify.seed, verify.evaluation
    seed: int
    top: int  # verify.layers_top: how many layers the result lists, worst first
    evaluation: dict | str | None = None
    calibration: dict | None = None  # pt2e: the lower stage's calibration, run again; holdout data
    engine: str | None = None  # eager: the quantized engine
    quantization: Quantization | None = None  # eager: how to rebuild the quantized model (as ScriptConfig's)
    weights: str | None = None  # pt2e: quantize.weights
    options: dict | None = None  # pt2e: the delegate's options; onnx: the export's (opset, exporter)
    outputs: list | None = None  # onnx: the output names
    exclude: list | None = when_set()  # pt2e: quantize.exclude
    observer: str | None = when_set()  # pt2e: quantize.observer
    mode: str = when_set("static")  # pt2e: quantize.mode (dynamic: no calibration)


@dataclass(frozen=True)
class BenchConfig:
    runtime: str
    runtime_module: str
    inputs: list  # the inputs' specs (plan.recipe.input_specs)
    runs_on_host: bool
    timing: dict  # warmup, iters, threads
    engine: str | None = None
    host_reason: str | None = None
    device: dict | None = None  # an Android device to run speed_benchmark_torch on
    model: ModelSource | None = None  # the eager baseline's model source


@dataclass(frozen=True)
class ManifestConfig:
    recipe: str
    recipe_file: str
    recipe_sha256: str
    artifacts: list
    targets: list
    checkpoint: str
    inputs: list  # each input's spec: name, shape, dtype, memory format, dynamic dims, its example data's values
    outputs: list | None  # the recipe's names for the output tensors
    verification: dict  # target -> its verify result
    benchmarks: dict  # target -> its bench result
    layers: dict | None = None  # target -> its per-layer comparison (int8 artifacts the host runs)
    arm64: dict | None = when_set()  # target -> {CPU model: its result on that emulated ARM CPU}


@dataclass(frozen=True)
class PlotConfig:
    recipe: str  # the figure's title; what it shows is the manifest's


def as_json(settings):
    """A stage's settings as the JSON-able dict that keys its node and travels to the worker (which gives the
    settings left out their defaults). The values are the recipe's JSON values, shared rather than copied:
    dataclasses.asdict's deep copies were a quarter of an up-to-date build's time (60 recipes, 1561 tasks)."""
    return {setting.name: getattr(settings, setting.name) for setting in dataclasses.fields(settings)
            if not (setting.metadata.get("keyed_when_set") and getattr(settings, setting.name) == setting.default)}


def type_path(cls):
    return f"{cls.__module__}:{cls.__qualname__}"


# --- where settings come from in the recipe ----------------------------------------------------------------------

# For `doit info`, which names what changed since a node's last build by its recipe field: a setting means the same
# field in every stage that has it, unless the stage's own `recipe_fields` say otherwise. "targets." marks a field of
# the target itself. A setting named in neither is worked out by the planner (a route's engine, a precision...).
RECIPE_FIELDS = {
    "model": "model", "inputs": "inputs", "outputs": "outputs", "fuse": "fuse", "prune": "prune", "pruning": "prune",
    "calibration": "quantize.calibration", "weights": "quantize.weights", "exclude": "quantize.exclude",
    "observer": "quantize.observer", "quantization": "quantize", "batchnorm_stats": "model.batchnorm_stats",
    "train": "model.train", "timing": "benchmark", "device": "benchmark.device", "samples": "verify.samples",
    "thresholds": "verify.thresholds", "evaluation": "verify.evaluation", "script_mode": "script",
}


def recipe_field(stage, path, fields):
    """The recipe field behind a setting's dotted `path` in `stage`'s settings (`calibration.batches` ->
    `targets[1].quantize.calibration.batches` for a target with its own quantize), or None for a derived one.
    `fields`: the node's Node.fields."""
    setting, _, rest = path.partition(".")
    found = get(stage).recipe_fields.get(setting, RECIPE_FIELDS.get(setting))
    if found is None:
        return None
    if found.startswith("targets."):
        found = found.replace("targets", fields.get("targets", "targets[*]"), 1)
    else:
        head = ".".join(found.split(".")[:2])
        if head in fields:
            found = fields[head] + found[len(head):]
    return f"{found}.{rest}" if rest else found


# --- the contracts -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Stage:
    name: str  # its doit task group
    config: type
    inputs: dict | None  # role -> the stages (or FILE, SHIPPED) whose output it takes there; None: any
    doc: str  # the task group's help line
    colour: str  # in `doit graph`
    module: str | None = None  # the worker-side module that runs it; default mobilebuild.worker.stages.<name>
    # Its node in a target's chain: (plan.chain.Chain) -> Node or None
    plan: Callable | None = None
    in_process: bool = False  # runs in the build's own process: it reads results, no tensors
    measures: bool = False  # takes the host lock itself, for its measurement only (worker/measure_alone.py)
    cached: bool = True  # whether the shared artifact cache may hold its output
    # What its output is, checked in a copy fetched from the shared cache before anything reads it (build/fetched.py):
    # "weights" (a torch.save archive of tensors only) or "torchscript"; None: only runtimes read it, never Python.
    form: str | None = None
    # Its settings' recipe fields where they differ from RECIPE_FIELDS' (see recipe_field)
    recipe_fields: dict = field(default_factory=dict)
    # The setting under the recipe's `limits` that bounds how long a node of it may run (its worker is stopped past
    # it). Not a setting of the stage: a time limit changes no artifact, so it keys nothing (Node.time_limit).
    limit: str = "stage_seconds"

    @property
    def module_path(self):
        return self.module or f"{STAGES_PACKAGE}.{self.name}"

    def planner(self):
        return self.plan

    def check_inputs(self, inputs):
        """`inputs`: role -> (the stage that made it, or FILE). A chain that breaks a contract is a bug of ours."""
        if self.inputs is None:
            return
        for role, source in inputs.items():
            allowed = self.inputs.get(role)
            if allowed is None:
                raise AssertionError(f"stage {self.name} takes no input {role!r} (takes: {', '.join(self.inputs)})")
            if source not in allowed and not (SHIPPED in allowed and source in routes.final_stages()):
                raise AssertionError(f"stage {self.name} cannot take {role!r} from {source} (takes it from: "
                                     f"{', '.join(allowed)})")


_STAGES = Registry("stage")


def register(stage):
    """Add a stage (a route's own final stage comes with the route: see plan.routes)."""
    return _STAGES.add(stage.name, stage)


def get(name):
    found = _STAGES.get(name)
    if found is None:
        raise KeyError(f"no stage {name!r} is registered")
    return found


def all_stages():
    """In the order they were registered: the built-in ones here, then each route family's own (doit orders the
    tasks by their inputs)."""
    return _STAGES.all()


for _stage in (
    Stage("train", TrainConfig, {}, "Train models whose recipe has model.train; their weights become the checkpoint.",
          "#f4cccc", form="weights", recipe_fields={"seed": "model.seed"}),
    Stage("checkpoint", CheckpointConfig, {"weights": ("train", FILE)},
          "Materialise each model's weights as a state_dict.", "#fce5cd", form="weights",
          recipe_fields={"seed": "model.seed"}),
    Stage("prune", PruneConfig, {"checkpoint": ("checkpoint",)},
          "Prune Conv/Linear weights (torch.nn.utils.prune, made permanent) for recipes or targets that ask.",
          "#f9cb9c", form="weights"),
    Stage("fuse", FuseConfig, {"checkpoint": ("checkpoint", "prune")},
          "Fold batch norm and fuse Conv/Linear-BN-ReLU sequences in eager mode.", "#fff2cc", form="weights"),
    Stage("quantize", QuantizeConfig, {"model": ("fuse",), "trained": (FILE,)},
          "Static post-training quantization per engine.", "#d9ead3", form="weights",
          recipe_fields={"mode": "quantize.mode"}),
    Stage("verify", VerifyConfig, {"artifact": (SHIPPED,), "checkpoint": ("checkpoint", "prune"),
                                   "unpruned": ("checkpoint",)},
          "Compare each artifact with the fp32 eager model in its runtime (SQNR, cosine, max error, top-1, "
          "accuracy); fails for results below the recipe's thresholds.", "#d9d2e9",
          recipe_fields={"seed": "verify.seed"}),
    Stage("bench", BenchConfig, {"artifact": (SHIPPED,), "checkpoint": ("checkpoint",)},
          "Time each artifact, and the eager fp32 baseline, in a process of its own; device runs where attached.",
          "#ead1dc", measures=True),
    Stage("arm64", Arm64Config, {"artifact": (SHIPPED,), "checkpoint": ("checkpoint", "prune")},
          "Run each CPU artifact on emulated ARM CPUs in its runtime's aarch64 wheel: verified at the recipe's "
          "thresholds, compared with this host's run, instructions per inference counted.", "#cfe2f3",
          recipe_fields={"seed": "verify.seed", "samples": "verify.arm64.samples", "cpu": "verify.arm64.cpus"}),
    Stage("layers", LayersConfig, {"model": ("fuse",), "quantized": ("quantize",), "artifact": (SHIPPED,)},
          "Per-layer error of each int8 artifact the host runs: its layers against the float model's, each fed "
          "the float model's inputs, the worst first.", "#e4d7ee",
          recipe_fields={"seed": "verify.seed", "top": "verify.layers_top", "mode": "quantize.mode"},
          limit="layers_seconds"),
    # The manifest reads results as they are now, which no key describes: it is always written afresh (and cheap).
    Stage("manifest", ManifestConfig, None, "artifacts/<recipe>/manifest.json: every file with its stage, target, "
          "sha256 and size.", "#eeeeee", in_process=True, cached=False),
    # Keyed on the manifest: only a recipe whose results changed is drawn again; a fresh checkout fetches the rest.
    Stage("plot", PlotConfig, {"manifest": ("manifest",)}, "artifacts/plots/<recipe>.png: host latency, and size "
          "and quality against it, per recipe.", "#eeeeee", in_process=True, module="mobilebuild.results.plots"),
):
    register(_stage)
