"""measure_alone: a measurement waits for the stages running on the host, and stages wait for a measurement. Real
flock locks, held by real processes."""

import multiprocessing
import os
import subprocess
import tempfile
import threading
import time

import pytest

from mobilebuild.worker import measure_alone

WAIT = 60  # seconds: how long anything may take to happen at all, on a loaded machine


@pytest.fixture(autouse=True)
def private_lock_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # measuring alone whatever the machine's cores (from RESERVE_FROM up, a core would be set aside): the tests of
    # the reserved core set it themselves
    monkeypatch.setenv(measure_alone.POLICY, "alone")
    monkeypatch.delenv(measure_alone.RESERVED, raising=False)
    monkeypatch.setenv(measure_alone.PATIENCE, str(10 * WAIT))  # a measurement waits: the tests of clearing set less


def _hold(kind, entered, release, folder, child):
    tempfile.tempdir = folder  # the test's own lock folder: a fresh process (spawn) has not its monkeypatch
    section = measure_alone.measuring_alone("model") if kind == "measure" else measure_alone.stage_running(
        "quantize:other")
    with section:
        below = subprocess.Popen(["sleep", str(WAIT)])  # a process the stage started: a compiler, say
        child.value = below.pid
        entered.set()
        release.wait(WAIT)
        below.kill()
        below.wait()


class Holder:
    """A process inside a stage or a measurement until released."""

    def __init__(self, kind):
        # not "fork": this process may have imported JAX (litert-torch), which deadlocks a forked child
        context = multiprocessing.get_context("spawn")
        self.entered, self.release, self.child = context.Event(), context.Event(), context.Value("i", 0)
        self.process = context.Process(target=_hold, args=(kind, self.entered, self.release, tempfile.gettempdir(),
                                                           self.child))
        self.process.start()

    def done(self):
        self.release.set()
        self.process.join(WAIT)
        assert self.process.exitcode == 0


def test_stages_run_side_by_side():
    first, second = Holder("stage"), Holder("stage")
    assert first.entered.wait(WAIT) and second.entered.wait(WAIT)
    first.done()
    second.done()


def _printed(capfd, text):
    """Wait until a child process has printed `text` on stderr; return all it printed."""
    printed, deadline = "", time.monotonic() + WAIT
    while text not in printed and time.monotonic() < deadline:
        time.sleep(0.05)
        printed += capfd.readouterr().err
    return printed


def test_a_measurement_waits_for_running_stages_and_holds_off_new_ones(capfd):
    stage = Holder("stage")
    assert stage.entered.wait(WAIT)
    measurement = Holder("measure")
    printed = _printed(capfd, "waiting")
    assert "model: waiting for running stages to finish (benchmarks measure alone, 600 s at most): quantize:other in " \
        in printed
    assert f"(pid {stage.process.pid})" in printed  # which process, in which checkout: perhaps another build's
    assert not measurement.entered.is_set()  # it cannot be inside while the stage runs
    late_stage = Holder("stage")  # arrives while the measurement waits: it must not overtake it
    assert not late_stage.entered.wait(1)
    stage.done()
    assert measurement.entered.wait(WAIT)
    assert not late_stage.entered.wait(1)  # the measurement runs alone
    measurement.done()
    assert late_stage.entered.wait(WAIT)
    late_stage.done()


def test_measurements_take_turns():
    first = Holder("measure")
    assert first.entered.wait(WAIT)
    second = Holder("measure")
    assert not second.entered.wait(1)
    first.done()
    assert second.entered.wait(WAIT)
    second.done()


def test_a_killed_holder_leaves_nothing_locked():
    stage = Holder("stage")
    assert stage.entered.wait(WAIT)
    measurement = Holder("measure")
    stage.process.kill()
    stage.process.join(WAIT)
    assert measurement.entered.wait(WAIT)
    measurement.done()


def test_the_waits_are_counted_for_the_builds_last_line():
    from mobilebuild.engine.doit_reporters import waits

    measure_alone.take_waited()
    measurement = Holder("measure")
    assert measurement.entered.wait(WAIT)
    threading.Timer(0.5, measurement.release.set).start()
    with measure_alone.stage_running("quantize:mine"):  # waits for the measurement to end
        pass
    measurement.done()
    stage = Holder("stage")
    assert stage.entered.wait(WAIT)
    threading.Timer(0.5, stage.release.set).start()
    with measure_alone.measuring_alone("mine") as waited:  # waits for the stage to finish
        assert waited >= 0.4
        time.sleep(0.3)  # held alone
    stage.done()
    found = measure_alone.take_waited()
    assert found["stages"] >= 0.4 and found["measurements"] >= 0.4 and found["alone"] >= 0.3
    assert measure_alone.take_waited() == {"stages": 0.0, "measurements": 0.0, "alone": 0.0}
    assert waits({"stages": 12.3, "measurements": 45.6}) == ("measuring alone: stages waited 12 s in all for "
                                                            "measurements to end, measurements 46 s for running "
                                                            "stages to finish")
    assert waits({"stages": 0.2, "measurements": 0.3}) is None  # no line for a build nothing held up


