"""What doit runs besides building nodes (build/execute.py): the verification gate, `doit clean`, the report."""

import contextlib
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from doit.exceptions import TaskFailed

from mobilebuild import store
from mobilebuild.engine import execute
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import graph, project
from mobilebuild.results import release


def check_verified(results, recipe_file):
    """verified:<recipe>: one line per target whose verification failed ([(target, result path)]: on this host, and
    on each emulated ARM CPU), or None. A verification below its thresholds is a result, recorded in the manifest
    and the report; this is what makes the build fail for it."""
    failed = []
    for target, path in results:
        with open(path) as handle:
            result = json.load(handle)
        if result["status"] == "failed":
            failed.append(f"{recipe_file}: {target}: verification failed: {'; '.join(result['failures'])} "
                          f"(thresholds: verify.thresholds.{result['precision']})")
    return TaskFailed("\n".join(failed)) if failed else None




def clean_output(path):
    """doit clean: remove the artifact, leftovers of interrupted writes, and directories left empty."""
    path = Path(path)
    path.unlink(missing_ok=True)
    if path.parent.is_dir():
        store.remove_partials(path.parent)
    for directory in (path.parent, path.parent.parent):
        try:
            directory.rmdir()
        except OSError:
            break


def clean_log(node):
    """doit clean: the node's log, if it failed (execute.log_path), and the folders left empty."""
    path = execute.log_path(node)
    path.unlink(missing_ok=True)
    for directory in (path.parent, path.parent.parent):
        try:
            directory.rmdir()
        except OSError:
            break


def write_report(invalid=None):
    """The report; `invalid` ({recipe file: its problems}) are listed as not built."""
    from mobilebuild.results import report

    try:
        said = report.write_all(graph.ARTIFACTS_DIR, invalid)
    except MobileBuildError as exc:  # it could not write: one line, as a stage's write says it
        return TaskFailed(str(exc))
    print(said or report.nothing_to_report(graph.ARTIFACTS_DIR), file=sys.stdout if said else sys.stderr)


def fail_with(message):
    """An action that fails with `message` as one line per problem (an invalid recipe's task)."""
    return TaskFailed(message)


def write_manifests_despite(blocked, failures):
    """The manifests that failed tasks ({task name: doit's failure}) kept from being written (`blocked`: the tasks
    doit skipped): written from what this run built, each target whose chain failed marked FAILED with the first
    error in it, so that one failing target never hides its recipe's others. A recipe none of whose targets was
    built gets none (the report lists it as NOT BUILT). Returns the recipes whose manifest was written."""
    from mobilebuild.worker.stages import manifest  # no torch there

    nodes = project.nodes(os.getcwd())
    by_output = {node.output: node for node in nodes}
    by_task = {node.task_name: node for node in nodes}
    order = {node.task_name: index for index, node in enumerate(nodes)}
    stopped = blocked | set(failures)
    written = []
    for node in nodes:
        if node.stage != "manifest" or node.task_name not in blocked:
            continue
        targets = []
        for target in node.settings.targets:
            ends = [by_output.get(target["path"])] + [by_task.get(f"{stage}:{node.recipe}-{target['target']}")
                                                      for stage in ("verify", "bench")]
            failed = sorted(_upstream(ends, by_output) & set(failures), key=order.get)
            targets.append({**target, "error": f"{failed[0]}: {_first_line(failures[failed[0]])}"} if failed
                           else target)
        if all("error" in target for target in targets):
            continue
        # the files of this run only: one a failed task left from an earlier build is not this build's
        artifacts = [entry for entry in node.settings.artifacts
                     if by_output[entry["path"]].task_name not in stopped]
        try:
            with store.atomic_output(node.output) as temporary:
                manifest.run({}, dataclasses.replace(node.settings, targets=targets, artifacts=artifacts),
                             temporary)
        except OSError as exc:  # a full disk: one line, as a stage's write says it, and the next recipe's
            print(f"cannot write {node.output}: {exc.strerror or exc}", file=sys.stderr)
            continue
        written.append(node.recipe)
        for plot in nodes:  # the manifest's figure, whose task was blocked with it
            if plot.stage == "plot" and plot.inputs["manifest"] == node.output:
                with store.atomic_output(plot.output) as temporary:
                    execute.run_in_process(plot, temporary)
    return written


def _upstream(ends, by_output):
    """The task names of `ends` and of every node they read from."""
    seen, pending = set(), [node for node in ends if node is not None]
    while pending:
        node = pending.pop()
        if node.task_name not in seen:
            seen.add(node.task_name)
            pending.extend(by_output[path] for path in node.inputs.values() if path in by_output)
    return seen


def _first_line(failure):
    return next(iter(failure.message.strip().splitlines()), "failed")


def write_report_despite(failures, described=()):
    """The report of a run in which failures ({task name: doit's failure}) kept the report task from running:
    written from the recipes that built (and those in `described`, whose manifests say which targets failed), with
    the others listed by their errors instead of earlier results. On stderr: stdout may carry a JSON report
    (`doit -r json`)."""
    from mobilebuild.results import report

    nodes, invalid = project.load(os.getcwd())
    recipes = {node.task_name: node.recipe for node in nodes}
    unbuilt = dict(invalid)
    for name, failure in failures.items():
        if name in recipes and recipes[name] not in described:
            unbuilt.setdefault(recipes[name], []).append(f"{name}: {_first_line(failure)}")
    if unbuilt or described:
        with contextlib.redirect_stdout(sys.stderr):
            report.main(graph.ARTIFACTS_DIR, unbuilt)


def clean_plots():
    plots = Path(graph.ARTIFACTS_DIR) / "plots"
    shutil.rmtree(plots, ignore_errors=True)
    with contextlib.suppress(OSError):
        plots.parent.rmdir()


def write_release(out_dir=release.DEFAULT_OUT):
    """The doit `release` task's action: a refusal is one line (doit's TaskFailed), not a traceback."""
    try:
        document = release.collect(".", out_dir, signing_key=release.signing_key_from_environment())
    except release.Refused as exc:  # what could be released was; every refusal, one line each
        if exc.document:
            print(f"   released {len(exc.document['files'])} files to {out_dir}")
        return TaskFailed(str(exc))
    except MobileBuildError as exc:
        return TaskFailed(str(exc))
    print(f"   released {len(document['files'])} files to {out_dir}")
    return None
