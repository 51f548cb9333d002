"""doit command plugins: `doit report`, `doit graph`, `doit why` and a quieter `doit clean` (registered in
pyproject.toml, [tool.doit.plugins.command], and by `mobilebuild` itself). None builds anything."""

import io
import os
import shutil
import subprocess
from pathlib import Path

from doit import cmd_clean
from doit.cmd_base import Command, DoitCmdBase
from doit.exceptions import InvalidCommand

from mobilebuild import store
from mobilebuild.engine import execute
from mobilebuild.engine.uptodate import NodeUpToDate
from mobilebuild.plan import graph, recipe, stages

PLUGINS = {name: f"mobilebuild.engine.commands:{cls}" for name, cls in (
    ("report", "Report"), ("graph", "Graph"), ("clean", "Clean"), ("why", "Why"))}
BUILT_FOLDERS = (graph.ARTIFACTS_DIR, "release")

# The stages' own colours (plan.stages), and the tasks that gather them.
GATHERING_COLOURS = {"verified": "#b4a7d6", "render_report": "#cccccc", "release": "#b6d7a8"}


def stage_colours():
    return {**{stage.name: stage.colour for stage in stages.all_stages()}, **GATHERING_COLOURS}


class Report(Command):
    doc_purpose = ("write artifacts/report.md, report.html and the plots from the results already built (builds "
                   "nothing)")
    doc_usage = ""
    doc_description = None
    cmd_options = ()

    def execute(self, opt_values, pos_args):
        from mobilebuild.results import plots, report, report_data

        status = report.main(graph.ARTIFACTS_DIR)
        if status == 0:
            drawn = plots.draw_all(graph.ARTIFACTS_DIR)
            print(f"drew {drawn} plot(s) in {graph.ARTIFACTS_DIR}/{report_data.PLOTS_DIR}")
        return status


opt_output = {
    "name": "output", "short": "o", "long": "output", "type": str, "default": f"{graph.ARTIFACTS_DIR}/graph.dot",
    "help": "where to write the DOT file; SVG and PNG go beside it when Graphviz `dot` is installed",
}


class Graph(DoitCmdBase):
    doc_purpose = "write the task graph as Graphviz DOT (and SVG/PNG where `dot` is installed)"
    doc_usage = "[TASK ...]"
    doc_description = None
    cmd_options = (opt_output,)

    def _execute(self, output, pos_args=None):
        path = Path(output)
        store.write_text(path, dot_source(self.task_list))
        written = [path]
        if shutil.which("dot"):
            for fmt in ("svg", "png"):
                rendered = path.with_suffix(f".{fmt}")
                subprocess.run(["dot", f"-T{fmt}", str(path), "-o", str(rendered)], check=True)
                written.append(rendered)
        else:
            print("Graphviz `dot` is not installed: wrote DOT only (render it with `dot -Tsvg`)")
        print("wrote " + ", ".join(map(str, written)))
        return 0


def dot_source(tasks):
    """Tasks with actions become nodes, coloured by stage; an edge runs from the task that makes a file to each
    task that reads it, and along explicit task dependencies between such tasks."""
    made_by = {target: task.name for task in tasks for target in task.targets}
    shown = {task.name for task in tasks if task.actions}
    colours = stage_colours()
    lines = ["digraph mobilebuild {", "  rankdir=LR;",
             '  node [shape=box, style="rounded,filled", fontname=Helvetica];']
    for task in sorted(tasks, key=lambda t: t.name):
        if task.name not in shown:
            continue
        colour = colours.get(task.name.split(":")[0], "#ffffff")
        lines.append(f'  "{task.name}" [fillcolor="{colour}"];')
    edges = set()
    for task in tasks:
        if task.name not in shown:
            continue
        sources = [made_by[dep] for dep in task.file_dep if dep in made_by]
        sources += [dep for dep in task.task_dep if dep in shown]
        edges.update((source, task.name) for source in sources)
    lines += [f'  "{source}" -> "{target}";' for source, target in sorted(edges)]
    lines.append("}")
    return "\n".join(lines) + "\n"


