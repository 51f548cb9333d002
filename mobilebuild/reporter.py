"""doit's console reporter, with user mistakes shown as one line on stderr instead of a failure dump."""

import sys

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
