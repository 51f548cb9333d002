"""Graph nodes as doit tasks: one task group per stage, one file target per task. No torch here: loading the
tasks (`doit list`, an up-to-date `doit`) stays fast.
"""

import functools
import hashlib
import inspect
import json
import os

from doit.dependency import MD5Checker
from doit.tools import config_changed

from mobilebuild import store
from mobilebuild.build import distributed
from mobilebuild.build.actions import check_verified, clean_output, clean_plots, fail_with, write_release, write_report
from mobilebuild.build.doit_reporters import Reporter
from mobilebuild.build.execute import run_node
from mobilebuild.plan import graph, project, stages
from mobilebuild.results import release


def file_state(path, stat):
    """(timestamp, size, sha256): what content_changed compares a file with later."""
    return stat.st_mtime, stat.st_size, store.sha256_file(path)


def content_changed(path, stat, state):
    """Whether the file at `path` (now `stat`) differs from a file_state: by its size, or when its timestamp moved,
    by its content. A file touched but unchanged has not changed; only a changed timestamp costs a hash."""
    timestamp, size, digest = state
    if stat.st_size != size:
        return True
    return stat.st_mtime != timestamp and digest != store.sha256_file(path)


class ContentChecker(MD5Checker):
    """doit's default check (timestamp first, then content), with sha256 in place of md5: faster here, and shared
    through store.sha256_file with the manifest, so each artifact is hashed once per run."""

    def check_modified(self, file_path, file_stat, state):
        return content_changed(file_path, file_stat, state)

    def get_state(self, dep, current_state):
        stat = os.stat(dep)
        if current_state and current_state[0] == stat.st_mtime:
            return None
        return file_state(dep, stat)


DOIT_CONFIG = {
    "default_tasks": ["build"],
    "check_file_uptodate": ContentChecker,
    "verbosity": 2,
    "reporter": Reporter,
    "subtasks": True,  # `doit list` shows every artifact's task, e.g. optimize:mobilenet_v2-xnnpack
    # One broken model, or one artifact failing verification, must not stop the rest of a monorepo's build; it
    # also lets the manifests and the report record the failure. The exit status is still non-zero.
    "continue": True,
    # sqlite reads each task's state when asked, so a build that waited for the build lock (build/doit_reporters.py)
    # sees what the build before it recorded; dbm and json load the whole file when doit starts. It also survives two
    # writers, which dbm.dumb (the dbm found here) does not.
    "backend": "sqlite3",
}
# `doit <name>` runs these commands, never a task of that name
DOIT_COMMANDS = ("auto", "clean", "dumpdb", "forget", "graph", "help", "ignore", "info", "list", "report", "reset-dep",
                 "run", "strace", "tabcompletion")
REPORT_TARGETS = [f"{graph.ARTIFACTS_DIR}/report.md", f"{graph.ARTIFACTS_DIR}/report.html"]


@functools.lru_cache(maxsize=None)
def project_graph(root):
    """(nodes, invalid recipes) of the repository, read once per doit process."""
    return project.load(root)


def project_nodes(root):
    return project_graph(root)[0]


def invalid_recipes(root):
    """{recipe file: [its problems, one line each]} of the recipes left out of the build."""
    return project_graph(root)[1]


