"""`mobilebuild tune RECIPE --target ID`: the int8 settings (layers kept float, observer) that meet the recipe's
thresholds with the fewest float layers.

Every candidate is a target of a generated recipe, `.mobilebuild/tune/<recipe>.yaml` (the user's recipe renamed
`<recipe>.tune`, its relative paths rewritten to point where the user's do, and only candidate targets), which the
project's graph plans while $MOBILEBUILD_EXTRA_RECIPES names it: its nodes are the build's own, with the build's
doit state and shared artifact cache, so a candidate built once is never built again. Each round of the search
(search.py) is one doit run of its candidates' verify and bench tasks; the first also runs the baseline's per-layer
comparison, the ranking the search walks. No torch here: the stages run in the build's workers (or on Dask).
"""

import argparse
import hashlib
import inspect
import json
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from mobilebuild import store
from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import graph, recipe, routes
from mobilebuild.tune import patch, search
from mobilebuild.worker import metrics, progress, quiet  # no torch there

TUNE_DIR = recipe.TUNE_DIR  # ignored scratch (.gitignore: .mobilebuild/)
SUFFIX = recipe.TUNE_SUFFIX  # the generated recipe's name: the user's and this
RANKED = 16  # how many layers the baseline's per-layer comparison ranks: the longest walk
DEFAULT_BUDGET = 16
CACHED = "(from the cache)"  # what engine.execute.run_node prints for an artifact the shared cache gave
EXCLUDABLE = recipe.schema()["properties"]["quantize"]["properties"]["exclude"]["items"]["pattern"]
STUBS = ("QuantStub", "DeQuantStub", "QuantizeLinear", "DequantizeLinear")
THRESHOLDS = tuple(recipe.default_thresholds("int8"))
NEEDS = {"accuracy_drop": "accuracy needs labelled evaluation data: verify.evaluation returning inputs and labels",
         "top1_agreement": "top-1 agreement needs a classifier's scores as output"}


class Refused(Exception):
    """Bad input: one line per problem, exit 2."""

    def __init__(self, *lines):
        super().__init__("\n".join(lines))
        self.lines = lines


def parser():
    found = argparse.ArgumentParser(
        prog="mobilebuild tune", description="Find the int8 settings (layers kept float, observer) that meet the "
        "recipe's verification thresholds with the fewest float layers; every candidate is a cached build node.")
    found.add_argument("recipe", help="a recipe file of this repository")
    found.add_argument("--target", required=True, help="the int8 target's id")
    found.add_argument("--goal", action="append", default=[], metavar="recipe|defaults|NAME=VALUE",
                       help="what to meet: the recipe's verify.thresholds.int8 (default), the schema's defaults, or "
                            "a threshold set here (sqnr_db=25; repeatable, over the others)")
    found.add_argument("--max-candidates", type=int, default=DEFAULT_BUDGET,
                       help=f"the most candidates built (default {DEFAULT_BUDGET})")
    found.add_argument("--dask", metavar="ADDRESS|local", help="run the stages on Dask workers")
    found.add_argument("-n", "--process", type=int, default=None, help="doit processes per round")
    found.add_argument("--write", action="store_true", help="apply the winning settings to the recipe file")
    found.add_argument("--no-cache", action="store_true", help="neither read nor fill the shared artifact cache")
    found.add_argument("--cache-read-only", action="store_true", help="read the shared artifact cache only")
    return found


def tune_command(args, root="."):
    options = parser().parse_args(args)
    if options.no_cache:
        os.environ["MOBILEBUILD_CACHE"] = "off"
    if options.cache_read_only:
        os.environ["MOBILEBUILD_CACHE_READ_ONLY"] = "1"
    try:
        if options.max_candidates < 1:
            raise Refused(f"mobilebuild tune: --max-candidates: expected at least 1, got {options.max_candidates}")
        session = Session(Path(root), options)
    except Refused as exc:
        for line in exc.lines:
            print(line, file=sys.stderr)
        return 2
    # the table's rows say how far it is: the stages' progress lines, and each warning for every candidate, would
    # bury them (the workers, started by the first round, inherit both settings)
    with _dask(options.dask) as slots, quiet.shown_warnings_list(), quiet.environment(progress.SILENT, "1"):
        try:
            return session.run(slots)
        except Refused as exc:
            for line in exc.lines:
                print(line, file=sys.stderr)
            return 2
        except MobileBuildError as exc:
            print(f"mobilebuild tune: {exc}", file=sys.stderr)
            return 1