@pytest.fixture
def reserved(monkeypatch):
    """The reserved-core policy, on this machine's highest core; the test process's affinity put back after."""
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("a core set aside needs another for the stages")
    monkeypatch.setenv(measure_alone.POLICY, "reserved-core")
    monkeypatch.setenv(measure_alone.RESERVED, str(max(before)))  # as the policy chooses; gone after the test
    assert measure_alone.reserved_core() == max(before)
    yield max(before)
    measure_alone._pinned(before)


def test_the_policy_follows_the_cores(monkeypatch):
    monkeypatch.delenv(measure_alone.POLICY)
    cores = os.sched_getaffinity(0)
    expected = max(cores) if len(cores) >= measure_alone.RESERVE_FROM else None
    assert measure_alone.reserved_core() == expected
    os.environ.pop(measure_alone.RESERVED, None)  # what it chose: gone, not put back


def test_a_reserved_core_measures_beside_running_stages_which_keep_off_it(reserved):
    stage = Holder("stage")
    assert stage.entered.wait(WAIT)
    before = os.sched_getaffinity(0)
    with measure_alone.measuring_alone("model"):  # the stage still runs: no wait for it
        assert os.sched_getaffinity(0) == {reserved}
        assert stage.process.is_alive()
    assert os.sched_getaffinity(0) == before
    assert measure_alone.isolation() == {"policy": "reserved core", "core": reserved}
    stage.done()
    with measure_alone.stage_running("quantize:mine"):
        assert reserved not in os.sched_getaffinity(0)
    # a measurement of several threads cannot fit the one core: it measures alone, as below RESERVE_FROM cores
    with measure_alone.measuring_alone("model", threads=2):
        assert os.sched_getaffinity(0) == before - {reserved}
    assert measure_alone.isolation() == {"policy": "alone"}


def test_measurements_on_the_reserved_core_take_turns(reserved, capfd):
    measurement = Holder("measure")
    assert measurement.entered.wait(WAIT)
    threading.Timer(0.5, measurement.release.set).start()
    with measure_alone.measuring_alone("mine"):
        assert measurement.release.is_set()  # the core was the other measurement's until it was released
    measurement.done()
    assert f"mine: waiting for the measurement on core {reserved} to end" in capfd.readouterr().err


@pytest.fixture
def impatient(monkeypatch):
    """A measurement that waits half a second for running stages, then clears a core of them; the test process's
    affinity put back after."""
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("clearing a core needs another for the stages")
    monkeypatch.setenv(measure_alone.PATIENCE, "0.5")
    yield max(before)
    measure_alone._pinned(before)


def test_a_measurement_clears_a_core_of_stages_that_run_past_its_patience(impatient, capfd):
    stage = Holder("stage")
    assert stage.entered.wait(WAIT)
    usable = os.sched_getaffinity(stage.process.pid)
    with measure_alone.measuring_alone("model") as waited:  # the stage still runs
        assert 0.4 <= waited < WAIT
        assert stage.process.is_alive()
        assert os.sched_getaffinity(0) == {impatient}
        assert os.sched_getaffinity(stage.process.pid) == usable - {impatient}  # it goes on on the others
        assert os.sched_getaffinity(stage.child.value) == usable - {impatient}  # and so does what it started
    assert os.sched_getaffinity(stage.process.pid) == usable  # the core given back
    assert measure_alone.isolation() == {"policy": "cleared core", "core": impatient, "cores": [impatient],
                                         "stages": 1}
    printed = capfd.readouterr().err
    assert "model: waiting for running stages to finish (benchmarks measure alone, 0 s at most)" in printed
    assert "model: a stage has run past 0 s: measuring on a core cleared of the running stages, which go on on the " \
        "others: quantize:other in " in printed
    stage.done()


def test_a_stage_that_has_run_past_the_patience_is_not_waited_for(impatient):
    stage = Holder("stage")
    assert stage.entered.wait(WAIT)
    time.sleep(1)  # it runs long already: a measurement would wait for it in vain
    with measure_alone.measuring_alone("model") as waited:
        assert waited < 0.4
        assert stage.process.is_alive()
    assert measure_alone.isolation()["policy"] == "cleared core"
    stage.done()


def test_stages_do_not_wait_behind_a_measurement_for_longer_than_its_patience(impatient):
    long_stage = Holder("stage")
    assert long_stage.entered.wait(WAIT)
    measurement = Holder("measure")  # waits for the long stage, holding off new ones: half a second at most
    late = Holder("stage")
    assert measurement.entered.wait(WAIT) and late.entered.wait(WAIT)
    assert long_stage.process.is_alive()
    assert impatient not in os.sched_getaffinity(late.process.pid)  # it started off the cleared core
    late.done()
    measurement.done()
    long_stage.done()


def test_a_measurement_of_as_many_threads_as_cores_still_waits_alone(impatient):
    stage = Holder("stage")
    assert stage.entered.wait(WAIT)
    threading.Timer(1.5, stage.release.set).start()
    with measure_alone.measuring_alone("model", threads=len(os.sched_getaffinity(0))) as waited:
        assert waited >= 1.0  # past its patience: no core to clear, it waited for the stage
        assert not stage.process.is_alive() or stage.release.is_set()
    assert measure_alone.isolation() == {"policy": "alone"}
    stage.done()
