"""Whole builds through real doit, interrupted, raced and moved: the artifacts always come out the same.

- A build killed at any moment (SIGKILL to doit's process group: its worker and benchmark processes die with it),
  from scratch or over the complete build of another version of the recipe, and run again gives the artifacts of
  an uninterrupted build, and records a state that the next run finds up to date: nothing half-written is taken
  as done. Two projects are killed side by side (one per core) to keep the 20 kill points affordable.
- Two builds started at once in one repository both succeed, one after the other.
- A parallel build (`doit -n 2`, processes) and a build in another checkout give the serial build's bytes.
- A build killed after writing an artifact of a changed recipe, then the change reverted, rebuilds that artifact
  (tasks.py NodeUpToDate: doit records a run's results only when it ends).
- The manifest of a parallel build records every result (it used to miss those that finished after it).

Artifacts are compared byte for byte, except the benchmark results and the manifest, whose timings legitimately
vary: those are compared with their timing numbers left out (what was timed, its hash and size, must still match).
Every run has the shared artifact cache switched off, so that each artifact is really rebuilt.
"""

import concurrent.futures
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import Project, tiny_recipe

from mobilebuild import store

pytestmark = pytest.mark.slow  # builds killed at seeded points, real doit

SEED = 20261122
KILL_POINTS = 20
LANES = 2  # projects killed side by side, one per core: 20 kill points in about half the time
# No shared artifact cache: every artifact is really built. Unbuffered: a killed build's log shows what it had begun.
ENV = {**os.environ, "MOBILEBUILD_CACHE": "off", "PYTHONUNBUFFERED": "1"}
RECIPE = "tiny"
# What a benchmark measures (and how long it waited to measure alone), and how long the per-layer comparison took;
# everything else in their results (the artifact's hash and size, the settings, the layers' errors) is stable.
TIMINGS = {"load_ms", "mean_ms", "median_ms", "p10_ms", "p90_ms", "stdev_ms", "peak_rss_mb", "speed_benchmark_line",
           "waited_for_stages_s", "alone_s", "seconds"}
TIMED_FILES = ("bench-*.json", "layers-*.json", "manifest.json")


# -- projects and builds -------------------------------------------------------------------------------------------

def new_project(root):
    project = Project(root)
    project.write_recipe(tiny_recipe(RECIPE))
    return project


def doit(root, *args):
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, env=ENV, capture_output=True, text=True,
                          check=False, timeout=600)


def executed(output):
    """The tasks a run executed, from the console reporter's `.  task` lines (`-- task` is up to date)."""
    return [line[3:] for line in output.splitlines() if line.startswith(".  ")]