@contextmanager
def _dask(address):
    """The number of doit threads a round runs in with `--dask` (as `mobilebuild build --dask`), or None."""
    if not address:
        yield None
        return
    from mobilebuild.engine import distributed

    with distributed.cluster(address) as slots:
        yield slots


def parse_goal(values, thresholds, explicit):
    """(the thresholds to meet, the names set on purpose: those tune must be able to measure)."""
    goal, chosen = dict(thresholds), set(explicit)
    for value in values:
        if value == "recipe":
            continue
        if value == "defaults":
            goal, chosen = recipe.default_thresholds("int8"), set()
            continue
        name, equals, number = value.partition("=")
        if not equals or name not in THRESHOLDS:
            raise Refused(f"mobilebuild tune: --goal: no threshold {name!r} (expected recipe, defaults or NAME=VALUE "
                          f"with NAME one of {', '.join(THRESHOLDS)})")
        try:
            goal[name] = float(number)
        except ValueError:
            raise Refused(f"mobilebuild tune: --goal {name}: expected a number, got {number!r}") from None
        chosen.add(name)
    return goal, chosen


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


class Session:
    """One tune: the user's recipe and target, the goal, the generated recipe, and the candidates' outcomes."""

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
        raw_thresholds = ((self.raw.get("verify") or {}).get("thresholds") or {}).get("int8") or {}
        self.goal, self.chosen = parse_goal(options.goal, self.recipe.verify["thresholds"]["int8"], raw_thresholds)
        self.from_recipe = self.goal == self.recipe.verify["thresholds"]["int8"]
        self.name = f"{self.recipe.name}{SUFFIX}"
        self.tune_file = f"{TUNE_DIR}/{self.recipe.name}.yaml"
        self.results, self.ids, self.order = {}, {}, []
        self.made = {"built": 0, "from the cache": 0, "up to date": 0}
        self.nodes = {}

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

    # --- rounds ----------------------------------------------------------------------------------------------------

    def tasks_of(self, candidate):
        name = f"{self.name}-{self.cid(candidate)}"
        return f"verify:{name}", f"bench:{name}"

    def build(self, batch, slots, extra=()):
        """One doit run of the candidates' verify and bench tasks (and `extra`); a row each as it finishes."""
        for candidate in batch:
            if candidate not in self.order:
                self.order.append(candidate)
        self.nodes = self.write(self.order)
        wanted = [task for candidate in batch for task in self.tasks_of(candidate)] + list(extra)
        by_task = {task: candidate for candidate in batch for task in self.tasks_of(candidate)}
        ended = {}

        def finished(task, outcome):
            ended[task] = outcome
            if outcome[0] in self.made:
                self.made[outcome[0]] += 1
            candidate = by_task.get(task)
            if candidate is not None and all(t in ended for t in self.tasks_of(candidate)):
                self.results[candidate] = self.outcome(candidate, ended)
                self.row(candidate)

        run_tasks(wanted, finished, slots, self.options.process)
        for candidate in batch:  # a task doit never reported on
            if candidate not in self.results:
                self.results[candidate] = search.Outcome(error="not run")
                self.row(candidate)
        return ended

    def outcome(self, candidate, ended):
        verify_task, bench_task = self.tasks_of(candidate)
        for task in (verify_task, bench_task):
            made, failed_task, error = ended[task]
            if made == "failed":
                return search.Outcome(error=f"{failed_task}: {error}")
        verified = json.loads(Path(self.root, self.nodes[verify_task].output).read_text())
        timed = json.loads(Path(self.root, self.nodes[bench_task].output).read_text())
        found = verified.get("metrics")
        if found is None:
            return search.Outcome(error=f"{verify_task}: {verified.get('status')}: {verified.get('reason')}")
        missed = list(verified.get("failures") or []) if self.from_recipe else metrics.failures(found, self.goal)
        return search.Outcome(missed=missed, metrics=found, median_ms=timed.get("median_ms"),
                              p90_ms=timed.get("p90_ms"), size_bytes=timed.get("artifact_bytes"))

    # --- output ----------------------------------------------------------------------------------------------------

    COLUMNS = (("#", 3), ("float", 5), ("layers kept float", 30), ("observer", 15), ("SQNR dB", 8), ("top-1", 6),
               ("accuracy", 9), ("size", 9), ("host ms", 8))

    def header(self):
        print("  ".join(f"{name:<{width}}" for name, width in self.COLUMNS) + "  verdict", flush=True)

    def cells(self, candidate):
        outcome = self.results[candidate]
        found = outcome.metrics or {}
        accuracy = found.get("accuracy_artifact")
        values = (str(self.order.index(candidate) + 1), str(candidate.floats), shorten(candidate.exclude, 30),
                  self.effective[candidate.observer],
                  _number(found.get("sqnr_db"), ".2f"), _number(found.get("top1_agreement"), ".3f"),
                  _number(accuracy, ".3f"), _size(outcome.size_bytes), _number(outcome.median_ms, ".3f"))
        if outcome.error:
            verdict = f"not built: {outcome.error}"
        elif outcome.passed:
            verdict = "meets the goal"
        else:
            verdict = f"misses: {'; '.join(outcome.missed)}"
        return values, verdict

    def row(self, candidate):
        values, verdict = self.cells(candidate)
        print("  ".join(f"{value:<{width}}" for value, (_, width) in zip(values, self.COLUMNS)) + f"  {verdict}",
              flush=True)

    # --- the whole search ------------------------------------------------------------------------------------------

    def run(self, slots):
        started = time.perf_counter()
        os.environ[recipe.EXTRA_RECIPES_VARIABLE] = os.pathsep.join(
            filter(None, [os.environ.get(recipe.EXTRA_RECIPES_VARIABLE), self.tune_file]))
        goal = ", ".join(f"{name} {'>=' if name in metrics.AT_LEAST else '<='} {value:g}"
                         for name, value in sorted(self.goal.items()) if value is not None)
        origin = "verify.thresholds.int8" if self.from_recipe else "--goal"
        print(f"tuning {self.recipe.file} {self.target.id} ({self.route.backend}, {self.route.runtime}, int8): "
              f"{goal} ({origin}); at most {self.options.max_candidates} candidates", flush=True)
        baseline = search.Candidate((), self.observers[0])
        nodes = self.write([baseline])
        layers_task = f"layers:{self.name}-{self.cid(baseline)}"
        if layers_task not in nodes:
            raise Refused(f"{self.recipe.file}: targets[{self.target.index}]: {self.target.id} has no per-layer "
                          f"comparison on this host ({self.route.backend}, {self.route.runtime}): tune walks its "
                          "ranking")
        self.header()
        rounds = search.plan(self.observers, lambda: self.ranking(nodes[layers_task]), self.options.max_candidates,
                             self.results)
        first = True
        for batch in rounds:
            ended = self.build(batch, slots, extra=[layers_task] if first else ())
            if first:
                self.layers_outcome = ended.get(layers_task)
                self.check_goal(batch)
                if self.results[baseline].error:
                    print(f"the recipe's own settings do not build: {self.results[baseline].error}", file=sys.stderr)
                    return 1
            first = False
        return self.finish(time.perf_counter() - started)

    def ranking(self, node):
        outcome = getattr(self, "layers_outcome", None)
        if outcome is not None and outcome[0] == "failed":
            raise MobileBuildError(f"the per-layer comparison failed: {outcome[1]}: {outcome[2]}")
        found = json.loads(Path(self.root, node.output).read_text())
        if found.get("error"):
            raise MobileBuildError(f"{node.task_name}: {found['error']}")
        # a layer the exclude grammar can name: not an ONNX node without a module, nor the stubs eager mode adds
        names = [row["name"] for row in found.get("layers", [])
                 if re.match(EXCLUDABLE, row["name"]) and row.get("op") not in STUBS]
        print(f"ranking ({found.get('method')}, worst first): "
              + ", ".join(f"{row['name']} {row['sqnr_db']:.1f} dB" for row in found.get("layers", [])[:8]),
              flush=True)
        return list(dict.fromkeys(names))

    def check_goal(self, batch):
        """A threshold set on purpose that no candidate's verification reports cannot be met: one line, exit 2."""
        measured = [self.results[c].metrics for c in batch if self.results[c].metrics]
        if not measured:
            return
        reported = [name for name in THRESHOLDS if any(found.get(name) is not None for found in measured)]
        for name in sorted(self.chosen):
            if name not in reported:
                field = f"--goal {name}" if name in self.options_goals() else f"verify.thresholds.int8.{name}"
                why = f" ({NEEDS[name]})" if name in NEEDS else ""
                raise Refused(f"{self.recipe.file}: {field}: tune cannot meet it: no candidate's verification "
                              f"reports {name}{why}; it can meet {', '.join(reported)}")

    def options_goals(self):
        return {value.partition("=")[0] for value in self.options.goal if "=" in value}

    def finish(self, seconds):
        built = len(self.results)
        made = ", ".join(f"{count} tasks {how}" for how, count in self.made.items() if count)
        print(f"{built} candidates in {seconds:.1f} s ({made or 'nothing run'})", flush=True)
        chosen = search.winner(self.results)
        if chosen is None:
            best = search.best_effort(self.results)
            print(f"no candidate meets the goal within {self.options.max_candidates} candidates"
                  + (f"; the best, #{self.order.index(best) + 1}: {self.describe(best)}" if best else ""),
                  flush=True)
            if best is not None:
                print(f"its settings, {self.where()}:\n  quantize: {patch.flow(self.settings(best))}", flush=True)
            return 1
        print(f"winner: #{self.order.index(chosen) + 1}: {self.describe(chosen)}", flush=True)
        return self.show_patch(chosen)

    def describe(self, candidate):
        outcome = self.results[candidate]
        floats = ", ".join(candidate.exclude) or "none"
        sqnr = _number(outcome.metrics.get("sqnr_db"), ".2f")
        parts = [f"{candidate.floats} float layer{'s' if candidate.floats != 1 else ''} ({floats})",
                 f"observer {self.effective[candidate.observer]}", f"SQNR {sqnr} dB"]
        baseline = self.results.get(search.Candidate((), self.observers[0]))
        if baseline is not None and baseline.metrics and candidate.exclude:
            parts[-1] += f" (was {_number(baseline.metrics.get('sqnr_db'), '.2f')})"
            if baseline.median_ms and outcome.median_ms:
                parts.append(f"host {outcome.median_ms:.3f} ms (was {baseline.median_ms:.3f})")
            if baseline.size_bytes and outcome.size_bytes:
                parts.append(f"size {_size(outcome.size_bytes)} (was {_size(baseline.size_bytes)})")
        elif outcome.median_ms is not None:
            parts.append(f"host {outcome.median_ms:.3f} ms, size {_size(outcome.size_bytes)}")
        if outcome.missed:
            parts.append(f"misses {'; '.join(outcome.missed)}")
        return ", ".join(parts)

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

    def show_patch(self, chosen):
        settings = self.settings(chosen)
        print(f"settings, {self.where()}:\n  quantize: {patch.flow(settings)}", flush=True)
        edited = patch.edit(self.text, self.target.index, settings)
        patch_file = self.root / TUNE_DIR / f"{self.recipe.name}-{self.target.id}.patch"
        if edited is None:
            print(f"(no patch: this file's layout needs a hand edit of {self.where()})", flush=True)
            return 0
        if edited == self.text:
            print(f"{self.recipe.file} already has these settings", flush=True)
            return 0
        diff = patch.unified(self.text, edited, self.recipe.file)
        store.write_text(patch_file, diff)
        print(f"{patch_file.relative_to(self.root).as_posix() if not patch_file.is_absolute() else patch_file}:",
              flush=True)
        print(diff, end="", flush=True)
        if self.options.write:
            store.write_text(self.root / self.recipe.file, edited)
            print(f"wrote {self.recipe.file}", flush=True)
        else:
            print(f"(not applied: --write applies it, or `git apply {TUNE_DIR}/{patch_file.name}`)", flush=True)
        return 0


