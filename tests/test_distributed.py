"""`mobilebuild build --dask`: stages on the workers of a real LocalCluster (worker processes), files through the
shared artifact cache, the same bytes and the same one-line errors as a local build."""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import Project, checkouts, tiny_recipe

pytestmark = pytest.mark.slow  # a Dask cluster

distributed = pytest.importorskip("distributed")

COMPARED = ("fused.pt", "quantized-qnnpack.pt", "scripted-fp32.pt", "tiny-xnnpack.ptl", "tiny-qnnpack.ptl",
            "verify-xnnpack.json", "verify-qnnpack.json")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as local, distributed.Client(local) as client:
        client.get_task_stream()  # registers the scheduler's task-stream plugin: it records from then on
        yield local.scheduler_address, client


def mobilebuild(root, *args, env):
    return subprocess.run([sys.executable, "-m", "mobilebuild.cli", *args], cwd=root, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=900)


def digests(project):
    return {name: hashlib.sha256(project.artifact(f"tiny/{name}").read_bytes()).hexdigest() for name in COMPARED}


def test_a_build_on_dask_workers_gives_the_bytes_of_a_local_build(cluster, tmp_path):
    address, client = cluster
    on_dask, local = checkouts(tmp_path, "a", "b")
    started = time.time()

    # doit runs in threads there, and its output capture did not survive them: `-r json` printed nothing, exit 3
    result = mobilebuild(on_dask.root, "build", "--dask", address, "-r", "json",
                         env={"MOBILEBUILD_CACHE": str(tmp_path / "c")})

    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert {task["result"] for task in report["tasks"]} == {"success"}
    assert "artifacts/tiny/tiny-qnnpack.ptl (" in report["out"]
    ran = {task["key"].split("-")[0] for task in client.get_task_stream(start=started)}
    assert {"checkpoint:tiny", "fuse:tiny", "optimize:tiny", "verify:tiny", "bench:tiny"} <= ran
    assert on_dask.artifact("tiny/manifest.json").is_file() and (on_dask.root / "artifacts/report.html").is_file()
    assert local.run(env={"MOBILEBUILD_CACHE": "off"}).returncode == 0
    assert digests(on_dask) == digests(local)
    # doit keeps the graph: nothing left to do, and nothing sent to the cluster
    again = time.time()
    assert mobilebuild(on_dask.root, "build", "--dask", address, env={"MOBILEBUILD_CACHE": str(tmp_path / "c")}
                       ).returncode == 0
    assert not client.get_task_stream(start=again)


def test_a_user_error_on_a_worker_is_the_same_one_line(cluster, tmp_path):
    address, _ = cluster
    project = Project(tmp_path)
    (project.root / "broken.py").write_text("def make():\n    raise ValueError('no such width')\n")
    project.write_recipe(tiny_recipe("bad", model={"factory": "broken:make", "seed": 0}))

    result = mobilebuild(project.root, "build", "--dask", address, env={"MOBILEBUILD_CACHE": str(tmp_path / "c")})

    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
    assert errors == ["ERROR: checkpoint:bad: recipes/bad.yaml: model.factory: "
                      "broken:make(**kwargs) raised ValueError: no such width"], result.stderr


def test_a_library_failure_and_a_time_limit_on_a_worker_are_the_same_one_lines(cluster, tmp_path):
    """A library failing inside a stage on a Dask worker: the line and the log of a local build (written by the
    build, from the worker's reply); a stage past its limit there: stopped on the worker, the same line."""
    from test_stage_failures import IGNORING, MODELS
    from test_time_limits import SLOW

    address, _ = cluster
    project = Project(tmp_path)
    (project.root / "failing.py").write_text(MODELS)
    (project.root / "slow.py").write_text(SLOW)
    project.write_recipe(IGNORING)
    project.write_recipe({"name": "slow", "model": {"factory": "slow:make"}, "input": {"shape": [1, 8]},
                          "limits": {"stage_seconds": 5}, "targets": [{"backend": "xnnpack"}]})

    result = mobilebuild(project.root, "build", "--dask", address, "checkpoint", "script",
                         env={"MOBILEBUILD_CACHE": str(tmp_path / "c")})

    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    errors = sorted(line for line in result.stderr.splitlines() if line.startswith("ERROR"))
    assert len(errors) == 2, result.stderr
    assert errors[0] == ("ERROR: checkpoint:slow: recipes/slow.yaml: stopped after 5 s: the stage's time limit "
                         "(limits.stage_seconds); nothing was written")
    assert errors[1].startswith("ERROR: script:ign-fp32: recipes/ign.yaml: torch failed: RuntimeError: Could not "
                                "export Python function call '_forward_cross_attn'.")
    assert errors[1].endswith("(traceback: .mobilebuild/logs/script/ign-fp32.log)")
    assert "Traceback" in (project.root / ".mobilebuild/logs/script/ign-fp32.log").read_text()


def test_dask_without_the_cache_is_refused_in_one_line(cluster, tmp_path):
    address, _ = cluster
    project = Project(tmp_path)
    project.write_recipe(tiny_recipe())
    result = mobilebuild(project.root, "build", "--dask", address, "checkpoint", env={"MOBILEBUILD_CACHE": "off"})
    assert result.returncode != 0
    assert "moves files through the shared artifact cache, which is off" in result.stderr
    assert not project.artifact("tiny/checkpoint.pt").exists()


