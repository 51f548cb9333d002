"""engine/doit_reporters.py through real doit runs of plain tasks (no torch): what a failure costs the console."""

import pytest
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

from mobilebuild.engine import doit_reporters


def fails():
    return False  # a python-action's False: the task failed


def tasks(reporter):
    """broken fails; three tasks need it, one after the other; fine needs nothing."""
    found = {"DOIT_CONFIG": {"reporter": reporter, "verbosity": 2, "backend": "json", "dep_file": "state.json"},
             "task_broken": lambda: {"actions": [fails]}, "task_fine": lambda: {"actions": [lambda: None]}}
    for index, needs in enumerate(("broken", "after_0", "after_1")):
        found[f"task_after_{index}"] = lambda needs=needs: {"actions": [lambda: None], "task_dep": [needs]}
    return found


@pytest.mark.parametrize("reporter, listed", [(doit_reporters.Reporter, False),
                                              (doit_reporters.VerboseReporter, True)])
def test_tasks_a_failure_keeps_from_running_are_one_count(tmp_path, monkeypatch, capfd, reporter, listed):
    monkeypatch.chdir(tmp_path)
    assert DoitMain(ModuleTaskLoader(tasks(reporter))).run(["--continue", "--output-file", "out.txt"]) != 0
    out, err = (tmp_path / "out.txt").read_text(), capfd.readouterr().err
    skipped = [line for line in err.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == (3 if listed else 0), err
    assert out.splitlines()[-1] == "3 not run, as they need a task that failed (-r verbose names them)", out