class Why(DoitCmdBase):
    doc_purpose = ("say why each named task would run, or that it is up to date: the recipe fields, toolchain and "
                   "files that changed since its last build, then the parts of its up-to-date key")
    doc_usage = "TASK [TASK ...]"
    doc_description = None
    cmd_options = ()

    def _execute(self, pos_args=None):
        if not pos_args:
            raise InvalidCommand("`why` takes one or more task names (`doit list --all` lists them)")
        tasks = {task.name: task for task in self.task_list}
        for name in pos_args:
            if name not in tasks:
                raise InvalidCommand(f"no task {name!r} (`doit list --all` lists them)")
            task = tasks[name]
            status = self.dep_manager.get_status(task, tasks, get_log=True)
            self.outstream.write("\n".join(why(task, status)) + "\n")
        return 0


# doit's reasons for running a task that are about files, as `why` words them
FILE_REASONS = {"missing_target": "its output is missing: {}", "changed_file_dep": "an input changed: {}",
                "missing_file_dep": "an input is missing: {} (build what makes it first)",
                "added_file_dep": "it reads a new input: {}", "removed_file_dep": "it no longer reads {}"}


def why(task, status):
    """Lines saying whether `task` is up to date and why not (doit's DependencyStatus, taken with get_log)."""
    check = next((utd for utd, _, _ in task.uptodate if isinstance(utd, NodeUpToDate)), None)
    where = f" ({check.node.output}, from {check.node.recipe_file})" if check else ""
    if status.status == "up-to-date":
        lines = [f"{task.name}{where}: up to date"]
    else:
        lines = [f"{task.name}{where}: would run, because"]
        reasons = status.reasons
        for utd, _, _ in reasons.get("uptodate_false", ()):
            lines += [f"  - {line}" for line in (utd.changes() if isinstance(utd, NodeUpToDate) else [repr(utd)])]
        for reason, sentence in FILE_REASONS.items():
            lines += [f"  - {sentence.format(path)}" for path in reasons.get(reason, ())]
        if reasons.get("checker_changed"):
            lines.append("  - doit's file checker changed since its last build")
        if reasons.get("has_no_dependencies") or status.status == "error":
            lines.append(f"  - {status.error_reason or 'it has no dependencies: it always runs'}")
    if check:
        lines.append("  its up-to-date key:")
        lines += [f"    {line}" for line in check.parts()]
        lines.append(f"    files, by content: {', '.join(sorted(task.file_dep)) or 'none'}")
    return lines


class Clean(cmd_clean.Clean):
    """doit clean in one line, the number of files it removed, instead of a line per clean action (80 for a small
    repository). Cleaning everything also removes what `doit graph` wrote, failed nodes' logs (.mobilebuild/logs), and
    artifacts/ once empty."""

    def _execute(self, dryrun, cleandep, cleanall, cleanforget, pos_args=None):
        if dryrun:  # listing what would be done is the point of a dry run
            return super()._execute(dryrun, cleandep, cleanall, cleanforget, pos_args)
        before = _built_files()
        shown, self.outstream = self.outstream, io.StringIO()
        try:
            result = super()._execute(dryrun, cleandep, cleanall, cleanforget, pos_args)
        finally:
            self.outstream = shown
        if not pos_args:
            for leftover in Path(graph.ARTIFACTS_DIR).glob("graph.*"):
                leftover.unlink()
            _remove_tune_candidates()
            shutil.rmtree(execute.LOG_DIR, ignore_errors=True)  # failed nodes' tracebacks, those of gone tasks too
            for folder in BUILT_FOLDERS:
                _remove_empty_folders(Path(folder))
        removed = len(before - _built_files())
        shown.write(f"removed {removed} file{'s' if removed != 1 else ''} "
                    f"({', '.join(f'{folder}/' for folder in BUILT_FOLDERS)})\n")
        return result


def _remove_tune_candidates():
    """What `mobilebuild tune` built: its candidates' artifacts, plots and generated recipes, which no task of the
    build names."""
    artifacts, suffix = Path(graph.ARTIFACTS_DIR), recipe.TUNE_SUFFIX
    for leftover in [*artifacts.glob(f"*{suffix}"), *artifacts.glob(f"plots/*{suffix}.*"), Path(recipe.TUNE_DIR)]:
        if leftover.is_dir():
            shutil.rmtree(leftover)
        elif leftover.exists():
            leftover.unlink()


def _built_files():
    return {os.path.join(top, name) for folder in BUILT_FOLDERS for top, _, names in os.walk(folder)
            for name in names}


def _remove_empty_folders(folder):
    for top, _, _ in sorted(os.walk(folder), reverse=True):  # the deepest first
        try:
            os.rmdir(top)
        except OSError:
            pass
