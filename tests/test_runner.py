"""The in-process doit runner (mobilebuild/engine/runner.py) that `mobilebuild check` and `mobilebuild tune` run the
build's tasks with: real doit on a tiny model's tasks, each task's end read as data, never from what was printed."""

import pytest
from conftest import Project, checkouts, tiny_recipe

from mobilebuild import tasks
from mobilebuild.engine import execute, runner

ONE_TARGET = tiny_recipe(targets=[{"backend": "xnnpack"}])
CHAIN = ["checkpoint:tiny", "fuse:tiny", "script:tiny-fp32"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A shared artifact cache of this test's own: what the first build makes is not in it yet."""
    monkeypatch.setenv("MOBILEBUILD_CACHE", str(tmp_path / "cache"))
    execute.shared_cache.cache_clear()
    yield tmp_path / "cache"
    execute.shared_cache.cache_clear()


def run_in(project, monkeypatch, wanted, **options):
    """The runner's run of `wanted` in `project`, and the Ended each on_end call got."""
    monkeypatch.chdir(project.root)
    reported = []
    return runner.run(tasks, wanted, reported.append, **options), reported


@pytest.mark.slow  # a real build: a stage worker starts (torch imported) and builds the chain
def test_a_chain_is_built_then_up_to_date_then_from_the_cache_in_another_checkout(tmp_path, monkeypatch, cache):
    first, second = checkouts(tmp_path, "first", "second", recipe=ONE_TARGET)
    built, reported = run_in(first, monkeypatch, ["script:tiny-fp32"], ask=["script:tiny-fp32"])
    assert built.status == 0
    assert list(built.ended) == CHAIN  # what it needs too, in the order doit ended them
    assert {end.how for end in built.ended.values()} == {runner.BUILT}
    assert reported == [built.ended["script:tiny-fp32"]]  # on_end: the wanted tasks only
    assert built.current_at_start == frozenset()  # not built yet when the run began

    again, _ = run_in(first, monkeypatch, ["script:tiny-fp32"], ask=["script:tiny-fp32", "fuse:tiny"])
    assert [(end.task, end.how) for end in again.ended.values()] == [(task, runner.UP_TO_DATE) for task in CHAIN]
    assert again.current_at_start == {"script:tiny-fp32", "fuse:tiny"}

    fetched, _ = run_in(second, monkeypatch, ["script:tiny-fp32"])
    assert [(end.task, end.how) for end in fetched.ended.values()] == [(task, runner.CACHED) for task in CHAIN]
    end = fetched.ended["script:tiny-fp32"]
    assert end.made and (end.failed_task, end.error, end.needs, end.crashed) == (None, None, (), False)
    scripted = "artifacts/tiny/scripted-fp32.pt"
    assert (second.root / scripted).read_bytes() == (first.root / scripted).read_bytes()


def test_a_failed_task_has_the_build_s_line_and_what_needs_it_is_skipped_naming_it(tmp_path, monkeypatch, cache):
    project = Project(tmp_path / "broken")
    (project.root / "broken_net.py").write_text("def make():\n    raise ValueError('no model today')\n")
    project.write_recipe(tiny_recipe("broken", model={"factory": "broken_net:make"}, targets=[{"backend": "xnnpack"}]))
    ran, reported = run_in(project, monkeypatch, ["script:broken-fp32"])
    assert ran.status != 0
    line = "recipes/broken.yaml: model.factory: broken_net:make(**kwargs) raised ValueError: no model today"
    assert ran.ended == {
        "checkpoint:broken": runner.Ended("checkpoint:broken", runner.FAILED, "checkpoint:broken", line),
        "fuse:broken": runner.Ended("fuse:broken", runner.SKIPPED, "checkpoint:broken", line, ("checkpoint:broken",)),
        "script:broken-fp32": runner.Ended("script:broken-fp32", runner.SKIPPED, "checkpoint:broken", line,
                                           ("fuse:broken",))}
    assert reported == [ran.ended["script:broken-fp32"]] and not reported[0].made


def test_a_crash_in_mobilebuild_is_named_as_one_with_its_traceback_on_stderr(tmp_path, monkeypatch, capsys, cache):
    (project,) = checkouts(tmp_path, "crashing", recipe=ONE_TARGET)

    def crash(node):
        raise RuntimeError(f"{node.task_name}: a bug")

    monkeypatch.setattr(tasks, "run_node", crash)
    ran, _ = run_in(project, monkeypatch, ["fuse:tiny"])
    checkpoint, fuse = ran.ended["checkpoint:tiny"], ran.ended["fuse:tiny"]
    assert (checkpoint.how, checkpoint.crashed, fuse.how, fuse.crashed) == (runner.FAILED, True, runner.SKIPPED, True)
    assert fuse.failed_task == "checkpoint:tiny" and fuse.error.startswith("crashed (a bug in mobilebuild): ")
    assert "RuntimeError: checkpoint:tiny: a bug" in capsys.readouterr().err


def test_ignored_tasks_and_names_doit_does_not_run(tmp_path, monkeypatch, cache):
    from doit.cmd_base import ModuleTaskLoader
    from doit.doit_cmd import DoitMain

    (project,) = checkouts(tmp_path, "ignoring", recipe=ONE_TARGET)
    monkeypatch.chdir(project.root)
    assert DoitMain(ModuleTaskLoader(tasks)).run(["ignore", "checkpoint:tiny"]) is None  # `doit ignore`
    ran, _ = run_in(project, monkeypatch, ["fuse:tiny"])
    assert ran.status == 0
    assert {task: (end.how, end.error) for task, end in ran.ended.items()} == {
        task: (runner.IGNORED, "ignored (doit ignore): the build skips it too")
        for task in ("checkpoint:tiny", "fuse:tiny")}

    unknown, reported = run_in(project, monkeypatch, ["fuse:tiny", "nope"])
    assert unknown.status == 3  # doit refused the command line: no task ran
    assert [(end.task, end.how, end.error) for end in reported] == [
        (task, runner.NOT_RUN, "doit did not run it (exit 3)") for task in ("fuse:tiny", "nope")]
