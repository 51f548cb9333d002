"""One tune's data: the user's recipe and target, the goal, the generated recipe of the candidates, the rounds built
through the build's own tasks (engine/runner.py) and each candidate's outcome. It prints nothing: table.py shows it.

Every candidate is a target of a generated recipe, `.mobilebuild/tune/<recipe>.yaml` (the user's recipe renamed
`<recipe>.tune`, its relative paths rewritten to point where the user's do, and only candidate targets), which the
project's graph plans while $MOBILEBUILD_EXTRA_RECIPES names it: its nodes are the build's own, with the build's
doit state and shared artifact cache, so a candidate built once is never built again. Each round of the search
(search.py) is one doit run of its candidates' verify and bench tasks; the first also runs the baseline's per-layer
comparison, the ranking the search walks.
"""

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from mobilebuild import store, tasks
from mobilebuild.engine import runner
from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import generation, graph, recipe, routes
from mobilebuild.tune import patch, search
from mobilebuild.worker import metrics  # no torch there

TUNE_DIR = recipe.TUNE_DIR  # ignored scratch (.gitignore: .mobilebuild/)
SUFFIX = recipe.TUNE_SUFFIX  # the generated recipe's name: the user's and this
RANKED = 16  # how many layers the baseline's per-layer comparison ranks: the longest walk
EXCLUDABLE = recipe.schema()["properties"]["quantize"]["properties"]["exclude"]["items"]["pattern"]
STUBS = ("QuantStub", "DeQuantStub", "QuantizeLinear", "DequantizeLinear")
NEEDS = {"accuracy_drop": "accuracy needs labelled evaluation data: verify.evaluation returning inputs and labels",
         "top1_agreement": "top-1 agreement needs a classifier's scores as output"}
MADE = (runner.BUILT, runner.CACHED, runner.UP_TO_DATE)  # what the summary counts, in its order


class Refused(Exception):
    """Bad input: one line per problem, exit 2."""

    def __init__(self, *lines):
        super().__init__("\n".join(lines))
        self.lines = lines


def parse_goal(values, thresholds, explicit, defaults):
    """(the thresholds to meet, the names set on purpose: those tune must be able to measure). `defaults`: the
    precision's default thresholds, whose names --goal takes."""
    goal, chosen = dict(thresholds), set(explicit)
    for value in values:
        if value == "recipe":
            continue
        if value == "defaults":
            goal, chosen = dict(defaults), set()
            continue
        name, equals, number = value.partition("=")
        if not equals or name not in defaults:
            raise Refused(f"mobilebuild tune: --goal: no threshold {name!r} (expected recipe, defaults or NAME=VALUE "
                          f"with NAME one of {', '.join(defaults)})")
        try:
            goal[name] = float(number)
        except ValueError:
            raise Refused(f"mobilebuild tune: --goal {name}: expected a number, got {number!r}") from None
        chosen.add(name)
    return goal, chosen


def _tunable_lm(target, file):
    route = routes.route_for(target, file, generative=True)
    return routes.generative_precision(route, target) != "fp32" and route.generation.layers is not None


def candidate_id(target_id, candidate, label):
    """`qnnpack-f0-histogram`, `qnnpack-f2-3fa9c1-minmax`: the float layers' count and digest, and the observer."""
    digest = f"-{hashlib.sha256(chr(10).join(candidate.exclude).encode()).hexdigest()[:6]}" if candidate.exclude \
        else ""
    return f"{target_id}-f{candidate.floats}{digest}-{label}"


def _relocated(value, source_dir, tune_dir):
    """A path relative to the user's recipe, relative to the generated one instead (absolute ones stay)."""
    if not isinstance(value, str) or Path(value).is_absolute():
        return value
    return os.path.relpath(source_dir / value, tune_dir)


def _relocate_quantize(section, source_dir, tune_dir):
    if not isinstance(section, dict):
        return
    if "checkpoint" in section:
        section["checkpoint"] = _relocated(section["checkpoint"], source_dir, tune_dir)
    calibration = section.get("calibration")
    if isinstance(calibration, dict) and "path" in calibration:
        calibration["path"] = _relocated(calibration["path"], source_dir, tune_dir)


@dataclass
class Proposal:
    """The winner's settings as the recipe file would say them, and what became of them: `edited`, the recipe's text
    with them (None: its layout needs a hand edit); `diff` and `patch_file` where that changes the file (written);
    `written`: --write applied it to the recipe."""

    settings: dict
    edited: str | None = None
    diff: str | None = None
    patch_file: Path | None = None
    written: bool = False


