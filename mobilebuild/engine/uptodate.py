"""The up-to-date checks of the build's tasks, and how they explain themselves (`doit info`, `doit why`). No torch.
"""

import hashlib
import inspect
import json
import os

from doit.dependency import MD5Checker
from doit.tools import config_changed

from mobilebuild import store
from mobilebuild.plan import stages


def file_state(path, stat):
    """(timestamp, size, sha256): what content_changed compares a file with later."""
    return stat.st_mtime, stat.st_size, store.sha256_file(path)


def content_changed(path, stat, state):
    """Whether the file at `path` (now `stat`) differs from a file_state: by its size, or when its timestamp moved,
    by its content. A file touched but unchanged has not changed; only a changed timestamp costs a hash."""
    timestamp, size, digest = state
    if stat.st_size != size:
        return True
    return stat.st_mtime != timestamp and digest != store.sha256_file(path)


class ContentChecker(MD5Checker):
    """doit's default check (timestamp first, then content), with sha256 in place of md5: faster here, and shared
    through store.sha256_file with the manifest, so each artifact is hashed once per run."""

    def check_modified(self, file_path, file_stat, state):
        return content_changed(file_path, file_stat, state)

    def get_state(self, dep, current_state):
        stat = os.stat(dep)
        if current_state and current_state[0] == stat.st_mtime:
            return None
        return file_state(dep, stat)


class NodeUpToDate(config_changed):
    """A node's up-to-date check: its key unchanged (doit's config_changed) and its target the very file this task
    last wrote.

    The key itself is kept too: `doit info TASK` and `doit why TASK` then name the recipe fields that changed since
    the last build (`recipes/x.yaml: quantize.calibration.batches: 16 -> 24`), not the whole key. The target: doit
    records a run's results when the run ends, so a build killed after replacing an artifact leaves the new bytes
    under the old state, and reverting the recipe would then take another version's artifact as up to date. A stat
    per task; the content is hashed only when the stat differs (a file touched but unchanged stays up to date).

    One check rather than two, with its signature declared: doit works out an uptodate callable's signature before
    each call (to pass it the task and its values), which from an instance's __call__ was a quarter of an up-to-date
    build's time at 200 recipes."""

    __signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                       for name in ("task", "values")])

    def __init__(self, node):
        super().__init__(node.key())
        self.node = node
        self.target = node.output
        self.previous = None
        self.intact = True

    def configure_task(self, task):
        super().configure_task(task)
        task.value_savers.append(lambda: {"_key": self.config, "target": self.target_state()})

    def _calc_digest(self):
        """config_changed's digest, md5 of json.dumps(key, sort_keys=True), with the toolchain part that every key
        shares encoded once: the same bytes, so the digests earlier builds recorded still match."""
        key = self.config
        assert key.keys() == {"config", "stage", "toolchain"}, key.keys()
        text = '{"config": %s, "stage": %s, "toolchain": %s}' % (
            json.dumps(key["config"], sort_keys=True), json.dumps(key["stage"]), _encoded_once(key["toolchain"]))
        return hashlib.md5(text.encode("utf-8")).hexdigest()

    def target_stat(self):
        try:
            return os.stat(self.target)
        except FileNotFoundError:
            return None

    def target_state(self):
        stat = self.target_stat()
        return None if stat is None else file_state(self.target, stat)

    def __call__(self, task, values):
        self.previous = values.get("_key")
        recorded, stat = values.get("target"), self.target_stat()
        self.intact = stat is not None and recorded is not None and not content_changed(self.target, stat, recorded)
        return super().__call__(task, values) and self.intact

    def changes(self):
        """What made the last call false, one line each (call it first)."""
        if self.previous is None:
            return ["no settings recorded by an earlier build of this task"]
        changed = [explain_change(self.node, *change) for change in _differences(self.previous, self.config)]
        if not self.intact:
            changed.append(f"{self.target} is not the file this task last wrote")
        return changed or ["nothing in the key (the previous run failed?)"]

    def __repr__(self):
        return "changed: " + "; ".join(self.changes())

    def parts(self):
        """The key's parts, one line each, its settings named by their recipe fields."""
        node, key = self.node, self.config
        lines = [f"stage: {key['stage']}", f"settings (fields of {node.recipe_file}, or derived from them and the "
                                           "target's route):"]
        for setting, value in key["config"].items():
            field = stages.recipe_field(node.stage, setting, node.fields)
            lines.append(f"  {field or setting + ' (derived)'}: {_short(value, 100)}")
        versions = ", ".join(f"{name} {version}" for name, version in key["toolchain"].items()
                             if name != "stages_sha256")
        lines.append(f"toolchain: {versions}; stage code sha256 {key['toolchain'].get('stages_sha256', '')[:12]}")
        return lines


def explain_change(node, path, before, now):
    """One change in a node's key, named as its user knows it: the recipe file and field where one is behind it."""
    change = f"{_short(before)} -> {_short(now)}"
    part, _, rest = path.partition(".")
    if part == "config":
        field = stages.recipe_field(node.stage, rest, node.fields)
        return f"{node.recipe_file}: {field}: {change}" if field else f"{node.stage} setting {rest}: {change}"
    if path == "stage":
        return f"stage: {change}"
    if path == "toolchain.stages_sha256":
        return "mobilebuild's stage code (mobilebuild/worker/)"
    if part == "toolchain":
        return f"toolchain {rest}: {change}"
    return f"{path}: {change}"


_ENCODED = {}


def _encoded_once(value):
    """json.dumps(value, sort_keys=True) of a value that does not change (toolchain.versions' cached dicts)."""
    found = _ENCODED.get(id(value))
    if found is None or found[0] is not value:
        found = _ENCODED[id(value)] = (value, json.dumps(value, sort_keys=True))
    return found[1]


def _differences(before, now, path=""):
    """(path, before, now) of every leaf that differs between two JSON values."""
    if isinstance(before, dict) and isinstance(now, dict):
        for key in sorted(set(before) | set(now), key=str):
            yield from _differences(before.get(key), now.get(key), f"{path}.{key}" if path else str(key))
    elif before != now:
        yield path, before, now


def _short(value, width=60):
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[:width - 3] + "..."


class ObservedFiles:
    """An uptodate check on files a task reads when they exist, without depending on the tasks that make them: a
    release copies what the last build made, whichever of its tasks failed."""

    def __init__(self, paths):
        self.paths = paths

    def digest(self):
        return {path: store.sha256_file(path) if os.path.exists(path) else None for path in self.paths}

    def __call__(self, task, values):
        task.value_savers.append(lambda: {"observed": self.digest()})
        return values.get("observed") == self.digest()