def shorten(names, width):
    """'broken.1, broken.0' within `width` characters: as many names as fit, then '+N'."""
    if not names:
        return "—"
    text = ", ".join(names)
    if len(text) <= width:
        return text
    shown = []
    for name in names:
        rest = len(names) - len(shown) - 1
        candidate = ", ".join([*shown, name]) + (f" +{rest}" if rest else "")
        if len(candidate) > width:
            break
        shown.append(name)
    rest = len(names) - len(shown)
    return (", ".join(shown) + f" +{rest}") if shown else f"{names[0][:width - 6]}… +{rest - 1}"


def _number(value, spec):
    return "—" if value is None else format(value, spec)


def _size(value):
    if value is None:
        return "—"
    return f"{value / 1e6:.2f} MB" if value >= 1e5 else f"{value / 1e3:.1f} kB"


def run_tasks(task_names, finished, slots=None, processes=None):
    """The build's doit tasks `task_names` in this process, silent; `finished(task, (made, failed task, error))`
    as each ends. `slots`: doit threads handing nodes to Dask."""
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    from mobilebuild import tasks
    from mobilebuild.engine.repo_lock import release_build_lock

    tasks.plan_again()  # the generated recipe as it is now
    namespace = dict(inspect.getmembers(tasks))
    namespace["DOIT_CONFIG"] = {**tasks.DOIT_CONFIG, "reporter": _reporter(task_names, finished), "verbosity": 0}
    args = ["run"]
    if slots:
        args += ["-P", "thread", "-n", str(processes or slots)]
    elif processes:
        args += ["-n", str(processes)]
    try:
        return DoitMain(ModuleTaskLoader(namespace)).run([*args, *task_names])
    finally:
        release_build_lock()