def test_on_dask_a_poisoned_cache_runs_nothing_on_the_build_or_the_workers(cluster, tmp_path):
    from test_shared_cache import poison_every_entry

    address, _ = cluster
    shared = tmp_path / "c"
    first, second = checkouts(tmp_path, "a", "b")
    assert mobilebuild(first.root, "build", "--dask", address, env={"MOBILEBUILD_CACHE": str(shared)}).returncode == 0
    marker = tmp_path / "the-payload-ran"
    assert poison_every_entry(shared, first, marker, tmp_path)
    # and the model's source, which a Dask build stores under its own sha256 for the workers to import
    digest = hashlib.sha256((first.root / "tinynet.py").read_bytes()).hexdigest()
    source = f"import os\nos.system('touch {marker}')\n".encode()
    entry = shared / "v1" / digest[:2] / digest
    (entry / "blob").write_bytes(source)
    (entry / "entry.json").write_text(json.dumps({"files": {"blob": {
        "sha256": hashlib.sha256(source).hexdigest(), "bytes": len(source)}}, "meta": {}, "created": 0}))

    refused = mobilebuild(second.root, "build", "--dask", address, env={"MOBILEBUILD_CACHE": str(shared)})
    again = mobilebuild(second.root, "build", "--dask", address, env={"MOBILEBUILD_CACHE": str(shared)})

    assert not marker.exists()
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("ERROR")]
    assert error.startswith("ERROR: checkpoint:tiny: ")
    assert error.endswith(f"tinynet.py: its entry {digest[:16]} in the artifact cache at {shared} was refused "
                          "(content differs from its key) and removed; run the build again")
    assert again.returncode == 0, again.stderr
    assert digests(second) == digests(first)


def dies_on_first_attempt(marker, *args):
    """A Dask task whose worker process dies the first time it runs it, mid-task."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)
    from mobilebuild.engine import distributed as remote

    return remote.build_on_worker(*args)


def test_a_worker_lost_mid_task_is_rerun_and_nothing_half_stored(cluster, tmp_path, monkeypatch):
    import cloudpickle

    from mobilebuild.engine import distributed as remote
    from mobilebuild.engine import execute
    from mobilebuild.plan import graph, recipe

    address, client = cluster
    project, reference = checkouts(tmp_path, "a", "b")
    assert project.run("checkpoint", env={"MOBILEBUILD_CACHE": "off"}).returncode == 0
    assert reference.run("fuse", env={"MOBILEBUILD_CACHE": "off"}).returncode == 0

    monkeypatch.chdir(project.root)
    monkeypatch.setenv("MOBILEBUILD_CACHE", str(tmp_path / "c"))
    monkeypatch.setenv(remote.ADDRESS_VARIABLE, address)
    execute.shared_cache.cache_clear()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marker = str(tmp_path / "died-once")
    monkeypatch.setattr(remote, "build_on_worker", lambda *args: dies_on_first_attempt(marker, *args))
    node = next(n for n in graph.build(recipe.load_all(project.root), project.root) if n.task_name == "fuse:tiny")
    shared, key = execute._cache_entry(node)

    reply = remote.run_remote(node, execute.request(node, node.output), shared, key)

    assert os.path.exists(marker), "the first attempt did not run"
    assert not set(reply) & {"error", "oserror", "crash"}, reply
    fetched = tmp_path / "fetched.pt"
    assert shared.fetch(key, {"artifact": fetched}) is not None
    assert fetched.read_bytes() == reference.artifact("tiny/fused.pt").read_bytes()
    execute.shared_cache.cache_clear()


def _stage_for(seconds):
    from mobilebuild.worker import measure_alone

    with measure_alone.stage_running("quantize:on-a-worker"):
        time.sleep(seconds)
    return os.getpid()


def _measurement_after(delay):
    from mobilebuild.worker import measure_alone

    time.sleep(delay)  # the other worker's stage is running by now
    with measure_alone.measuring_alone("bench:on-a-worker") as waited:
        return os.getpid(), waited, measure_alone.isolation()


def test_dask_workers_on_one_machine_share_the_measuring_policy(cluster):
    """A measurement on one worker process waits for a stage running on another (below 4 cores; where a core is
    reserved for it, it measures on that core at once): the lock files are the host's, not the process's."""
    _, client = cluster
    client.wait_for_workers(2, timeout=120)  # a test before lost one on purpose: its nanny starts it again
    workers = sorted(client.scheduler_info()["workers"])
    stage = client.submit(_stage_for, 3.0, workers=[workers[0]], pure=False)
    measurement = client.submit(_measurement_after, 1.0, workers=[workers[1]], pure=False)
    (measured_in, waited, taken), staged_in = measurement.result(timeout=120), stage.result(timeout=120)
    assert measured_in != staged_in
    if taken["policy"] == "alone":
        assert waited >= 1.5  # the stage's remaining 2 s, less the start-up of a loaded machine
    else:
        assert taken["policy"] == "reserved core" and waited < 1.5
