"""doit's console reporter, with user mistakes shown as one line on stderr instead of a failure dump; and doit's
other reporters. Every one of them takes the build lock, and writes the report at the end of a run in which a
broken recipe kept doit from writing it."""

import sys

from doit import reporter
from doit.exceptions import TaskError, UnmetDependency
from doit.reporter import ConsoleReporter

from mobilebuild.build.actions import write_report_despite
from mobilebuild.build.execute import untrusted_summary
from mobilebuild.build.repo_lock import hold_build_lock


class RunHooks:
    """Mixed into each reporter: doit calls a reporter exactly when tasks are about to run, for every failure, and
    once the run is over, with whichever reporter (`-r json`...) the build uses."""

    def initialize(self, tasks, selected_tasks):
        hold_build_lock()  # only when tasks are about to run: listing never waits
        untrusted_summary()  # left by a build that was killed: not this one's
        self.failed = {}
        if hasattr(super(), "initialize"):
            super().initialize(tasks, selected_tasks)

    def add_failure(self, task, fail):
        self.failed[task.name] = fail
        super().add_failure(task, fail)

    def complete_run(self):
        super().complete_run()
        summary = untrusted_summary()
        if summary:  # the real stderr: doit's JSON reporter swaps sys.stderr for a buffer
            print(summary, file=sys.__stderr__, flush=True)
        # The report depends on every recipe's manifest, so one recipe that failed to build keeps doit from writing
        # it; the others' results are worth seeing, and only once the run is over is nothing left to wait for.
        if isinstance(getattr(self, "failed", {}).get("render_report"), UnmetDependency):
            write_report_despite({name: fail for name, fail in self.failed.items()
                                  if not isinstance(fail, UnmetDependency)})


class Reporter(RunHooks, ConsoleReporter):
    desc = "console output; recipe mistakes as one line each; one build at a time"

    def _write_failure(self, result, write_exception=True):
        failure = result["exception"]
        if isinstance(failure, UnmetDependency):
            if result["task"].actions:  # group tasks (build, verify...) only echo their members' failures
                sys.stderr.write(f"skipped {result['task'].name}: it needs {failure.message.strip()}, which failed\n")
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


JsonReporter = _one_build_at_a_time(reporter.JsonReporter)
ExecutedOnlyReporter = _one_build_at_a_time(reporter.ExecutedOnlyReporter)
ZeroReporter = _one_build_at_a_time(reporter.ZeroReporter)
ErrorOnlyReporter = _one_build_at_a_time(reporter.ErrorOnlyReporter)

# doit's reporter names, replaced (pyproject.toml [tool.doit.plugins.reporter]; the mobilebuild command registers
# them itself)
PLUGINS = {name: f"mobilebuild.build.doit_reporters:{cls}" for name, cls in (
    ("console", "Reporter"), ("json", "JsonReporter"), ("executed-only", "ExecutedOnlyReporter"),
    ("zero", "ZeroReporter"), ("error-only", "ErrorOnlyReporter"))}
