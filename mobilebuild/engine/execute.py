"""Running one graph node: the stage function behind it, an atomic output, user errors as one line.

Imported by the task layer, so it must not import torch itself: stage modules are imported when a node runs.
"""

import contextlib
import functools
import importlib
import json
import os
import sys
import time
from pathlib import Path

from doit.exceptions import TaskFailed

from mobilebuild import store
from mobilebuild.engine import distributed, node_times, worker_pool
from mobilebuild.errors import MobileBuildError, few
from mobilebuild.plan import stages

UNTRUSTED_LOG = ".mobilebuild/cache-untrusted.jsonl"  # this build's ignored cache entries, summed up at its end
LOG_DIR = ".mobilebuild/logs"  # a failed node's traceback: <stage>/<name>.log (ignored; `doit clean` removes it)
# The value a node's task keeps (doit's task.values, from what its action returns) when the shared cache gave its
# output: how an in-process run (engine/runner.py) tells a fetched artifact from a built one.
FROM_CACHE = "from_cache"
# ... and how long the stage waited for measurements, or its measurement for stages (worker/measure_alone.py), which
# the build's reporter adds up
WAITED = "waited"


def run_node(node):
    """Build one node, or fetch it from the shared cache (then return {FROM_CACHE: True}, which doit keeps as the
    task's values); return doit's TaskFailed (rendered as a single line) for a user mistake. A node built here goes
    to the record of node times (node_times)."""
    started, started_at = time.perf_counter(), time.time()
    try:
        shared, key = _cache_entry(node)
    except MobileBuildError as exc:  # a cache key that cannot be read
        return TaskFailed(str(exc))
    if key is not None and _fetch(node, shared, key):
        log_path(node).unlink(missing_ok=True)
        print(f"   {node.output} (from the cache)", flush=True)
        return {FROM_CACHE: True}
    if node.not_installed:  # its route family's or model library's packages: one line naming the extra
        return TaskFailed(f"{node.recipe_file}: {node.not_installed}")
    remote = distributed.address() is not None and not stages.get(node.stage).in_process
    try:
        if remote:
            reply = _build_remotely(node, shared, key)
        else:
            with store.atomic_output(node.output) as tmp:
                reply = _run_stage(node, tmp)
    except MobileBuildError as exc:
        exc.field = recipe_field(exc.field, node.fields)
        return TaskFailed(str(exc.located(node.recipe_file)))
    except OSError as exc:  # a full disk, a file-size limit, a read-only artifacts folder: the machine, not the recipe
        return TaskFailed(_os_problem(exc, node.output))
    except LibraryFailed as exc:
        return TaskFailed(_library_problem(node, exc.failure))
    except worker_pool.StageStopped as exc:
        field = f"limits.{stages.get(node.stage).limit}"
        return TaskFailed(f"{node.recipe_file}: stopped after {exc.seconds:g} s: the stage's time limit ({field}); "
                          "nothing was written")
    except worker_pool.WorkerDied as exc:
        return TaskFailed(f"{node.recipe_file}: {node.task_name}: {exc}; nothing was written")
    log_path(node).unlink(missing_ok=True)  # an earlier failure's traceback: not this node's any more
    size = os.path.getsize(node.output)
    print(f"   {node.output} ({size / 1e6:.2f} MB, {time.perf_counter() - started:.1f} s)", flush=True)
    if key is not None and not remote:  # a Dask worker has stored it
        with contextlib.suppress(OSError):  # an unwritable cache costs the next build time, never this one
            shared.store(key, {"artifact": Path(node.output)})
    waited = reply.get(WAITED)
    node_times.note(node.task_name, started_at, waited, reply.get("peak_rss_mb"))
    return {WAITED: waited} if any((waited or {}).values()) else None


@functools.cache
def shared_cache():
    """The shared artifact cache ($MOBILEBUILD_CACHE, by default a folder in the user's cache directory), or None
    when it is off."""
    from mobilebuild.engine import cache  # fsspec: only when something is built

    return cache.from_environment()