class NodeUpToDate(config_changed):
    """A node's up-to-date check: its key unchanged (doit's config_changed) and its target the very file this task
    last wrote.

    The key itself is kept too: `doit info TASK` then names the settings that changed since the last build
    (`config.calibration.batches: 16 -> 24`), not the whole key. The target: doit records a run's results when the
    run ends, so a build killed after replacing an artifact leaves the new bytes under the old state, and reverting
    the recipe would then take another version's artifact as up to date. A stat per task; the content is hashed only
    when the stat differs (a file touched but unchanged stays up to date).

    One check rather than two, with its signature declared: doit works out an uptodate callable's signature before
    each call (to pass it the task and its values), which from an instance's __call__ was a quarter of an up-to-date
    build's time at 200 recipes."""

    __signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                       for name in ("task", "values")])

    def __init__(self, node):
        super().__init__(node.key())
        self.node = node
        self.target = node.output
        self.previous = None
        self.intact = True

    def configure_task(self, task):
        super().configure_task(task)
        task.value_savers.append(lambda: {"_key": self.config, "target": self.target_state()})

    def _calc_digest(self):
        """config_changed's digest, md5 of json.dumps(key, sort_keys=True), with the toolchain part that every key
        shares encoded once: the same bytes, so the digests earlier builds recorded still match."""
        key = self.config
        assert key.keys() == {"config", "stage", "toolchain"}, key.keys()
        text = '{"config": %s, "stage": %s, "toolchain": %s}' % (
            json.dumps(key["config"], sort_keys=True), json.dumps(key["stage"]), _encoded_once(key["toolchain"]))
        return hashlib.md5(text.encode("utf-8")).hexdigest()

    def target_state(self):
        try:
            return file_state(self.target, os.stat(self.target))
        except FileNotFoundError:
            return None

    def __call__(self, task, values):
        self.previous = values.get("_key")
        recorded = values.get("target")
        try:
            stat = os.stat(self.target)
        except FileNotFoundError:
            stat = None
        self.intact = stat is not None and recorded is not None and not content_changed(self.target, stat, recorded)
        return super().__call__(task, values) and self.intact

    def __repr__(self):
        if self.previous is None:
            return "no settings recorded by an earlier build of this task"
        changed = [explain_change(self.node, *change) for change in _differences(self.previous, self.config)]
        reasons = ["changed: " + "; ".join(changed)] if changed else []
        if not self.intact:
            reasons.append(f"{self.target} is not the file this task last wrote")
        return "; ".join(reasons) or "nothing in the key (the previous run failed?)"


def explain_change(node, path, before, now):
    """One change in a node's key, named as its user knows it: the recipe file and field where one is behind it."""
    change = f"{_short(before)} -> {_short(now)}"
    part, _, rest = path.partition(".")
    if part == "config":
        field = stages.recipe_field(node.stage, rest, node.fields)
        return f"{node.recipe_file}: {field}: {change}" if field else f"{node.stage} setting {rest}: {change}"
    if path == "toolchain.stages_sha256":
        return "mobilebuild's stage code (mobilebuild/worker/)"
    if part == "toolchain":
        return f"toolchain {rest}: {change}"
    return f"{path}: {change}"


_ENCODED = {}


def _encoded_once(value):
    """json.dumps(value, sort_keys=True) of a value that does not change (toolchain.versions' cached dicts)."""
    found = _ENCODED.get(id(value))
    if found is None or found[0] is not value:
        found = _ENCODED[id(value)] = (value, json.dumps(value, sort_keys=True))
    return found[1]


def _differences(before, now, path=""):
    """(path, before, now) of every leaf that differs between two JSON values."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(set(before) | set(now), key=str):
            yield from _differences(before.get(key), now.get(key), f"{path}.{key}" if path else str(key))
    elif before != now:
        yield path, before, now


def _short(value):
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


class ObservedFiles:
    """An uptodate check on files a task reads when they exist, without depending on the tasks that make them: a
    release copies what the last build made, whichever of its tasks failed."""

    def __init__(self, paths):
        self.paths = paths

    def digest(self):
        return {path: store.sha256_file(path) if os.path.exists(path) else None for path in self.paths}

    def __call__(self, task, values):
        task.value_savers.append(lambda: {"observed": self.digest()})
        return values.get("observed") == self.digest()


def output_capture():
    """doit captures a task's output by swapping sys.stdout for the task's run. In threads (`--dask` runs doit with
    `-P thread`) the swaps overlap and are undone out of order, leaving one task's capture in place for good: output
    went under other tasks, and `-r json` printed nothing and exited 3. There, output goes straight through."""
    return {"capture": distributed.address() is None}


def _tasks(stage):
    for node in project_nodes(os.getcwd()):
        if node.stage == stage:
            yield {
                "name": node.name,
                "actions": [(run_node, [node])],
                "io": output_capture(),
                "file_dep": node.dependencies(),
                "targets": [node.output],
                "uptodate": [NodeUpToDate(node)],
                "clean": [(clean_output, [node.output])],
                "doc": f"{node.output} ({node.recipe_file})",
            }


def _stage_group(stage):
    """doit's task group for a stage: `doit <stage>` builds every node of it, `<stage>:<name>` one."""
    def group():
        if stage.name == "verify":  # `doit verify` fails for a failed verification, through the `verified` gates
            yield {"name": None, "task_dep": ["verified"], "doc": stage.doc}
        yield from _tasks(stage.name)

    group.__name__ = f"task_{stage.name}"
    group.__doc__ = stage.doc
    return group


