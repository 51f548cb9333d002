"""What a check can take from what was recorded before, instead of computing it again: the build's verify result for
an artifact (what ExecuTorch delegated, and that verify ran those very bytes on this host), and what an earlier check
found in the model's structure, in the recipe's verify settings or in a quantized model, kept in
`.mobilebuild/check/<recipe>.json` under a key of everything it depends on. No torch here: a check right after a
build imports neither torch's heavy parts nor ExecuTorch's exir nor torchvision.
"""

import hashlib
import json
from pathlib import Path

from mobilebuild import store
from mobilebuild.plan import toolchain
from mobilebuild.plan.chain import model_files, model_source

CHECK_DIR = ".mobilebuild/check"  # ignored scratch (.gitignore: .mobilebuild/)
PREFLIGHT_CODE = Path(__file__).parent
# A verify result whose status is one of these ran the artifact on this host (passed or missed its thresholds):
# "not run on host" did not, and a verify that could not run it failed its task and left no current result.
RAN_ON_HOST = ("passed", "failed")


def _digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _preflight_code_digest():
    digest = hashlib.sha256()
    for source in sorted(PREFLIGHT_CODE.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


class Memory:
    """`.mobilebuild/check/<recipe>.json`: {"structure": {"key", "facts"}, "verification": {key: {"problem"}},
    "quantized": {path: {"sha256", "note"}}}.
    Unreadable or missing, it is empty; unwritable (a read-only checkout), the check only computes every time."""

    def __init__(self, root, recipe_name):
        self.path = Path(root, CHECK_DIR, f"{recipe_name}.json")
        try:
            self.entries = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            self.entries = {}
        if not isinstance(self.entries, dict):
            self.entries = {}

    def save(self):
        try:
            store.write_text(self.path, json.dumps(self.entries, indent=1, sort_keys=True))
        except OSError:
            pass


def structure_key(recipe, root):
    """Everything the structure analysis (structure.analyse) reads: the model's part of the recipe, its inputs and
    fusion, the factory's source, the package versions and the code of the stages and of the check."""
    factory_files = model_files(root, recipe.model)
    return _digest({"model": recipe.model, "source": model_source(recipe.model, recipe.inputs),
                    "inputs": recipe.inputs, "fuse": recipe.fuse,
                    "factory": {path: store.sha256_file(Path(root, path)) for path in factory_files},
                    "versions": toolchain.versions(), "preflight": _preflight_code_digest()})


def cached_structure(memory, key):
    """The structure facts an earlier check found under `key`, or None."""
    entry = memory.entries.get("structure")
    return entry["facts"] if isinstance(entry, dict) and entry.get("key") == key else None


def remember_structure(memory, key, facts):
    memory.entries["structure"] = {"key": key, "facts": facts}
    memory.save()


def verification_key(reads, files, output_names):
    """Everything the recipe's verify checks (preflight.verification) read: the verify settings they take (`reads`),
    the sha256 of each file the verify task reads (`files`: the factory's and the evaluation function's sources, a
    holdout's calibration files), the model's output tensors (`output_names`), the package versions and the code of
    the stages and of the check."""
    return _digest({"reads": reads, "files": files, "output_names": output_names, "versions": toolchain.versions(),
                    "preflight": _preflight_code_digest()})


def cached_verification(memory, key):
    """(whether an earlier check ran the recipe's verify checks under `key`, the problem it found or None)."""
    entry = memory.entries.get("verification")
    found = entry.get(key) if isinstance(entry, dict) else None
    return (True, found.get("problem")) if isinstance(found, dict) else (False, None)


def remember_verification(memory, problems):
    """`problems`: {key: the problem found, or None}, those this check used (earlier keys are dropped)."""
    memory.entries["verification"] = {key: {"problem": problem} for key, problem in problems.items()}
    memory.save()


def cached_quantized_note(memory, path):
    """(the file's sha256, the note an earlier check wrote for exactly these bytes, or False when none)."""
    digest = store.sha256_file(path)
    entry = memory.entries.get("quantized", {}).get(str(path))
    if isinstance(entry, dict) and entry.get("sha256") == digest:
        return digest, entry.get("note")
    return digest, False


def remember_quantized_note(memory, path, digest, note):
    memory.entries.setdefault("quantized", {})[str(path)] = {"sha256": digest, "note": note}
    memory.save()


def verify_result(path, artifact, current):
    """The build's verify result at `path` when it is about the artifact's present bytes, else None. `current`: doit
    found the verify task up to date before this check ran and the artifact's own task up to date (then doit has
    checked that the artifact is the file verify read, and no hash is needed); otherwise the result's
    artifact_sha256 must be the artifact's."""
    try:
        result = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict):
        return None
    if current:
        return result
    try:
        same = result.get("artifact_sha256") == store.sha256_file(artifact)
    except OSError:
        return None
    return result if same else None


def outcome_line(result):
    """What verify's result says of its run, in a few words: "passed (relaxed) on 16 random inputs, SQNR 41.2 dB"."""
    status = result.get("status", "?")
    if result.get("relaxed"):
        status += " (relaxed)"
    found = result.get("metrics") or {}
    sqnr = found.get("sqnr_db")
    parts = [f"{status} on {result.get('samples', '?')} {result.get('data') or ''} inputs".replace("  ", " ")]
    if isinstance(sqnr, (int, float)):
        parts.append(f"SQNR {sqnr:.1f} dB")
    if result.get("failures"):
        parts.append(result["failures"][0] + (f" and {len(result['failures']) - 1} more"
                                             if len(result["failures"]) > 1 else ""))
    return ", ".join(parts)
