"""doit's console reporter, with user mistakes shown as one line on stderr instead of a failure dump; and doit's
other reporters. Every one of them takes the build lock, and writes the report at the end of a run in which a
broken recipe kept doit from writing it."""

import contextlib
import os
import sys

from doit import reporter
from doit.exceptions import TaskError, UnmetDependency
from doit.reporter import ConsoleReporter

from mobilebuild.engine import collector
from mobilebuild.engine.actions import write_manifests_despite, write_report_despite
from mobilebuild.engine.execute import WAITED, untrusted_summary
from mobilebuild.engine.repo_lock import hold_build_lock
from mobilebuild.worker.quiet import SHOWN_WARNINGS, shown_warnings_list

MENTIONED = 1.0  # seconds of waiting, in all, that the last line mentions


def first_line(text):
    """The first line of a failure's message that says something, as a reporter shows a failed task in one line."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "failed")


class RunHooks:
    """Mixed into each reporter: doit calls a reporter exactly when tasks are about to run, for every failure, and
    once the run is over, with whichever reporter (`-r json`...) the build uses."""

    def initialize(self, tasks, selected_tasks):
        collector.keep_all()  # doit's tasks and their graph, loaded: no collection needs to traverse them again
        hold_build_lock()  # only when tasks are about to run: listing never waits
        untrusted_summary()  # left by a build that was killed: not this one's
        self.failed = {}
        self.waited = {}  # seconds the stages waited for measurements, the measurements for stages
        # the workers, started after this, show each warning once per build (worker/quiet.py); `mobilebuild tune`
        # sets one for all its runs
        self.shown_warnings = contextlib.ExitStack()
        if SHOWN_WARNINGS not in os.environ:
            self.shown_warnings.enter_context(shown_warnings_list())
        if hasattr(super(), "initialize"):
            super().initialize(tasks, selected_tasks)

    def add_failure(self, task, fail):
        self.failed[task.name] = fail
        super().add_failure(task, fail)

    def add_success(self, task):
        for kind, seconds in ((task.values or {}).get(WAITED) or {}).items():
            self.waited[kind] = self.waited.get(kind, 0.0) + seconds
        super().add_success(task)

    def complete_run(self):
        super().complete_run()
        if hasattr(self, "shown_warnings"):
            self.shown_warnings.close()
        summary = untrusted_summary()
        if summary:  # the real stderr: doit's JSON reporter swaps sys.stderr for a buffer
            print(summary, file=sys.__stderr__, flush=True)
        # A manifest depends on every target of its recipe, and the report on every manifest, so one target that
        # failed keeps doit from writing either; the rest is worth seeing, and only once the run is over is nothing
        # left to wait for.
        failed = getattr(self, "failed", {})
        blocked = {name for name, fail in failed.items() if isinstance(fail, UnmetDependency)}
        if blocked:
            failures = {name: fail for name, fail in failed.items() if name not in blocked}
            described = write_manifests_despite(blocked, failures)
            if "render_report" in blocked:
                write_report_despite(failures, described)
        said = waits(getattr(self, "waited", {}))
        if said:  # the real stderr, as the summary above: the run's last line
            print(said, file=sys.__stderr__, flush=True)


def waits(waited):
    """The build's last line, where benchmarks measuring alone held anything up for a second or more in all."""
    stages, measurements = waited.get("stages", 0.0), waited.get("measurements", 0.0)
    if stages + measurements < MENTIONED:
        return None
    return (f"measuring alone: stages waited {stages:.0f} s in all for measurements to end, measurements "
            f"{measurements:.0f} s for running stages to finish")


class Reporter(RunHooks, ConsoleReporter):
    """doit's console output, with the tasks found up to date, and those a failure kept from running, counted in one
    line at the end instead of one line each (a monorepo's up-to-date build printed hundreds, a broken recipe a
    dozen); `-r verbose` lists them."""

    desc = "console output; up-to-date tasks as one count; recipe mistakes as one line each; one build at a time"
    names_skipped = False

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        self.up_to_date = self.executed = 0
        self.skipped = []  # tasks not run because a task they need failed: counted, the failure itself is said

    def execute_task(self, task):
        self.executed += bool(task.actions)
        super().execute_task(task)

    def skip_uptodate(self, task):
        self.up_to_date += task.name[0] != "_"

    def complete_run(self):
        up_to_date, skipped = getattr(self, "up_to_date", 0), len(getattr(self, "skipped", ()))
        if up_to_date and not self.executed and not skipped:
            self.write(f"all {up_to_date} tasks up to date: nothing to do\n")
        elif up_to_date or skipped:
            counts = [f"{up_to_date} more tasks up to date"] if up_to_date else []
            if skipped:  # one broken recipe used to print a dozen `skipped ...` lines, the report's among them
                counts.append(f"{skipped} not run, as they need a task that failed (-r verbose names them)")
            self.write("; ".join(counts) + "\n")
        super().complete_run()

    def _write_failure(self, result, write_exception=True):
        failure = result["exception"]
        if isinstance(failure, UnmetDependency):
            if result["task"].actions:  # group tasks (build, verify...) only echo their members' failures
                self.skipped.append(result["task"].name)
                if self.names_skipped:
                    sys.stderr.write(f"skipped {result['task'].name}: it needs {failure.message.strip()}, "
                                     "which failed\n")
            return None
        if isinstance(failure, TaskError):  # an unexpected exception: keep doit's traceback, it is a bug
            return super()._write_failure(result, write_exception)
        sys.stderr.write(f"ERROR: {result['task'].name}: {failure.message.strip()}\n")
        return None


def _one_build_at_a_time(base):
    """doit's own reporter `base`, with the RunHooks of Reporter."""

    class Locked(RunHooks, base):
        desc = f"{base.desc}; one build at a time"

    Locked.__name__ = Locked.__qualname__ = base.__name__
    return Locked


class VerboseReporter(Reporter):
    """The console reporter with doit's `-- task` line for each task found up to date."""

    desc = ("console output with a line per up-to-date task and per task a failure kept from running; one build at "
            "a time")
    skip_uptodate = ConsoleReporter.skip_uptodate
    names_skipped = True


JsonReporter = _one_build_at_a_time(reporter.JsonReporter)
ExecutedOnlyReporter = _one_build_at_a_time(reporter.ExecutedOnlyReporter)
ZeroReporter = _one_build_at_a_time(reporter.ZeroReporter)
ErrorOnlyReporter = _one_build_at_a_time(reporter.ErrorOnlyReporter)

# doit's reporter names, replaced (pyproject.toml [tool.doit.plugins.reporter]; the mobilebuild command registers
# them itself)
PLUGINS = {name: f"mobilebuild.engine.doit_reporters:{cls}" for name, cls in (
    ("console", "Reporter"), ("verbose", "VerboseReporter"), ("json", "JsonReporter"),
    ("executed-only", "ExecutedOnlyReporter"), ("zero", "ZeroReporter"), ("error-only", "ErrorOnlyReporter"))}
