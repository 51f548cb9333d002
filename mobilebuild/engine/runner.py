"""The build's own doit tasks run in this process, through doit's API, each task's end returned as data.

`mobilebuild check` (preflight/shipped.py) and `mobilebuild tune` (tune/session.py) run some of the project's tasks
(and whatever they need) with the build's doit state, stage workers, shared artifact cache and run hooks (the build
lock, the summary of what the cache held that was not trusted), silently: they print their own lines. How each task
ended is an `Ended`: built, from the shared cache (execute.run_node says so in the task's values, never in print),
up to date, failed (the build's one-line error), skipped (a task it needs failed: which, and the task at the root of
it), ignored (`doit ignore`) or not run at all. No torch here, and not the tasks' module itself: the caller hands it
over (mobilebuild.tasks, which imports this layer)."""

import inspect
import sys
from dataclasses import dataclass

from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
from doit.exceptions import TaskError, UnmetDependency
from doit.globals import Globals
from doit.reporter import ZeroReporter

from mobilebuild.engine.doit_reporters import RunHooks, first_line
from mobilebuild.engine.execute import FROM_CACHE
from mobilebuild.engine.repo_lock import release_build_lock

BUILT, CACHED, UP_TO_DATE = "built", "from the cache", "up to date"  # the task's output is there and current
FAILED, SKIPPED, IGNORED, NOT_RUN = "failed", "skipped", "ignored", "not run"  # it is not
IGNORED_LINE = "ignored (doit ignore): the build skips it too"


@dataclass(frozen=True)
class Ended:
    """How one task of a run ended. `how`: BUILT, CACHED (the shared artifact cache gave its output), UP_TO_DATE,
    FAILED (its own action failed), SKIPPED (doit did not run it: a task it needs failed), IGNORED (`doit ignore`, it
    or a task it needs) or NOT_RUN (doit never reported on it: doit itself failed). Where it was not made,
    `failed_task` and `error` are the task at the root of it and that task's one-line error, as the build prints it;
    `needs`: for SKIPPED, the tasks it needs that failed, as doit names them; `crashed`: the root failure is an
    exception in mobilebuild itself (a bug), not a failure the task reported."""

    task: str
    how: str
    failed_task: str | None = None
    error: str | None = None
    needs: tuple = ()
    crashed: bool = False

    @property
    def made(self):
        """The task's output is there and current: built, from the cache or up to date."""
        return self.how in (BUILT, CACHED, UP_TO_DATE)


class Run:
    """One in-process doit run of the tasks `wanted` (and whatever they need). Once executed: `ended`, {task: Ended}
    for every task doit reported on, in the order they ended, then the wanted ones it never reported on (NOT_RUN);
    `status`, doit's exit status (0: all made); `current_at_start`, those of the tasks `ask` (not run) that doit's
    state found up to date as the run began, the build lock held (read it from `on_end`)."""

    def __init__(self, wanted, ask=()):
        self.wanted, self.ask = tuple(wanted), tuple(ask)
        self.ended, self.status, self.current_at_start = {}, None, frozenset()

    def execute(self, dodo, on_end=None, processes=None, threads=False):
        """Run the tasks of `dodo` (mobilebuild.tasks, its recipes planned again first: this process may have run
        before) in the repository that is the working directory; `on_end(Ended)` is called as each wanted task ends,
        in the order doit ends them, and for those it never reported on once it is over. `processes`: doit's `-n`;
        `threads`: its `-P thread` (the stages handed to Dask). Returns doit's exit status."""
        dodo.plan_again()
        reporter = Reporter(self, on_end)
        # captured, not echoed (verbosity 0): the callers print their own lines
        namespace = {**dict(inspect.getmembers(dodo)),
                     "DOIT_CONFIG": {**dodo.DOIT_CONFIG, "reporter": reporter, "verbosity": 0}}
        args = ["run", *(["-P", "thread"] if threads else []), *(["-n", str(processes)] if processes else [])]
        try:
            self.status = DoitMain(ModuleTaskLoader(namespace)).run([*args, *self.wanted])
        finally:
            release_build_lock()  # a build may follow in this process (a test) or start while the caller inspects
        for name in self.wanted:
            if name not in self.ended:  # doit itself failed (its own error is on stderr)
                reporter.end(Ended(name, NOT_RUN, name, f"doit did not run it (exit {self.status})"))
        return self.status


def run(dodo, wanted, on_end=None, *, ask=(), processes=None, threads=False):
    """Run.execute in one call: returns the executed Run."""
    executed = Run(wanted, ask)
    executed.execute(dodo, on_end, processes, threads)
    return executed


def _crashed(fail):
    """An exception raised in an action (doit's TaskError itself), not a failure it returned nor a dependency's."""
    return type(fail) is TaskError


class Reporter(RunHooks, ZeroReporter):
    """Silent, like doit's zero reporter, with the build's run hooks; records how each task ended in the Run's
    `ended` and calls `on_end(Ended)` as each wanted one does. A crash's traceback and doit's own errors go to
    stderr."""

    desc = "mobilebuild's in-process runs: each task's end as data"

    def __init__(self, run, on_end=None):
        super().__init__(sys.stdout, {})
        self.of, self.on_end = run, on_end
        self.failed, self.ignored = {}, set()

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)  # the build lock: no build writes doit's state meanwhile
        self.of.current_at_start = frozenset(name for name in self.of.ask if _up_to_date(name, tasks))

    def end(self, ended):
        self.of.ended[ended.task] = ended
        if self.on_end is not None and ended.task in self.of.wanted:
            self.on_end(ended)

    def add_success(self, task):
        self.end(Ended(task.name, CACHED if task.values.get(FROM_CACHE) else BUILT))

    def skip_uptodate(self, task):
        self.end(Ended(task.name, UP_TO_DATE))

    def skip_ignore(self, task):  # `doit ignore TASK`, or a task it needs: the build would not make it either
        self.ignored.add(task.name)
        self.end(Ended(task.name, IGNORED, task.name, IGNORED_LINE))

    def add_failure(self, task, fail):
        super().add_failure(task, fail)  # into self.failed
        if _crashed(fail):  # an exception in mobilebuild itself: its traceback is for us
            print(f"{task.name}: {fail.get_msg()}", file=sys.stderr, flush=True)
        root, line = self.cause(task.name)
        crashed = _crashed(self.failed.get(root))
        if isinstance(fail, UnmetDependency):  # its message: the tasks it needs that failed
            self.end(Ended(task.name, SKIPPED, root, line, tuple(fail.message.split()), crashed))
        else:
            self.end(Ended(task.name, FAILED, root, line, crashed=crashed))

    def cause(self, name, seen=()):
        """(the task at the root of `name`'s failure, its first line): a task whose dependency failed names it."""
        fail = self.failed.get(name)
        if isinstance(fail, UnmetDependency):
            for dependency in fail.message.split():
                if (dependency in self.failed or dependency in self.ignored) and dependency not in seen:
                    return self.cause(dependency, (*seen, name))
        if fail is None:
            return name, IGNORED_LINE
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
