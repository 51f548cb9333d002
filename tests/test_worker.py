"""The stage worker: what a stage computes must not depend on the machine it runs on."""

import pytest
import yaml
from conftest import REPO, checkouts


@pytest.mark.slow
def test_artifacts_do_not_depend_on_the_hosts_thread_count(tmp_path):
    """Batch-norm statistics over 224x224 activations are reductions torch splits across its threads; with a thread
    per core they rounded differently on machines with different core counts. OMP_NUM_THREADS stands in for the
    core count here: it is what torch sizes its thread pool by."""
    recipe = yaml.safe_load((REPO / "recipes" / "perf_recipe.yaml").read_text())
    one_core, four_cores = checkouts(tmp_path, "one", "four", recipe=recipe)
    for project, threads in ((one_core, "1"), (four_cores, "4")):
        result = project.run("checkpoint:perf_recipe", env={"OMP_NUM_THREADS": threads, "MOBILEBUILD_CACHE": "off"})
        assert result.returncode == 0, result.stderr
    built = [p.artifact("perf_recipe/checkpoint.pt").read_bytes() for p in (one_core, four_cores)]
    assert built[0] == built[1]


@pytest.mark.slow  # a stage worker of its own (torch, ExecuTorch and coremltools imported) and a Core ML lowering
def test_the_worker_ends_without_leaving_core_mls_temporary_packages(tmp_path, monkeypatch):
    """The worker skips the interpreter's slow teardown at exit, but not what libraries registered to run then:
    coremltools removes the temporary .mlpackage of every model it converted."""
    import torch
    from torch import nn

    from mobilebuild.engine import worker_pool
    from mobilebuild.plan import stages
    from mobilebuild.routes.executorch import plan as executorch

    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    worker_pool.close_all()  # a worker an earlier test left has the TMPDIR it started with
    (tmp_path / "convrelu.py").write_text("from torch import nn\n\n\ndef make():\n"
                                          "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())\n")
    torch.save(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).state_dict(), tmp_path / "model.pt")
    config = stages.as_json(executorch.LowerConfig(precision="fp32", delegate="coreml", options={}, inputs=[{
        "name": "input", "shape": [1, 3, 8, 8], "dtype": "float32", "memory_format": "contiguous"}],
        model={"factory": "convrelu:make"}, fuse=False))
    reply = worker_pool.call({"stage": "lower", "module": "mobilebuild.routes.executorch.worker.lower",
                              "measures": False,
                              "config_type": stages.type_path(executorch.LowerConfig),
                              "inputs": {"model": str(tmp_path / "model.pt")}, "config": config,
                              "output": str(tmp_path / "model.pte"), "root": str(tmp_path)})
    assert set(reply) - {"waited", "peak_rss_mb"} == {"printed"}, reply
    assert (tmp_path / "model.pte").stat().st_size > 1000
    assert list(private_tmp.rglob("*.mlpackage")), "the lowering left no package for the exit to remove"
    worker_pool.close_all()
    assert not list(private_tmp.rglob("*.mlpackage"))


def test_operators_torchscript_knows_by_address_stay_alive():
    """torch replaces an operator's object when a library adds an overload; freed, its address was reused by a
    Conv2d's padding tuple, which then compiled as that operator ("builtin cannot be used as a value")."""
    import gc
    import weakref

    import torch

    from mobilebuild.worker import reproducible  # keeps them alive from its import on

    def operator(x):
        return x

    registered = weakref.ref(operator)
    torch.jit._builtins._register_builtin(operator, "aten::relu")
    del operator
    gc.collect()
    assert registered() is not None
    packet = torch.ops.aten.relu  # looked up before the worker's first stage, or after: either way alive
    assert any(kept is packet._op for kept in reproducible._registered_builtins)


def test_a_killed_builds_list_of_shown_warnings_is_removed_by_the_next_build(tmp_path, monkeypatch):
    """A build that is killed never runs the `finally` that removes its list: the next one removes the lists of
    processes that are gone, and keeps those of running builds."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    from mobilebuild.worker import quiet

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free: no process has it (pids are not reused this soon)
    stale = tmp_path / f"{quiet.WARNINGS_LIST}{gone.pid}-abc123"
    running = tmp_path / f"{quiet.WARNINGS_LIST}{os.getppid()}-def456"
    stale.write_text("")
    running.write_text("")
    with quiet.shown_warnings_list():
        mine = Path(os.environ[quiet.SHOWN_WARNINGS])
        assert mine.parent == tmp_path and mine.name.startswith(f"{quiet.WARNINGS_LIST}{os.getpid()}-")
        assert not stale.exists() and running.exists()
    assert not mine.exists()