def _fetch(node, shared, key):
    """Whether the node's output came from the cache. An entry the cache's reader does not trust (not signed by a
    trusted key while keys are set; a file that is not what the stage makes) is noted for the build's summary and
    rebuilt."""
    from mobilebuild.engine import cache, fetched

    form = stages.get(node.stage).form
    try:
        return shared.fetch(key, {"artifact": Path(node.output)},
                            check=(lambda name, path: fetched.problem(path, form)) if form else None) is not None
    except cache.Untrusted as exc:
        note_untrusted(node.task_name, str(exc))
        return False


def note_untrusted(task, reason):
    """Record an ignored cache entry; the build prints them all as one line when it ends (untrusted_summary)."""
    path = Path(UNTRUSTED_LOG)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as log:  # appends of one short line: whole, even from doit's parallel processes
            log.write(json.dumps({"task": task, "reason": reason}) + "\n")


def untrusted_summary():
    """One line on the entries of the shared cache this build ignored and rebuilt (None if none); clears the log."""
    path = Path(UNTRUSTED_LOG)
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        path.unlink()
    except (OSError, ValueError):
        return None
    if not records:
        return None
    reasons = {}
    for record in records:
        reasons.setdefault(record["reason"], []).append(record["task"])
    parts = [f"{reason}: {few(tasks)}" for reason, tasks in sorted(reasons.items())]
    return (f"the shared artifact cache held {len(records)} entr{'y' if len(records) == 1 else 'ies'} this build "
            f"did not trust, and rebuilt: {'; '.join(parts)}")


def _cache_entry(node):
    """(cache, key) for a node the cache holds; (None, None) otherwise. A benchmark is only worth reusing on the
    same kind of machine: its key names the host."""
    if not stages.get(node.stage).cached or shared_cache() is None:
        return None, None
    from mobilebuild.engine import cache
    from mobilebuild.worker.stages.bench import host  # no torch there

    hashes = {f"input:{role}": store.sha256_file(path) for role, path in node.inputs.items()}
    hashes.update({f"file:{path}": store.sha256_file(path) for path in node.files})
    if stages.get(node.stage).measures:  # a timing is only worth reusing on the same kind of machine
        hashes["host"] = json.dumps(host(), sort_keys=True)
    return shared_cache(), cache.entry_key(node.key(), hashes)


def request(node, output):
    """What a stage worker, here or on Dask, needs to run `node` into `output`."""
    stage = stages.get(node.stage)
    return {"stage": node.stage, "module": stage.module_path, "config_type": stages.type_path(stage.config),
            "measures": stage.measures, "inputs": node.inputs, "config": node.config, "output": str(output),
            "task": node.task_name}


def run_in_process(node, output):
    """A stage that reads results, no tensors (the manifest, the plot: matplotlib only when a figure is drawn), run in
    this process."""
    run = importlib.import_module(stages.get(node.stage).module_path).run
    run({role: Path(p) for role, p in node.inputs.items()}, node.settings, output)


def _run_stage(node, output):
    stage = stages.get(node.stage)
    if stage.in_process:
        try:
            run_in_process(node, output)
        except (MobileBuildError, OSError):
            raise
        except Exception as exc:  # a library's (matplotlib's) failure is the user's one line; ours, a traceback
            from mobilebuild.worker import failures  # no torch there

            failure = failures.library_failure(exc)
            if failure is None:
                raise
            raise LibraryFailed(failure) from None
        return {}
    reply = worker_pool.call({**request(node, output), "root": os.getcwd()}, python=node.interpreter,
                             timeout=node.time_limit)
    _raise_failure(node, reply)
    return reply