def _reporter(wanted, finished):
    from doit.exceptions import TaskError, UnmetDependency
    from doit.reporter import ZeroReporter

    from mobilebuild.engine.doit_reporters import RunHooks, first_line

    class Reporter(RunHooks, ZeroReporter):
        desc = "mobilebuild tune: one outcome per task"

        def __init__(self):
            super().__init__(sys.stdout, {})
            self.wanted, self.failed = set(wanted), {}

        def _done(self, task, made, failed_task=None, error=None):
            if task.name in self.wanted:
                finished(task.name, (made, failed_task, error))

        def add_success(self, task):
            printed = "".join(action.out or "" for action in task.actions)
            self._done(task, "from the cache" if CACHED in printed else "built")

        def skip_uptodate(self, task):
            self._done(task, "up to date")

        def skip_ignore(self, task):
            self._done(task, "failed", task.name, "ignored (doit ignore)")

        def add_failure(self, task, fail):
            super().add_failure(task, fail)
            if type(fail) is TaskError:  # a crash in mobilebuild itself: its traceback is for us
                print(f"{task.name}: {fail.get_msg()}", file=sys.stderr, flush=True)
            self._done(task, "failed", *self.cause(task.name))

        def cause(self, name, seen=()):
            fail = self.failed.get(name)
            if isinstance(fail, UnmetDependency):
                for dependency in fail.message.split():
                    if dependency in self.failed and dependency not in seen:
                        return self.cause(dependency, (*seen, name))
            return name, first_line(getattr(fail, "message", "failed"))

        def runtime_error(self, msg):
            print(msg, file=sys.stderr, flush=True)

    return Reporter()
