"""Graph nodes as doit tasks: one task group per stage, one file target per task. No torch here: loading the
tasks (`doit list`, an up-to-date `doit`) stays fast.
"""

import functools
import os

from doit.tools import config_changed

import mobilebuild.routes  # noqa: F401 - registers the built-in route families before anything plans
from mobilebuild.engine import collector, distributed
from mobilebuild.engine.actions import (
    check_verified,
    clean_log,
    clean_output,
    clean_plots,
    fail_with,
    write_release,
    write_report,
)
from mobilebuild.engine.doit_reporters import Reporter
from mobilebuild.engine.execute import run_node
from mobilebuild.engine.uptodate import ContentChecker, NodeUpToDate, ObservedFiles
from mobilebuild.plan import graph, project, stages
from mobilebuild.results import release

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
    with collector.making_long_lived():
        return project.load(root)


def plan_again():
    """The next project_graph() reads the recipes as they are then (a process that builds more than once)."""
    project_graph.cache_clear()
    collector.release()


def project_nodes(root):
    return project_graph(root)[0]


def invalid_recipes(root):
    """{recipe file: [its problems, one line each]} of the recipes left out of the build."""
    return project_graph(root)[1]


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
                "clean": [(clean_output, [node.output]), (clean_log, [node])],
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
            # and its results on emulated ARM CPUs: a target that passes here and fails on an ARM CPU fails its gate
            on_arm = [(target, path) for target, cpus in (node.config.get("arm64") or {}).items()
                      for path in cpus.values()]
            yield {"name": node.recipe, "actions": [(check_verified, [[*results.items(), *on_arm],
                                                                      node.recipe_file])],
                   "io": output_capture(), "file_dep": [*results.values(), *(path for _, path in on_arm)],
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