def _build_remotely(node, shared, key):
    """The node on a Dask worker (distributed.py); its output comes back through the shared cache."""
    from mobilebuild.engine import cache

    if key is None:
        raise MobileBuildError("a build on Dask moves files through the shared artifact cache, which is off "
                               "(MOBILEBUILD_CACHE): point it at storage every worker can reach")
    if shared.read_only:
        raise MobileBuildError(f"a build on Dask moves files through the shared artifact cache, which is read-only "
                               f"here ({cache.READ_ONLY_VARIABLE}): build on Dask where the cache may be written")
    if not shared.writes:
        raise MobileBuildError(f"a build on Dask moves files through the shared artifact cache, which this machine "
                               f"checks signatures of but cannot sign ({cache.TRUSTED_KEYS_VARIABLE} without "
                               f"{cache.SIGNING_KEY_VARIABLE}): build on Dask where entries are signed")
    try:
        reply = distributed.run_remote(node, request(node, node.output), shared, key, python=node.interpreter,
                                       timeout=node.time_limit)
    except OSError as exc:  # uploading the inputs; the message names the cache by its redacted location only
        raise MobileBuildError(f"cannot write to the artifact cache at {shared.location}: "
                               f"{exc.strerror or type(exc).__name__}") from None
    _raise_failure(node, reply)
    try:
        found = shared.fetch(key, {"artifact": Path(node.output)})
    except cache.Untrusted as exc:
        raise MobileBuildError(f"built on a Dask worker, but its cache entry is {exc}: give the workers a "
                               f"{cache.SIGNING_KEY_VARIABLE} this build trusts") from None
    if found is None:
        raise RuntimeError(f"{node.task_name}: built on a Dask worker but not found in the cache {shared.location}")
    return reply


def _raise_failure(node, reply):
    """Print what the stage printed in its worker; raise what a failing stage would have raised here."""
    sys.stdout.write(reply["printed"])
    if "error" in reply:
        raise MobileBuildError(**reply["error"])
    if "oserror" in reply:
        problem = reply["oserror"]
        raise OSError(problem["errno"], problem["strerror"] or problem["text"], problem["filename"])
    if "failure" in reply:  # a library failing on the model (worker/failures.py)
        raise LibraryFailed(reply["failure"])
    if "crash" in reply:  # a bug of mobilebuild's, not the user's: the traceback is for us
        raise RuntimeError(f"{node.task_name} crashed in its worker:\n{reply['crash']}")


def recipe_field(field, fields):
    """A stage names settings by their recipe-level field ("quantize.calibration.path"); a target's own settings
    sit under the target (see graph.Node.fields)."""
    for prefix in sorted(fields, key=len, reverse=True):
        if field and (field == prefix or field.startswith((f"{prefix}.", f"{prefix}["))):
            return fields[prefix] + field[len(prefix):]
    return field


def _os_problem(exc, output):
    """One line naming the file and the OS's reason. Writes go to a temporary file beside the output (or, through
    a file handle, name no file at all): either way the artifact is what could not be written."""
    name = Path(os.fsdecode(exc.filename)) if isinstance(exc.filename, (str, bytes)) and exc.filename else None
    output = Path(output)
    if name is None or name == output or name == output.parent or name.name.startswith(f".{output.name}"):
        return f"cannot write {output}: {exc.strerror or exc}"
    return f"{name}: {exc.strerror or exc}"


class LibraryFailed(Exception):
    """A stage failed inside a library (or the model's own code), not in mobilebuild: `failure` is
    worker/failures.library_failure's record of it."""

    def __init__(self, failure):
        super().__init__(failure["error"])
        self.failure = failure


def log_path(node):
    """Where a failed node's traceback goes."""
    return Path(LOG_DIR, node.stage, f"{node.name}.log")


def _library_problem(node, failure):
    """One line for a stage a library failed in: who raised what, where in the model, and the log that holds its
    traceback (written here: a Dask worker's reply brings it back)."""
    path = log_path(node)
    where = f" at {failure['part']}" if failure.get("part") else ""
    header = (f"{node.task_name} ({node.recipe_file}): {failure['raised_by']} raised it{where}, "
              f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n\n")
    try:
        store.write_text(path, header + failure["traceback"])
        kept = f" (traceback: {path.as_posix()})"
    except OSError as exc:
        kept = f" (its traceback could not be kept: {path.as_posix()}: {exc.strerror or exc})"
    return f"{node.recipe_file}: {failure['raised_by']} failed{where}: {failure['error']}{kept}"
