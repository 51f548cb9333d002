"""What doit runs besides building nodes (build/execute.py): the verification gate, `doit clean`, the report."""

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path

from doit.exceptions import TaskFailed

from mobilebuild import store
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import graph, project
from mobilebuild.results import release


def check_verified(results, recipe_file):
    """verified:<recipe>: one line per target whose verification failed ({target: result path}), or None. A
    verification below its thresholds is a result, recorded in the manifest and the report; this is what makes
    the build fail for it."""
    failed = []
    for target, path in results.items():
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


def write_report(invalid=None):
    """The report; `invalid` ({recipe file: its problems}) are listed as not built."""
    from mobilebuild.results import report  # matplotlib: only when a report is written

    report.main(graph.ARTIFACTS_DIR, invalid)


def fail_with(message):
    """An action that fails with `message` as one line per problem (an invalid recipe's task)."""
    return TaskFailed(message)


def write_report_despite(failures):
    """The report of a run in which failures ({task name: doit's failure}) kept the report task from running:
    written from the recipes that built, with the others listed by their errors instead of earlier results. On
    stderr: stdout may carry a JSON report (`doit -r json`)."""
    from mobilebuild.results import report

    nodes, invalid = project.load(os.getcwd())
    recipes = {node.task_name: node.recipe for node in nodes}
    unbuilt = {file: [str(problem) for problem in problems] for file, problems in invalid.items()}
    for name, failure in failures.items():
        if name in recipes:
            first_line = next(iter(failure.message.strip().splitlines()), "failed")
            unbuilt.setdefault(recipes[name], []).append(f"{name}: {first_line}")
    if unbuilt:
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
        document = release.collect(".", out_dir)
    except MobileBuildError as exc:
        return TaskFailed(str(exc))
    print(f"   released {len(document['files'])} files to {out_dir}")
    return None