def task_verified():
    """Fail for each artifact whose verification failed. Failing verify tasks would keep the manifest and the
    report, which depend on every result, from recording the failure."""
    for node in project_nodes(os.getcwd()):
        if node.stage == "manifest":
            results = node.config["verification"]  # target -> its verify result
            yield {"name": node.recipe, "actions": [(check_verified, [results, node.recipe_file])],
                   "io": output_capture(), "file_dep": list(results.values()),
                   "doc": f"fails if an artifact of {node.recipe_file} failed verification"}


def task_recipes():
    """A task per recipe, named after it (`doit mobilenet_v2`): builds, verifies and benchmarks all of it. A recipe
    named like another task (a stage's group, `build`...) has none: build it by its file (`mobilebuild build
    recipes/x.yaml`)."""
    taken = {*(name.removeprefix("task_") for name in __all__), *DOIT_COMMANDS}
    recipes = {}
    for node in project_nodes(os.getcwd()):
        recipes.setdefault((node.recipe, node.recipe_file), []).append(node.task_name)
    for (recipe, file), names in recipes.items():
        if recipe not in taken:
            yield {"basename": recipe, "actions": None, "task_dep": [*names, f"verified:{recipe}"],
                   "doc": f"build, verify and benchmark {file}"}


def task_invalid():
    """Fail for each recipe that is invalid: it alone is left out of the build (the others build and report)."""
    for file, problems in invalid_recipes(os.getcwd()).items():
        yield {"name": file, "actions": [(fail_with, ["\n".join(problems)])], "io": output_capture(),
               "doc": f"{file} is invalid: {len(problems)} problem(s)"}


def task_render_report():
    """artifacts/report.md and report.html with tables and plots, from every recipe's manifest (`doit report`
    rewrites them without building anything); invalid recipes are listed as not built, with their problems. The
    plots it links are its inputs too: `doit render_report` alone never links a figure not drawn yet."""
    results = [n.output for n in project_nodes(os.getcwd()) if n.stage in ("manifest", "plot")]
    invalid = invalid_recipes(os.getcwd())
    return {
        "actions": [(write_report, [invalid])],
        "io": output_capture(),
        "file_dep": results,
        "uptodate": [config_changed({"invalid": invalid})],
        "targets": REPORT_TARGETS,
        "clean": [(clean_output, [path]) for path in REPORT_TARGETS] + [(clean_plots, [])],
    }


def task_release():
    """Copy every built, verified artifact into release/ with release.json, after the build (`mobilebuild release`
    selects recipes and targets)."""
    manifests = [n.output for n in project_nodes(os.getcwd()) if n.stage == "manifest"]
    return {"actions": [(write_release, [])], "io": output_capture(), "task_dep": ["build"],
            "uptodate": [ObservedFiles(manifests)],
            "targets": [f"{release.DEFAULT_OUT}/{release.RELEASE_FILE}"], "clean": [(release.remove, [])]}


def task_benchmark():
    """Benchmark every artifact and refresh the report."""
    return {"actions": None, "task_dep": ["bench", "manifest", "render_report"]}


def task_build():
    """Build, verify and benchmark every artifact of every recipe, then write the report (the default)."""
    return {"actions": None,
            "task_dep": [*(stage.name for stage in stages.all_stages()), "render_report", "verified", "invalid"]}


# One task group per registered stage (a project's dodo.py registers its own routes and stages before importing this).
for _stage in stages.all_stages():
    globals()[f"task_{_stage.name}"] = _stage_group(_stage)
__all__ = ["DOIT_CONFIG", *(f"task_{stage.name}" for stage in stages.all_stages()), "task_verified", "task_invalid",
           "task_recipes", "task_render_report", "task_release", "task_benchmark", "task_build"]
