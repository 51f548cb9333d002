"""benchmarks/replay.py: the node times a build records, and their replay under each measuring policy on graphs whose
makespans can be worked out by hand. No torch."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mobilebuild.engine import node_times

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def replay():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("replay", BENCHMARKS / "replay.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


def convoy(replay):
    """Two independent chains: a 10 s stage, then its 1 s benchmark (all alone); and four 10 s stages in a row."""
    jobs = [replay.Job("a", (), 10.0), replay.Job("bench:a", ("a",), 1.0, 1.0, measures=True),
            replay.Job("b1", (), 10.0)]
    jobs += [replay.Job(f"b{index}", (f"b{index - 1}",), 10.0) for index in range(2, 5)]
    return {job.name: job for job in jobs}


def test_without_measurements_every_policy_is_list_scheduling(replay):
    jobs = {job.name: job for job in (replay.Job("a", (), 3.0), replay.Job("b", (), 2.0),
                                      replay.Job("c", ("a", "b"), 1.0))}
    assert replay.critical_path(jobs) == 4.0
    for policy in ("alone", "stages first"):
        assert replay.simulate(jobs, 1, policy) == 6.0
        assert replay.simulate(jobs, 2, policy) == 4.0
    assert replay.simulate(jobs, 2, "reserved core") == 6.0  # one of the two cores waits for measurements


def test_a_measurement_alone_waits_for_running_stages_and_holds_new_ones(replay):
    jobs = convoy(replay)
    # alone: at 10 s a and b1 end; the benchmark runs alone 10-11 s (b2 waits), then b2..b4: 11 + 30
    assert replay.simulate(jobs, 2, "alone") == pytest.approx(41.0)
    # stages first: b2 starts at 10 s; the benchmark waits for an idle moment: after b4, at 40 s
    assert replay.simulate(jobs, 2, "stages first") == pytest.approx(41.0)
    # reserved core: one lane for stages (a, b1..b4 = 50 s), the benchmark on the other at 10-11 s
    assert replay.simulate(jobs, 2, "reserved core") == pytest.approx(50.0)
    assert replay.simulate(jobs, 3, "reserved core") == pytest.approx(40.0)
    assert replay.simulate(jobs, 1, "reserved core") == replay.simulate(jobs, 1, "alone") == pytest.approx(51.0)


def test_a_waiting_benchmark_stops_stages_that_could_have_run(replay):
    """Today's convoy: while a benchmark waits for a long stage, the stages that got a worker wait with it."""
    jobs = [replay.Job("long", (), 30.0), replay.Job("short", (), 1.0),
            replay.Job("bench:short", ("short",), 1.0, 1.0, measures=True)]
    jobs += [replay.Job(f"c{index}", (), 5.0) for index in range(4)]
    jobs = {job.name: job for job in jobs}
    # 4 workers: long, short, c0, c1 start; at 1 s the benchmark waits for long (30 s); c2, c3 got workers at 5 s
    # and wait too; after the 1 s measurement at 30-31 s they run: 36 s. Stages first: the c's are done by 10 s and
    # the measurement runs when long ends, at 30-31 s.
    assert replay.simulate(jobs, 4, "alone") == pytest.approx(36.0)
    assert replay.simulate(jobs, 4, "stages first") == pytest.approx(31.0)


def test_the_record_keeps_each_tasks_newest_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    node_times.note("lower:a", 100.0, {"stages": 1.5, "measurements": 0.0})
    node_times.note("lower:a", 200.0, None, 812.5)
    node_times.note("bench:a", 300.0, {"measurements": 2.0, "alone": 0.5})
    found = node_times.read()
    assert found["lower:a"]["started"] == 200.0 and "stages" not in found["lower:a"]
    assert found["lower:a"]["peak_rss_mb"] == 812.5 and "peak_rss_mb" not in found["bench:a"]
    assert found["bench:a"]["alone"] == 0.5 and found["bench:a"]["ended"] >= 300.0
    lines = Path(node_times.RECORD).read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["task"] for line in lines)
