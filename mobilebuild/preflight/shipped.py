"""Each target's shipped artifact, made by the build's own doit tasks: the same nodes, executor, doit state
(`.doit.db`) and shared artifact cache as `mobilebuild build`, run up to the artifacts (`doit run <their tasks>`, in
this process: engine/runner.py), never verify, bench, the manifest or the report. A check after a build finds them up
to date; a build after a check finds them made. What a target's chain failed on is the build's own one-line error.
Whether each artifact's verify task was up to date before the run is asked of doit's own state (its verify is not
run): a check after a build then takes verify's result for the artifact instead of running it again."""

from dataclasses import dataclass

from mobilebuild import tasks
from mobilebuild.engine import runner


@dataclass
class Outcome:
    """How one task of the run ended: "built", "from the cache", "up to date" or "failed" (then `failed_task`, the
    task of its chain that failed, and `error`, the build's one-line error for it). `verify_current`: doit found the
    artifact's verify task up to date before the run (its settings, its result and the files it read unchanged)."""

    made: str
    failed_task: str | None = None
    error: str | None = None
    verify_current: bool = False


def make(task_names, finished, verify_tasks=None):
    """Run the build's tasks `task_names` (and whatever they need) in the repository that is the working directory;
    `finished(task name, Outcome)` is called as each of them ends, in the order doit ends them (a task it never ran:
    once it is over). `verify_tasks`: {task name: its verify task}, whose up-to-date status before the run each
    Outcome carries. Returns doit's exit status (0: all made)."""
    verify_tasks = verify_tasks or {}
    run = runner.Run(task_names, ask=verify_tasks.values())

    def ended(end):
        made = end.how if end.made else "failed"  # skipped, ignored or not run: its chain did not make it
        finished(end.task, Outcome(made, end.failed_task, end.error,
                                   verify_tasks.get(end.task) in run.current_at_start))

    return run.execute(tasks, ended)