def build(root, *args):
    """A build that must succeed; returns the tasks it executed."""
    result = doit(root, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return executed(result.stdout)


def timed_build(root):
    started = time.monotonic()
    build(root)
    return time.monotonic() - started


def assert_up_to_date(root):
    """A further run executes nothing: the state the build recorded is whole and matches the files."""
    assert build(root) == [], f"{root}: a run after a complete build executed tasks"


# -- fingerprints --------------------------------------------------------------------------------------------------

def sha256(path):
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def without_timings(value):
    if isinstance(value, dict):
        return {key: without_timings(item) for key, item in value.items() if key not in TIMINGS}
    if isinstance(value, list):
        return [without_timings(item) for item in value]
    return value


def fingerprint(root):
    """{file name: sha256} for every artifact of the recipe: of the bytes, or for benchmark results and the
    manifest, of their content without timings. Leftovers of interrupted writes are not artifacts."""
    prints = {}
    for path in sorted((root / "artifacts" / RECIPE).iterdir()):
        if store.TEMP_MARKER in path.name:
            continue
        if any(path.match(pattern) for pattern in TIMED_FILES):
            stable = json.dumps(without_timings(json.loads(path.read_text())), sort_keys=True)
            prints[path.name] = "timings left out: " + hashlib.sha256(stable.encode()).hexdigest()
        else:
            prints[path.name] = sha256(path)
    return prints


def exact_files(prints):
    return sum(not digest.startswith("timings") for digest in prints.values())


def differences(reference, prints):
    names = sorted(set(reference) | set(prints))
    return [name for name in names if reference.get(name) != prints.get(name)]


def assert_same_artifacts(reference, root, what):
    prints = fingerprint(root)
    assert not differences(reference, prints), f"{what}: artifacts differ: {differences(reference, prints)}"
    print(f"{what}: {exact_files(prints)} artifacts byte-identical, "
          f"{len(prints) - exact_files(prints)} results identical apart from timings")


def partial_files(root):
    return sorted(p.relative_to(root).as_posix() for p in (root / "artifacts").rglob(f"*{store.TEMP_MARKER}*"))


@pytest.fixture(scope="module")
def clean_build(tmp_path_factory):
    """An uninterrupted serial build from scratch: the reference every other build must reproduce."""
    root = tmp_path_factory.mktemp("reference")
    new_project(root)
    seconds = timed_build(root)
    prints = fingerprint(root)
    # checkpoint, fused, quantized, 2 scripted, 2 .ptl, 2 verify; 3 bench, the int8 target's layers and the manifest
    assert (exact_files(prints), len(prints) - exact_files(prints)) == (9, 5), prints
    print(f"\nclean build: {seconds:.1f} s, {len(prints)} artifacts")
    return root, prints


# -- killing builds ------------------------------------------------------------------------------------------------

def variant_recipe(variant):
    """Two versions of one recipe (0: conftest's). Batch-norm statistics estimated from another number of batches
    change every artifact, so switching rebuilds every task; both versions pass verification."""
    return tiny_recipe(RECIPE, model={"factory": "tinynet:make", "seed": 0, "batchnorm_stats": 2 + variant})


def clean(root):
    cleaned = doit(root, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (root / "artifacts").exists(), f"doit clean left {sorted((root / 'artifacts').rglob('*'))}"


def start_build(root, log):
    """A build in a process group of its own: its worker and benchmark processes are in the group too."""
    return subprocess.Popen([sys.executable, "-m", "doit"], cwd=root, env=ENV, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def kill_group(process):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 10
    while running_in_group(process.pid):
        assert time.monotonic() < deadline, "a process of the killed build (its worker, a benchmark) outlived it"
        time.sleep(0.05)


def running_in_group(group):
    """Processes of the group that are not zombies (orphans are reaped by init, or by nobody in some containers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, _, process_group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(process_group) == group and state not in "ZX":
                found.append(stat.parent.name)
    return found


def kill_after(root, delay, log):
    """SIGKILL a build after `delay` seconds. Returns the task it was running (None when the build finished first)
    and the seconds the build ran."""
    started = time.monotonic()
    with open(log, "w") as output:
        process = start_build(root, output)
        try:
            process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            kill_group(process)
    elapsed = time.monotonic() - started
    if process.returncode == 0:
        return None, elapsed
    assert process.returncode == -signal.SIGKILL, log.read_text()
    begun = executed(log.read_text())
    return (begun[-1] if begun else "(loading tasks)"), elapsed


def kill_when_started(root, task, log):
    """SIGKILL a build as soon as it starts `task` (the reporter prints `.  task` once the tasks before it are
    done)."""
    with open(log, "w") as output:
        process = start_build(root, output)
        while f".  {task}\n" not in log.read_text():
            assert process.poll() is None, f"the build ended before {task}: {log.read_text()}"
            time.sleep(0.01)
        kill_group(process)


def kill_cycle(project, variant, from_scratch, delay, reference):
    """Build a version of the recipe, from scratch (after `doit clean`) or over the other version's complete build
    (every old artifact and its recorded state in place); kill it after `delay` s; build again from what the kill
    left and compare with `reference`; a third run must execute nothing."""
    root = project.root
    if from_scratch:
        clean(root)
    project.write_recipe(variant_recipe(variant))
    earlier = set(partial_files(root))
    running, elapsed = kill_after(root, delay, root.parent / f"{root.name}-killed.log")
    left_behind = set(partial_files(root)) - earlier
    started = time.monotonic()
    recovery = doit(root)
    point = {"delay": delay, "mode": "from scratch" if from_scratch else "over the other version's build",
             "running": running, "elapsed": elapsed, "recovery_s": time.monotonic() - started,
             "rebuilt": executed(recovery.stdout), "partials": len(left_behind),
             "lingering": len(left_behind & set(partial_files(root))), "compared": len(reference),
             "problem": None}
    if recovery.returncode != 0:
        point["problem"] = f"the build after the kill failed: {recovery.stdout[-2000:]}{recovery.stderr[-2000:]}"
    elif changed := differences(reference, fingerprint(root)):
        point["problem"] = f"artifacts differ from the clean build's: {changed}"
    elif (again := executed(doit(root).stdout)) != []:
        point["problem"] = f"a third run executed {again}"
    return point


def kill_lane(root, fractions, reference):
    """One project: a timed clean build of the recipe's version 1 (`reference`: version 0's), then kills at the
    given fractions of the build's time: in turn from scratch, and over the complete build of the other version."""
    project = new_project(root)
    project.write_recipe(variant_recipe(1))
    started = time.monotonic()
    every_task = build(root)
    seconds = time.monotonic() - started
    references = {0: reference, 1: fingerprint(root)}
    assert_up_to_date(root)
    assert references[0]["tiny-xnnpack.ptl"] != references[1]["tiny-xnnpack.ptl"]
    duration, points, variant = seconds, [], 1
    for cycle, fraction in enumerate(fractions):
        from_scratch = cycle % 2 == 0
        # From scratch, the version built last: its recorded state matches, so only what the kill lost is rebuilt.
        variant = variant if from_scratch else 1 - variant
        point = kill_cycle(project, variant, from_scratch, fraction * duration, references[variant])
        points.append(point)
        # The machine's load drifts: re-time the build whenever a run was a whole build from the start.
        if point["running"] is None:
            duration = point["elapsed"]
        elif len(point["rebuilt"]) == len(every_task):
            duration = point["recovery_s"]
    return seconds, points


def kill_fractions():
    """One seeded random moment in each twentieth of the build, so the kills cover it from start to end."""
    rng = random.Random(SEED)
    return [(k + rng.random()) / KILL_POINTS for k in range(KILL_POINTS)]


def describe(points):
    killed = [p for p in points if p["running"] is not None]
    stages = Counter(p["running"].split(":")[0] for p in killed)
    print(f"kill points: {len(points)}, survived {sum(p['problem'] is None for p in points)}; "
          f"{len(killed)} interrupted a build, {len(points) - len(killed)} came after it finished")
    print(f"running when killed: {dict(sorted(stages.items()))}")
    print(f"partial files left by kills: {sum(p['partials'] for p in points)} (never taken as artifacts; "
          f"{sum(p['lingering'] for p in points)} still there after the next build, until `doit clean`); "
          f"tasks rebuilt after kills: {sum(len(p['rebuilt']) for p in points)}; "
          f"hash comparisons after kills: {sum(p['compared'] for p in points)}")
    for point in points:
        moment = f"during {point['running']}" if point["running"] else "after the build had finished"
        print(f"  kill at {point['delay']:5.2f} s {moment} ({point['mode']}): {point['partials']} partial file(s) "
              f"left, {len(point['rebuilt'])} task(s) rebuilt, {point['problem'] or 'same artifacts'}")


def test_a_build_killed_at_any_moment_then_run_again_gives_the_clean_builds_artifacts(tmp_path, clean_build):
    """20 seeded kill points spread over the build; after each, a rebuild from what the kill left must give the
    clean build's artifacts, and a third run must find everything up to date."""
    fractions = kill_fractions()
    lanes = [(tmp_path / f"lane{lane}" / "project", fractions[lane::LANES]) for lane in range(LANES)]
    with concurrent.futures.ThreadPoolExecutor(LANES) as pool:
        results = list(pool.map(lambda lane: kill_lane(*lane, clean_build[1]), lanes))
    points = sorted((p for _, lane_points in results for p in lane_points), key=lambda p: p["delay"])
    timings = ", ".join(f"{seconds:.1f} s" for seconds, _ in results)
    print(f"\nclean builds of version 1 ({LANES} projects side by side): {timings}")
    describe(points)
    assert [p for p in points if p["problem"]] == []
    assert len(points) == KILL_POINTS
    assert sum(p["running"] is not None for p in points) >= KILL_POINTS // 2  # most kills hit a running build


def test_a_killed_build_of_a_change_then_the_change_reverted_gives_the_reverted_recipes_artifacts(tmp_path,
                                                                                                  clean_build):
    project = new_project(tmp_path)  # version 0 of the recipe: the clean build's
    build(tmp_path)
    project.write_recipe(variant_recipe(1))
    kill_when_started(tmp_path, "fuse:tiny", tmp_path / "killed.log")  # version 1's checkpoint.pt is in place
    project.write_recipe(variant_recipe(0))
    build(tmp_path, "fuse:tiny")
    reference = clean_build[1]
    built = {name: sha256(tmp_path / "artifacts" / RECIPE / name) for name in ("checkpoint.pt", "fused.pt")}
    assert built == {name: reference[name] for name in built}, "version 1's weights survived the revert"


# -- concurrent, parallel, elsewhere -------------------------------------------------------------------------------

def test_two_builds_at_once_both_succeed_one_after_the_other(tmp_path, clean_build):
    new_project(tmp_path)
    command = [sys.executable, "-m", "doit"]
    processes = [subprocess.Popen(command, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert sum("another build is running in this repository" in err for _, err in outputs) == 1, outputs
    ran = [executed(out) for out, _ in outputs]
    assert sorted(len(tasks) == 0 for tasks in ran) == [False, True], ran  # the waiting build found it all done
    assert_up_to_date(tmp_path)
    print()
    assert_same_artifacts(clean_build[1], tmp_path, "two builds at once")


@pytest.fixture(scope="module")
def parallel_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    new_project(root)
    assert len(build(root, "-n", "2", "-P", "process")) > 10
    return root


def test_a_parallel_build_gives_the_serial_builds_bytes(parallel_build, clean_build):
    reference = {name: digest for name, digest in clean_build[1].items() if name != "manifest.json"}
    prints = {name: digest for name, digest in fingerprint(parallel_build).items() if name != "manifest.json"}
    assert not differences(reference, prints), f"artifacts differ: {differences(reference, prints)}"
    print(f"\ndoit -n 2: {exact_files(prints)} artifacts byte-identical, "
          f"{len(prints) - exact_files(prints)} results identical apart from timings (manifest aside)")


def test_a_parallel_build_records_every_result_in_the_manifest(parallel_build, clean_build):
    manifest = json.loads((parallel_build / "artifacts" / RECIPE / "manifest.json").read_text())
    assert sorted(manifest["benchmarks"]) == ["eager", "qnnpack", "xnnpack"]
    assert sorted(manifest["verification"]) == ["qnnpack", "xnnpack"]
    assert_same_artifacts(clean_build[1], parallel_build, "doit -n 2, manifest included")
    assert_up_to_date(parallel_build)


def test_two_checkouts_at_different_paths_give_the_same_bytes(tmp_path, clean_build):
    first, reference = clean_build
    elsewhere = tmp_path / "a-second-checkout" / "somewhere-deeper"
    shutil.copytree(first, elsewhere, ignore=shutil.ignore_patterns("artifacts", ".doit.db*", ".mobilebuild",
                                                                    "__pycache__"))
    assert len(build(elsewhere)) > 10
    print()
    assert_same_artifacts(reference, elsewhere, f"checkout at {elsewhere} vs {first}")
