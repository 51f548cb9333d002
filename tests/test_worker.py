"""The stage worker: what a stage computes must not depend on the machine it runs on."""

import yaml
from conftest import REPO, checkouts


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