class Session:
    """One tune: the user's recipe and target, the goal, the generated recipe, and the candidates' outcomes
    (`results`, {Candidate: search.Outcome}; `order`, the candidates in the order they were first built; `made`,
    how many of their tasks were built, came from the cache or were up to date)."""

    def __init__(self, root, options):
        self.root, self.options = root, options
        path = Path(options.recipe)
        if not (root / path).is_file():
            raise Refused(f"mobilebuild tune: {options.recipe}: no such recipe file")
        try:
            self.recipe = recipe.load(path, root)
            graph.recipe_nodes(self.recipe, root)
        except RecipeErrors as exc:
            raise Refused(*map(str, exc.errors)) from None
        except MobileBuildError as exc:
            raise Refused(str(exc)) from None
        file = self.recipe.file
        self.text = (root / file).read_text(encoding="utf-8")
        self.raw = yaml.load(self.text, Loader=recipe._Loader)
        ids = [t.id for t in self.recipe.targets]
        target = next((t for t in self.recipe.targets if t.id == options.target), None)
        if target is None:
            raise Refused(f"{file}: --target: no target {options.target!r} in the recipe (its targets: "
                          f"{', '.join(ids)})")
        self.target = target
        self.stages = ("verify", "bench", "layers")  # a candidate's verification, timing and per-layer comparison
        if self.recipe.generate:
            thresholds, raw_thresholds, defaults = self._language_model(target, file)
        else:
            thresholds, raw_thresholds, defaults = self._int8(target, file)
        self.goal, self.chosen = parse_goal(options.goal, thresholds, raw_thresholds, defaults)
        self.from_recipe = self.goal == thresholds
        self.name = f"{self.recipe.name}{SUFFIX}"
        self.tune_file = f"{TUNE_DIR}/{self.recipe.name}.yaml"
        self.results, self.order = {}, []
        self.made = dict.fromkeys(MADE, 0)
        self.nodes, self.ended = {}, {}

    def _int8(self, target, file):
        """An int8 target's route, observers and thresholds: (the recipe's, those it sets, the defaults)."""
        self.route = routes.route_for(target, file)
        int8 = [t.id for t in self.recipe.targets if routes.route_for(t, file).precision(t) == "int8"
                and routes.route_for(t, file).runs_on_host]
        where = f"targets[{target.index}]"
        if self.route.precision(target) != "int8":
            raise Refused(f"{file}: {where}: {target.id} is {self.route.precision(target)}: tune chooses int8 "
                          f"settings (quantize.exclude, quantize.observer); its int8 targets that run here: "
                          f"{', '.join(int8) or 'none'}")
        if not self.route.runs_on_host:
            raise Refused(f"{file}: {where}: {target.id} {self.route.host_reason}: tune needs verify and bench "
                          f"results from this host; its int8 targets that run here: {', '.join(int8) or 'none'}")
        mode = target.quantize["mode"]
        if mode == "qat":
            raise Refused(f"{file}: {where}.quantize.mode: a QAT checkpoint fixes what is quantized: tune needs "
                          "mode static or dynamic")
        current = target.quantize.get("observer")
        if mode != "static" or not self.route.observers:
            self.observers = [current]
        else:
            effective = current or self.route.observers[0]
            self.observers = [current] + [o for o in self.route.observers if o != effective]
        self.effective = {o: o or (self.route.observers[0] if self.route.observers and mode == "static"
                                   else "none") for o in self.observers}
        self.precision, self.threshold_field = "int8", "verify.thresholds.int8"
        raw_thresholds = ((self.raw.get("verify") or {}).get("thresholds") or {}).get("int8") or {}
        return self.recipe.verify["thresholds"]["int8"], raw_thresholds, recipe.default_thresholds("int8")

    def _language_model(self, target, file):
        """A quantized language model target's route and thresholds (generate.thresholds over the precision's
        defaults): no observer to choose, the layers it keeps float only (quantize.exclude)."""
        self.route = routes.route_for(target, file, generative=True)
        self.precision = routes.generative_precision(self.route, target)
        self.stages = (generation.VERIFY, generation.BENCH, generation.LAYERS)
        if self.precision == "fp32" or not self.route.generation.layers:
            able = ", ".join(t.id for t in self.recipe.targets if _tunable_lm(t, file)) or "none"
            why = (f"is {self.precision}" if self.precision == "fp32" else
                   f"({self.route.backend}, {self.route.runtime}) has no per-layer ranking for language models")
            raise Refused(f"{file}: targets[{target.index}]: {target.id} {why}: tune chooses the layers a quantized "
                          f"language model keeps float (quantize.exclude); its targets it can tune: {able}")
        self.observers, self.effective = [None], {None: "none"}
        self.threshold_field = f"generate.thresholds.{self.precision}"
        defaults = generation.DEFAULT_THRESHOLDS[self.precision]
        raw_thresholds = ((self.raw.get("generate") or {}).get("thresholds") or {}).get(self.precision) or {}
        return {**defaults, **raw_thresholds}, raw_thresholds, defaults

    @property
    def baseline(self):
        """The recipe's own settings: no float layer, its own observer."""
        return search.Candidate((), self.observers[0])

    # --- the generated recipe --------------------------------------------------------------------------------------

    def cid(self, candidate):
        return candidate_id(self.target.id, candidate, self.effective[candidate.observer])

    def generated(self, candidates):
        """The user's recipe as data, renamed, its paths relative to the generated file, with `candidates` as its
        targets."""
        data = json.loads(json.dumps(self.raw))  # a deep copy, anchors and merges resolved
        source_dir, tune_dir = (self.root / self.recipe.file).parent.resolve(), (self.root / TUNE_DIR).resolve()
        data["name"] = self.name
        model = data.get("model") or {}
        if "checkpoint" in model:
            model["checkpoint"] = _relocated(model["checkpoint"], source_dir, tune_dir)
        quantize = data.setdefault("quantize", {}) or {}
        data["quantize"] = quantize
        _relocate_quantize(quantize, source_dir, tune_dir)
        for key in ("exclude", "observer"):  # each candidate says its own
            quantize.pop(key, None)
        verify = data.setdefault("verify", {}) or {}
        data["verify"] = verify
        verify["layers"] = True
        verify["layers_top"] = max(verify.get("layers_top", 5), RANKED)
        entry = data["targets"][self.target.index]
        if entry.get("toolchain"):
            entry["toolchain"] = _relocated(entry["toolchain"], source_dir, tune_dir)
        own = dict(entry.get("quantize") or {})
        _relocate_quantize(own, source_dir, tune_dir)
        own.pop("exclude", None)
        own.pop("observer", None)
        targets = []
        for candidate in candidates:
            settings = dict(own)
            if candidate.exclude:
                settings["exclude"] = list(candidate.exclude)
            if candidate.observer:
                settings["observer"] = candidate.observer
            targets.append({**{k: v for k, v in entry.items() if k != "quantize"}, "name": self.cid(candidate),
                            **({"quantize": settings} if settings else {})})
        data["targets"] = targets
        return data

    def write(self, candidates):
        """Write the generated recipe and plan it: {task name: node} of its nodes."""
        store.write_text(self.root / self.tune_file,
                         f"# written by mobilebuild tune {self.recipe.file} --target {self.target.id}; rewritten "
                         "by each run\n" + yaml.safe_dump(self.generated(candidates), sort_keys=False))
        try:
            planned = recipe.load(self.tune_file, self.root)
            return {node.task_name: node for node in graph.recipe_nodes(planned, self.root)}
        except RecipeErrors as exc:  # the user's recipe planned: this is mobilebuild's own mistake
            raise MobileBuildError(f"the generated recipe {self.tune_file} does not plan: {exc.errors[0]}") from None

    def start(self):
        """Let the project plan the generated recipe, written with the baseline alone; return the baseline's per-layer
        comparison node, whose ranking the search walks."""
        os.environ[recipe.EXTRA_RECIPES_VARIABLE] = os.pathsep.join(
            filter(None, [os.environ.get(recipe.EXTRA_RECIPES_VARIABLE), self.tune_file]))
        nodes = self.write([self.baseline])
        layers_task = f"{self.stages[2]}:{self.name}-{self.cid(self.baseline)}"
        if layers_task not in nodes:
            raise Refused(f"{self.recipe.file}: targets[{self.target.index}]: {self.target.id} has no per-layer "
                          f"comparison on this host ({self.route.backend}, {self.route.runtime}): tune walks its "
                          "ranking")
        return nodes[layers_task]

    # --- rounds ----------------------------------------------------------------------------------------------------

    def tasks_of(self, candidate):
        name = f"{self.name}-{self.cid(candidate)}"
        return f"{self.stages[0]}:{name}", f"{self.stages[1]}:{name}"

    def build(self, batch, slots, extra=(), on_result=None):
        """One doit run of the candidates' verify and bench tasks (and `extra`); `on_result(candidate)` as each
        candidate's outcome is known. `ended`: how each task this run wanted ended (runner.Ended)."""
        for candidate in batch:
            if candidate not in self.order:
                self.order.append(candidate)
        self.nodes = self.write(self.order)
        wanted = [task for candidate in batch for task in self.tasks_of(candidate)] + list(extra)
        by_task = {task: candidate for candidate in batch for task in self.tasks_of(candidate)}

        def ended(end):
            self.ended[end.task] = end
            if end.how in self.made:
                self.made[end.how] += 1
            candidate = by_task.get(end.task)
            if candidate is not None and all(t in self.ended for t in self.tasks_of(candidate)):
                self.results[candidate] = self.outcome(candidate)
                if on_result is not None:
                    on_result(candidate)

        self.ended = {}
        runner.run(tasks, wanted, ended, processes=self.options.process or slots, threads=bool(slots))

    def outcome(self, candidate):
        verify_task, bench_task = ends = self.tasks_of(candidate)
        if any(self.ended[task].how == runner.NOT_RUN for task in ends):  # doit never reported on it
            return search.Outcome(error="not run")
        for task in ends:
            end = self.ended[task]
            if not end.made:
                return search.Outcome(error=f"{end.failed_task}: {end.error}")
        verified = json.loads(Path(self.root, self.nodes[verify_task].output).read_text())
        timed = json.loads(Path(self.root, self.nodes[bench_task].output).read_text())
        found = verified.get("metrics")
        if found is None:
            return search.Outcome(error=f"{verify_task}: {verified.get('status')}: {verified.get('reason')}")
        missed = list(verified.get("failures") or []) if self.from_recipe else metrics.failures(found, self.goal)
        return search.Outcome(missed=missed, metrics=found, median_ms=timed.get("median_ms"),
                              p90_ms=timed.get("p90_ms"), size_bytes=timed.get("artifact_bytes"))

    def ranking(self, node):
        """What the per-layer comparison `node` found (its `layers`, worst first, and its `method`); raises
        MobileBuildError where it failed."""
        end = self.ended.get(node.task_name)
        if end is not None and not end.made:
            raise MobileBuildError(f"the per-layer comparison failed: {end.failed_task}: {end.error}")
        found = json.loads(Path(self.root, node.output).read_text())
        if found.get("error"):
            raise MobileBuildError(f"{node.task_name}: {found['error']}")
        return found

    @staticmethod
    def excludable(found):
        """The ranked layers the exclude grammar can name: not an ONNX node without a module, nor the stubs eager mode
        adds."""
        names = [row["name"] for row in found.get("layers", [])
                 if re.match(EXCLUDABLE, row["name"]) and row.get("op") not in STUBS]
        return list(dict.fromkeys(names))

    def check_goal(self, batch):
        """A threshold set on purpose that no candidate's verification reports cannot be met: one line, exit 2."""
        measured = [self.results[c].metrics for c in batch if self.results[c].metrics]
        if not measured:
            return
        reported = [name for name in self.goal if any(found.get(name) is not None for found in measured)]
        for name in sorted(self.chosen):
            if name not in reported:
                field = f"--goal {name}" if name in self.options_goals() else f"{self.threshold_field}.{name}"
                why = f" ({NEEDS[name]})" if name in NEEDS else ""
                raise Refused(f"{self.recipe.file}: {field}: tune cannot meet it: no candidate's verification "
                              f"reports {name}{why}; it can meet {', '.join(reported)}")

    def options_goals(self):
        return {value.partition("=")[0] for value in self.options.goal if "=" in value}

    # --- the outcome -----------------------------------------------------------------------------------------------

    def where(self):
        return f"{self.recipe.file}: targets[{self.target.index}].quantize"

    def settings(self, candidate):
        """The target's own quantize section with the candidate's settings, as the recipe file would say it."""
        entry = self.raw["targets"][self.target.index]
        settings = dict(entry.get("quantize") or {})
        recipe_level = self.raw.get("quantize") or {}
        settings.pop("exclude", None)
        if candidate.exclude:
            settings["exclude"] = list(candidate.exclude)
        elif recipe_level.get("exclude"):
            settings["exclude"] = []  # clears the recipe's own for this target
        if candidate.observer != self.observers[0]:  # only the recipe's own may be None (unset)
            settings["observer"] = candidate.observer
        return settings

    def propose(self, chosen):
        """The winner's settings as a patch of the recipe file, written beside the generated recipe; applied to the
        recipe with --write."""
        proposal = Proposal(self.settings(chosen))
        proposal.edited = patch.edit(self.text, self.target.index, proposal.settings)
        if proposal.edited is None or proposal.edited == self.text:
            return proposal
        proposal.diff = patch.unified(self.text, proposal.edited, self.recipe.file)
        proposal.patch_file = self.root / TUNE_DIR / f"{self.recipe.name}-{self.target.id}.patch"
        store.write_text(proposal.patch_file, proposal.diff)
        if self.options.write:
            store.write_text(self.root / self.recipe.file, proposal.edited)
            proposal.written = True
        return proposal
