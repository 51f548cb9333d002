"""Node actions on Dask workers; doit keeps the graph and the up-to-date checks (`mobilebuild build --dask ADDR`).

Files travel through the shared artifact cache (cache.py), so workers need no shared disk: the build publishes a
node's input files there under their sha256, the worker fetches them into a scratch folder laid out like the
repository, runs the stage in its own stage worker (build/worker_pool.py: the same reproducible process as a local
build), and publishes the output under the node's cache key, which the build then fetches. A user error comes back
as the same reply a local stage worker gives; a worker lost mid-task is Dask's to re-run elsewhere, and since an entry
is published only once complete, nothing half-built is ever fetched.

No dask import until a build asks for it: the task layer must stay fast.
"""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from mobilebuild.errors import MobileBuildError

ADDRESS_VARIABLE = "MOBILEBUILD_DASK"  # set by `mobilebuild build --dask`; read by every doit process and thread

_clients = {}


def address():
    return os.environ.get(ADDRESS_VARIABLE) or None


@contextmanager
def cluster(at):
    """The Dask scheduler at `at`, or a LocalCluster of one worker process per core (`local`), named in the
    environment for the build's nodes while the block runs; yields how many worker threads it has (at least 1)."""
    try:
        from distributed import Client, LocalCluster
    except ModuleNotFoundError:
        raise MobileBuildError("--dask needs Dask, which is not installed here: pip install 'mobilebuild[dask]'") \
            from None

    local = None
    if at == "local":
        local = LocalCluster(n_workers=os.cpu_count(), threads_per_worker=1, processes=True, dashboard_address=None)
        at = local.scheduler_address
    os.environ[ADDRESS_VARIABLE] = at
    try:
        with Client(at) as scheduler:
            slots = sum(scheduler.nthreads().values())
        yield max(slots, 1)
    finally:
        os.environ.pop(ADDRESS_VARIABLE, None)
        if local is not None:
            local.close()


def client():
    """One client per process (doit's threads share it) for the scheduler named in the environment."""
    from distributed import Client

    found = _clients.get(os.getpid())
    if found is None:
        found = _clients[os.getpid()] = Client(address(), set_as_default=False)
    return found


def run_remote(node, request, shared, key, python=None, timeout=None):
    """Build `node` (the stage worker's `request` for it) on a Dask worker; return the stage worker's reply, which
    execute.py reads as for a local run. On success the output is in the cache under `key`. Past `timeout` seconds
    the stage worker there is stopped (worker_pool.StageStopped comes back)."""
    from mobilebuild import store

    files = {}
    for path in [*node.inputs.values(), *node.files]:
        digest = store.sha256_file(path)
        shared.store(digest, {"blob": Path(path)})  # nothing when there (a signing cache replaces an untrusted one)
        files[path] = digest
    future = client().submit(build_on_worker, request, files, shared.url, key, python, timeout,
                             key=f"{node.task_name}-{key[:16]}", pure=False)
    return future.result()


def build_on_worker(request, files, cache_url, key, python=None, timeout=None):
    """On a Dask worker: fetch the inputs into a scratch repository, run the stage, publish the output. The cache's
    keys come from the worker's own environment (MOBILEBUILD_CACHE_SIGNING_KEY, MOBILEBUILD_CACHE_TRUSTED_KEYS), never
    through the scheduler."""
    from mobilebuild.engine import cache, worker_pool

    shared = cache.Cache(cache_url, **cache.keys_from_environment())
    if not shared.writes:  # its output could not be published, and the build would wait for it in vain
        return {"error": {"message": f"a Dask worker cannot publish to the artifact cache at {shared.location}: it "
                                     f"checks signatures ({cache.TRUSTED_KEYS_VARIABLE}) but has no "
                                     f"{cache.SIGNING_KEY_VARIABLE}, or is read-only", "field": None, "file": None},
                "printed": ""}
    scratch = Path(tempfile.mkdtemp(prefix="mobilebuild-"))
    try:
        for path, digest in files.items():
            try:
                problem = None if shared.fetch_blob(digest, scratch / path) else "is missing"
            except cache.Untrusted as exc:  # and removed: the next build uploads it again
                problem = f"was refused ({exc}) and removed; run the build again"
            if problem:
                return {"error": {"message": f"{path}: its entry {digest[:16]} in the artifact cache at "
                                             f"{shared.location} {problem}", "field": None, "file": None},
                        "printed": ""}
        output = scratch / request["output"]
        output.parent.mkdir(parents=True, exist_ok=True)
        reply = worker_pool.call({**request, "root": str(scratch),
                             "output": str(output.with_name(f".{output.name}.partial"))}, python, timeout)
        if set(reply) & {"error", "oserror", "failure", "crash"}:
            return reply
        os.replace(output.with_name(f".{output.name}.partial"), output)
        shared.store(key, {"artifact": output})
        return reply
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
