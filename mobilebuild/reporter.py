"""doit's console reporter, with user mistakes shown as one line on stderr instead of a failure dump; and doit's
other reporters, each taking the build lock."""

import sys

from doit import reporter
from doit.exceptions import TaskError, UnmetDependency
from doit.reporter import ConsoleReporter

from mobilebuild.lock import hold_build_lock


class Reporter(ConsoleReporter):
    desc = "console output; recipe mistakes as one line each; one build at a time"

    def initialize(self, tasks, selected_tasks):
        hold_build_lock()  # doit calls this only when it is about to run tasks: listing never waits
        super().initialize(tasks, selected_tasks)

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
    """doit's own reporter `base`, taking the build lock when tasks are about to run, like Reporter: the lock rides
    on the reporter because doit calls it exactly then, whichever reporter (`-r json`...) the build uses."""

    class Locked(base):
        desc = f"{base.desc}; one build at a time"

        def initialize(self, tasks, selected_tasks):
            hold_build_lock()
            if hasattr(super(), "initialize"):
                super().initialize(tasks, selected_tasks)

    Locked.__name__ = Locked.__qualname__ = base.__name__
    return Locked


JsonReporter = _one_build_at_a_time(reporter.JsonReporter)
ExecutedOnlyReporter = _one_build_at_a_time(reporter.ExecutedOnlyReporter)
ZeroReporter = _one_build_at_a_time(reporter.ZeroReporter)
ErrorOnlyReporter = _one_build_at_a_time(reporter.ErrorOnlyReporter)

# doit's reporter names, replaced (pyproject.toml [tool.doit.plugins.reporter]; the mobilebuild command registers
# them itself)
PLUGINS = {"console": "mobilebuild.reporter:Reporter", "json": "mobilebuild.reporter:JsonReporter",
           "executed-only": "mobilebuild.reporter:ExecutedOnlyReporter", "zero": "mobilebuild.reporter:ZeroReporter",
           "error-only": "mobilebuild.reporter:ErrorOnlyReporter"}
