"""Each target's shipped artifact, made by the build's own doit tasks: the same nodes, executor, doit state
(`.doit.db`) and shared artifact cache as `mobilebuild build`, run up to the artifacts (`doit run <their tasks>`),
never verify, bench, the manifest or the report. A check after a build finds them up to date; a build after a check
finds them made. What a target's chain failed on is the build's own one-line error. Whether each artifact's verify task
was up to date before the run is asked of doit's own state (its verify is not run): a check after a build then takes
verify's result for the artifact instead of running it again."""

import inspect
import sys
from dataclasses import dataclass

from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
from doit.exceptions import TaskError, UnmetDependency
from doit.globals import Globals
from doit.reporter import ZeroReporter

from mobilebuild import tasks
from mobilebuild.engine.doit_reporters import RunHooks, first_line
from mobilebuild.engine.repo_lock import release_build_lock

CACHED = "(from the cache)"  # what engine.execute.run_node prints for an artifact the shared cache gave


@dataclass
class Outcome:
    """How one task of the run ended: "built", "from the cache", "up to date" or "failed" (then `failed_task`, the
    task of its chain that failed, and `error`, the build's one-line error for it). `verify_current`: doit found the
    artifact's verify task up to date before the run (its settings, its result and the files it read unchanged)."""

    made: str
    failed_task: str | None = None
    error: str | None = None
    verify_current: bool = False


def _crashed(fail):
    """An exception raised in an action (doit's TaskError itself), not a failure it returned nor a dependency's."""
    return type(fail) is TaskError


class _Reporter(RunHooks, ZeroReporter):
    """Silent, like doit's zero reporter, with the build's run hooks (it takes the build lock, says what the shared
    cache held that was not trusted); it notes how each task ended, and calls `finished(task name, Outcome)` as soon
    as each of `wanted` ends. `verify_tasks`: {wanted task: its verify task}, whose up-to-date status is read when
    the run starts."""

    desc = "mobilebuild check: the shipped artifacts' tasks, one outcome each"

    def __init__(self, wanted, finished, verify_tasks=None):
        super().__init__(sys.stdout, {})
        self.wanted, self.finished = set(wanted), finished
        self.verify_tasks, self.verify_current = verify_tasks or {}, set()
        self.failed, self.ignored = {}, set()

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)  # the build lock: no build writes doit's state meanwhile
        self.verify_current = {name for name, verify in self.verify_tasks.items() if _up_to_date(verify, tasks)}

    def _done(self, task, outcome):
        if task.name in self.wanted:
            outcome.verify_current = task.name in self.verify_current
            self.finished(task.name, outcome)

    def add_success(self, task):
        printed = "".join(action.out or "" for action in task.actions)
        self._done(task, Outcome("from the cache" if CACHED in printed else "built"))

    def skip_uptodate(self, task):
        self._done(task, Outcome("up to date"))

    def skip_ignore(self, task):  # `doit ignore TASK`: the build would not make it either
        self.ignored.add(task.name)
        self._done(task, Outcome("failed", *self.cause(task.name)))

    def add_failure(self, task, fail):
        super().add_failure(task, fail)  # into self.failed
        if _crashed(fail):  # an exception in mobilebuild itself: its traceback is for us
            print(f"{task.name}: {fail.get_msg()}", file=sys.stderr, flush=True)
        self._done(task, Outcome("failed", *self.cause(task.name)))

    def cause(self, name, seen=()):
        """(the task at the root of `name`'s failure, its first line): a task whose dependency failed names it."""
        fail = self.failed.get(name)
        if isinstance(fail, UnmetDependency):
            for dependency in fail.message.split():
                if (dependency in self.failed or dependency in self.ignored) and dependency not in seen:
                    return self.cause(dependency, (*seen, name))
        if fail is None:
            return name, "ignored (doit ignore): the build skips it too"
        if _crashed(fail):
            return name, f"crashed (a bug in mobilebuild): {first_line(fail.message)}"
        return name, first_line(fail.message)

    def runtime_error(self, msg):
        print(msg, file=sys.stderr, flush=True)


def _up_to_date(name, tasks):
    """Whether doit's state says the task `name` is up to date, as `doit info` asks it; False where it cannot say."""
    task = tasks.get(name)
    if task is None or Globals.dep_manager is None:
        return False
    try:
        return Globals.dep_manager.get_status(task, tasks).status == "up-to-date"
    except Exception:  # noqa: BLE001 - an uptodate check that fails: then it is not known to be up to date
        return False


def make(task_names, finished, verify_tasks=None):
    """Run the build's tasks `task_names` (and whatever they need) in the repository that is the working directory;
    `finished(task name, Outcome)` is called as each of them ends, in the order doit ends them. `verify_tasks`:
    {task name: its verify task}, whose up-to-date status before the run each Outcome carries. Returns doit's exit
    status (0: all made)."""
    tasks.plan_again()  # the recipes as they are now: this process may have checked before
    namespace = dict(inspect.getmembers(tasks))
    # captured, not echoed (verbosity 0): the check prints its own line per target
    reporter = _Reporter(task_names, finished, verify_tasks)
    namespace["DOIT_CONFIG"] = {**tasks.DOIT_CONFIG, "reporter": reporter, "verbosity": 0}
    try:
        return DoitMain(ModuleTaskLoader(namespace)).run(["run", *task_names])
    finally:
        release_build_lock()  # a build may follow in this process (a test) or start while this one inspects

