"""Release: the shipped artifacts of a finished build, with a release.json that says how each was made, and a check
that rebuilding the repository from scratch gives the same bytes.

    mobilebuild release [--out DIR] [--recipe NAME]... [--target ID]... [--allow-failed] [--signing-key KEY]
    mobilebuild verify-release DIR [--trusted-key KEY]... [--signature-only] [--keep-scratch] [--scratch DIR]

`collect` copies each selected target's final artifact (artifacts/<recipe>/manifest.json, "targets") into the release
folder as <recipe>/<file>, and writes release.json: per file its sha256 and size, the recipe (name, file, sha256),
the source files it was built from, target, backend, runtime and precision, the chain of graph nodes that made it
(each output's sha256), the toolchain, and summaries of verification and benchmark results; beside it the SLSA
provenance (provenance.py), whose sha256 release.json records. With a release key (an Ed25519 private key,
signing.py), release.json.sig signs release.json, and so, through the hashes it lists, every file of the release.
Nothing holds a timestamp or an absolute path, and JSON is written with sorted keys; Ed25519 signatures are
deterministic: releasing the same build twice gives the same bytes. The folder is assembled beside its destination
and renamed into place, so a release is complete or absent.

`check_signature` and `check_release_folder` check a release against trusted public keys and its own hashes, in
seconds (`--signature-only`: what an app's CI runs on download). `verify` does that, then copies the repository's
sources (git's tracked and untracked, not ignored files; without git, the tree minus build state) into a scratch
folder, builds the released artifacts there with the shared cache off, and compares them with release.json.

No torch here: the release reads manifests and copies files.
"""

import argparse
import collections
import contextlib
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from mobilebuild import signing, store
from mobilebuild.errors import MobileBuildError, RecipeErrors
from mobilebuild.plan import graph, project, toolchain
from mobilebuild.results import provenance

RELEASE_FILE = "release.json"
SIGNATURE_FILE = "release.json.sig"
SIGNING_KEY_VARIABLE = "MOBILEBUILD_RELEASE_SIGNING_KEY"  # the release key: its text, or its file
TRUSTED_KEYS_VARIABLE = "MOBILEBUILD_RELEASE_TRUSTED_KEYS"  # public keys a verifier trusts, separated by spaces
FORMAT = 1
DEFAULT_OUT = "release"
RUN_DOIT_FIRST = "run `doit` first"
VERIFICATION_KEYS = ("status", "reason", "data", "samples", "metrics", "thresholds", "relaxed", "failures")
ARM64_KEYS = ("status", "cpu", "generation", "emulator", "samples", "against_host", "failures")
BENCHMARK_KEYS = ("status", "reason", "median_ms", "p10_ms", "p90_ms", "threads", "iters", "warmup", "host")
TARGET_KEYS = ("backend", "runtime", "precision", "quantization", "pruning", "delegate", "fixed_shape", "tokenizer")
# Build state and local environments: never part of the sources a scratch build starts from.
STATE_AT_TOP = (graph.ARTIFACTS_DIR, ".mobilebuild", ".git")
STATE_ANYWHERE = ("__pycache__", ".pytest_cache", ".doit.db*")


class Difference(NamedTuple):
    """A released file that is not what release.json says: `source` is "release" for the file in the release folder
    (altered, missing, or not listed: expected None), "rebuild" for the scratch build's (got None: not built)."""

    path: str
    expected: str | None
    got: str | None
    source: str

    def line(self):
        if self.expected is None:
            return f"{self.path}: not listed in {RELEASE_FILE} (sha256 {self.got})"
        where = "released file" if self.source == "release" else "rebuilt from the recipes"
        found = "missing" if self.got is None else f"sha256 {self.got}"
        return f"{self.path}: {where}: {found}, {RELEASE_FILE} says {self.expected}"


# -- collect ------------------------------------------------------------------------------------------------------


class Refused(RecipeErrors):
    """Targets that could not be released, one error each; `document` is release.json of what was released
    (None: nothing was)."""

    def __init__(self, errors, document):
        super().__init__(errors)
        self.document = document


def collect(root, out_dir, recipes=None, targets=None, allow_failed=False, signing_key=None):
    """Copy the final artifacts of the selected recipes and targets (all by default; a target by its id, e.g.
    "xnnpack", or as "<recipe>-<id>") into `out_dir` with release.json and the provenance, signed with
    `signing_key` (a signing.PrivateKey) if given; return release.json's content. A target is refused when its
    artifact is missing or changed, its manifest is stale, or (unless `allow_failed`) it failed or lacks
    verification: the others are released, then Refused lists every refusal. A selection that names nothing raises
    MobileBuildError."""
    root = Path(root)
    out_dir = Path(out_dir)
    _check_destination(out_dir)
    chosen, refused = _select(root, project.by_recipe(root), recipes, targets)
    files = {}
    staging = _staging_dir(out_dir)
    try:
        for recipe_nodes, manifest, target in chosen:
            try:
                for path, entry in _release_file(root, staging, recipe_nodes, manifest, target, allow_failed).items():
                    if path in files:  # a file several targets ship with (a language model's tokenizer)
                        entry["ships_with"] = sorted({*files[path]["ships_with"], *entry["ships_with"]})
                    files[path] = entry
            except MobileBuildError as exc:
                refused.append(exc)
                _unstage(staging, target["path"])  # a copy that was made before the refusal
        document = _describe(staging, files, signing_key) if files else None
        if document:
            _publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if refused:
        raise Refused(refused, document)
    return document


def _describe(staging, files, signing_key):
    """Write the provenance, release.json (with the provenance's sha256) and its signature; return release.json."""
    sources = {path: digest for entry in files.values() for path, digest in entry["sources"].items()}
    command = "doit " + " ".join(sorted({entry["chain"][-1]["task"] for entry in files.values()}))
    statement = provenance.statement(files, sources, command)
    provenance.validate(statement)
    (staging / provenance.STATEMENT_FILE).write_text(dumps(statement))
    document = {"format": FORMAT, "files": files,
                "provenance": {"path": provenance.STATEMENT_FILE,
                               "sha256": store.sha256_file(staging / provenance.STATEMENT_FILE)}}
    text = dumps(document)
    (staging / RELEASE_FILE).write_text(text)
    if signing_key is not None:
        (staging / SIGNATURE_FILE).write_text(dumps(signing_key.sign(text.encode())))
    return document


def _unstage(staging, path):
    (staging / path).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (staging / path).parent.rmdir()  # only if empty


def dumps(document):
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def _select(root, nodes, recipes, targets):
    """[(the recipe's nodes, its manifest, one of its manifest targets)] for the selection; the manifests of the
    recipes that have a selected target are checked to be current."""
    unknown = sorted(set(recipes or ()) - set(nodes))
    if unknown:
        raise MobileBuildError(f"no recipe named {unknown[0]!r} (recipes: {', '.join(sorted(nodes))})")
    chosen, refused, matched = [], [], set()
    for name, recipe_nodes in nodes.items():
        if recipes and name not in recipes:
            continue
        manifest_node = next(n for n in recipe_nodes if n.stage == "manifest")
        wanted = [t["target"] for t in manifest_node.config["targets"]
                  if not targets or {t["target"], f"{name}-{t['target']}"} & set(targets)]
        if not wanted:
            continue
        matched |= {*wanted, *(f"{name}-{target}" for target in wanted)}
        try:
            manifest = _current_manifest(root, manifest_node)
        except MobileBuildError as exc:  # every target of the recipe: one line says why
            refused.append(exc)
            continue
        by_id = {target["target"]: target for target in manifest["targets"]}
        chosen += [(recipe_nodes, manifest, by_id[target]) for target in wanted]
    missing = sorted(set(targets or ()) - matched)
    if missing:
        raise MobileBuildError(f"no target {missing[0]!r} in the selected recipes")
    if not chosen and not refused:
        raise MobileBuildError("nothing to release: no targets selected")
    return chosen, refused


def _current_manifest(root, node):
    """The recipe's manifest, refused unless it describes the recipe, its targets and the toolchain as they are
    now."""
    path = root / node.output
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        raise MobileBuildError(f"{node.output} is missing or unreadable: {RUN_DOIT_FIRST}") from None
    if manifest.get("recipe_sha256") != node.config["recipe_sha256"]:
        raise MobileBuildError(f"{node.output} is stale: {node.recipe_file} changed since it was built; "
                               f"{RUN_DOIT_FIRST}")
    if manifest.get("toolchain") != toolchain.versions():
        raise MobileBuildError(f"{node.output} is stale: it was built with another toolchain "
                               f"({_toolchain_change(manifest.get('toolchain') or {})}); {RUN_DOIT_FIRST}")
    built = {t["target"] for t in manifest.get("targets", [])}
    expected = {t["target"] for t in node.config["targets"]}
    if built != expected:
        raise MobileBuildError(f"{node.output} is stale: it lists targets {sorted(built)}, the recipe "
                               f"{sorted(expected)}; {RUN_DOIT_FIRST}")
    return manifest


def _toolchain_change(recorded):
    now = toolchain.versions()
    changed = sorted(key for key in set(now) | set(recorded) if now.get(key) != recorded.get(key))
    return ", ".join(f"{key} {_short(recorded.get(key))} -> {_short(now.get(key))}" for key in changed)


def _short(value):
    """A digest cut to 12 digits, so that a changed toolchain still reads as one line."""
    return value[:12] if isinstance(value, str) and len(value) == 64 else value


def _release_file(root, staging, recipe_nodes, manifest, target, allow_failed):
    """Copy one target's artifact, and the files it ships with (a language model's tokenizer), into the staging
    folder; return {each one's release path: its release.json entry}."""
    name, target_id = manifest["recipe"], target["target"]
    _check_verification(name, target_id, target["status"], manifest, allow_failed)
    entry = {
        **_copied(root, staging, recipe_nodes, manifest, target["path"]),
        "target": target_id,
        **{key: target.get(key) for key in TARGET_KEYS},
        "inputs": manifest.get("inputs"),  # with the outputs: all an app developer needs to feed and read it
        "outputs": target.get("outputs"),
        "toolchain": target.get("toolchain", manifest["toolchain"]),
        "verification": _summary(manifest.get("verification", {}).get(target_id), VERIFICATION_KEYS),
        "benchmark": _summary(manifest.get("benchmarks", {}).get(target_id), BENCHMARK_KEYS),
    }
    on_arm = arm64_summary(manifest, target_id)
    if on_arm:  # only where the build ran it there: other releases keep their entries
        entry["arm64"] = on_arm
    shipped_with = {path: {**_copied(root, staging, recipe_nodes, manifest, path), "target": None,
                           "ships_with": [target_id]}
                    for path in (target.get("tokenizer"),) if path}
    return {target["path"]: entry, **shipped_with}


def _copied(root, staging, recipe_nodes, manifest, path):
    """Copy a file the build made (`path`, below artifacts/) into the staging folder; return what release.json says
    of how it was made: its sha256 and size, the recipe, the sources, the chain of nodes and the toolchain."""
    chain = _chain(root, recipe_nodes, manifest, f"{graph.ARTIFACTS_DIR}/{path}")
    destination = staging / path
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(root / graph.ARTIFACTS_DIR / path, destination)
    # The copy, not the original, is checked: a build running meanwhile could replace the original under us.
    sha256 = store.sha256_file(destination)
    if sha256 != chain[-1]["sha256"]:
        raise MobileBuildError(f"{graph.ARTIFACTS_DIR}/{path} changed while it was released; {RUN_DOIT_FIRST}")
    made_it = {step["task"] for step in chain}
    sources = {source: store.sha256_file(root / source) for node in recipe_nodes if node.task_name in made_it
               for source in (*node.files, *(value for value in node.inputs.values()
                                             if not value.startswith(f"{graph.ARTIFACTS_DIR}/")))}
    return {"sha256": sha256, "bytes": destination.stat().st_size, "recipe": manifest["recipe"],
            "recipe_file": manifest["recipe_file"], "recipe_sha256": manifest["recipe_sha256"],
            "sources": {manifest["recipe_file"]: manifest["recipe_sha256"], **sources}, "chain": chain,
            "toolchain": manifest["toolchain"]}


def arm64_summary(manifest, target_id):
    """{CPU model: verdict, emulator, quality, agreement with the host, instructions per inference} of a target's
    runs on emulated ARM CPUs (worker/stages/arm64.py), or {}."""
    found = (manifest.get("arm64") or {}).get(target_id) or {}
    return {cpu: {**_summary(result, ARM64_KEYS), "sqnr_db": (result.get("metrics") or {}).get("sqnr_db"),
                  "instructions_per_inference": (result.get("instructions") or {}).get("per_inference")}
            for cpu, result in found.items()}


def _check_verification(name, target_id, status, manifest, allow_failed):
    on_arm = [line for result in arm64_summary(manifest, target_id).values() for line in result.get("failures") or []]
    if on_arm and not allow_failed:
        raise MobileBuildError(f"{name}-{target_id}: verification failed ({'; '.join(on_arm)}); fix it, or pass "
                               "--allow-failed to release it anyway")
    if allow_failed or status not in ("failed", "not verified"):
        return
    if status == "failed":
        result = manifest.get("verification", {}).get(target_id, {})
        failures = "; ".join(result.get("failures") or []) or "see its verify result"
        raise MobileBuildError(f"{name}-{target_id}: verification failed ({failures}); fix it, or pass "
                               "--allow-failed to release it anyway")
    raise MobileBuildError(f"{name}-{target_id}: not verified: {RUN_DOIT_FIRST} (or pass --allow-failed)")


def _chain(root, recipe_nodes, manifest, final_output):
    """The manifest's entries for the nodes that lead to `final_output`, in build order, each checked against its
    file."""
    by_output = {node.output: node for node in recipe_nodes if node.stage not in ("verify", "bench", "manifest")}
    needed, pending = set(), [final_output]
    while pending:
        path = pending.pop()
        if path in by_output and path not in needed:
            needed.add(path)
            pending.extend(by_output[path].inputs.values())
    described = {f"{graph.ARTIFACTS_DIR}/{entry['path']}": entry for entry in manifest["artifacts"]}
    absent = sorted(needed - set(described))
    if absent:
        raise MobileBuildError(f"{absent[0]} is not in {graph.ARTIFACTS_DIR}/{manifest['recipe']}/manifest.json: "
                               f"{RUN_DOIT_FIRST}")
    chain = []
    for output, entry in described.items():  # the manifest lists nodes in build order
        if output not in needed:
            continue
        _check_file(root / output, output, entry["sha256"], manifest["recipe"])
        chain.append({"stage": entry["stage"], "task": by_output[output].task_name, "path": entry["path"],
                      "sha256": entry["sha256"]})
    return chain


def _check_file(path, shown, sha256, recipe_name):
    if not path.is_file():
        raise MobileBuildError(f"{shown} is missing: {RUN_DOIT_FIRST}")
    if store.sha256_file(path) != sha256:
        raise MobileBuildError(f"{shown} does not match {graph.ARTIFACTS_DIR}/{recipe_name}/manifest.json "
                               f"(stale manifest): {RUN_DOIT_FIRST}")


def _summary(result, keys):
    if result is None:
        return None
    return {key: result[key] for key in keys if key in result}


def _check_destination(out_dir):
    """A release replaces an earlier release whole: never a folder of something else."""
    if out_dir.exists() and not _is_release(out_dir):
        raise MobileBuildError(f"{out_dir} exists and is not a release (no {RELEASE_FILE}); choose another --out")


def _staging_dir(out_dir):
    """An empty folder beside `out_dir`, readable like any folder the user makes (mkdtemp's is private)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}{store.TEMP_MARKER}", dir=out_dir.parent))
    mask = os.umask(0)
    os.umask(mask)
    staging.chmod(0o777 & ~mask)
    return staging


def _is_release(path):
    return path.is_dir() and ((path / RELEASE_FILE).is_file() or not any(path.iterdir()))


def _publish(staging, out_dir):
    """Rename the finished release into place; an earlier release there is replaced whole, never merged."""
    if not out_dir.exists():
        os.rename(staging, out_dir)
        return
    previous = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.previous-", dir=out_dir.parent))
    os.rename(out_dir, previous / out_dir.name)
    try:
        os.rename(staging, out_dir)
    except OSError:
        os.rename(previous / out_dir.name, out_dir)
        raise
    finally:
        shutil.rmtree(previous, ignore_errors=True)


# -- verify -------------------------------------------------------------------------------------------------------


class SignatureRefused(MobileBuildError):
    """release.json is not signed by a trusted key: nothing in the release can be taken on its word."""


def signing_key_from_environment(value=None):
    """The release key: `value` (its text or file), else $MOBILEBUILD_RELEASE_SIGNING_KEY; None when neither."""
    value = value or os.environ.get(SIGNING_KEY_VARIABLE, "").strip()
    return signing.PrivateKey.load(value, SIGNING_KEY_VARIABLE) if value else None


def check_signature(release_dir, trusted_keys):
    """Return the name of the trusted key that signed release.json; raise SignatureRefused (one line naming
    release.json) when none did."""
    path = Path(release_dir) / RELEASE_FILE
    read_release(release_dir)
    try:
        signature = json.loads((Path(release_dir) / SIGNATURE_FILE).read_text())
    except (OSError, ValueError):
        signature = None
    try:
        trusted_keys.verify(signature, path.read_bytes(), unsigned=f"unsigned (no valid {SIGNATURE_FILE} beside it)",
                            altered="the file was changed after it was signed")
    except signing.BadSignature as exc:
        raise SignatureRefused(f"{path}: {exc}") from None
    return signature["key"]


def check_release_folder(release_dir, document):
    """The released files, the provenance among them, that differ from what release.json says, and the files it
    does not list. Raises MobileBuildError for an intact provenance file that is not valid SLSA provenance."""
    release_dir = Path(release_dir)
    listed = dict(document["files"])
    recorded = document.get("provenance")
    if recorded:
        listed[recorded["path"]] = recorded
    differences = []
    for path, entry in sorted(listed.items()):
        released = release_dir / path
        got = store.sha256_file(released) if released.is_file() else None
        if got != entry["sha256"]:
            differences.append(Difference(path, entry["sha256"], got, "release"))
    for released in sorted(release_dir.rglob("*")):
        path = released.relative_to(release_dir).as_posix()
        if released.is_file() and path not in (RELEASE_FILE, SIGNATURE_FILE) and path not in listed:
            differences.append(Difference(path, None, store.sha256_file(released), "release"))
    if recorded and not any(difference.path == recorded["path"] for difference in differences):
        provenance.validate(json.loads((release_dir / recorded["path"]).read_text()),
                            f"{release_dir}/{recorded['path']}")
    return differences


def verify(root, release_dir, scratch=None, keep_scratch=False, trusted_keys=None):
    """Check a release: its signature against `trusted_keys` (a signing.KeyRing; raises SignatureRefused), its files
    against release.json, then a build of the repository's sources in a scratch folder (`scratch`, which must not
    exist yet, or a new temporary one) against release.json. Returns the differences, empty when the release is
    intact and rebuilds byte for byte. Progress goes to stderr; the scratch folder is removed unless
    `keep_scratch`."""
    root, release_dir = Path(root).resolve(), Path(release_dir).resolve()
    document = read_release(release_dir)
    if trusted_keys:
        _progress(f"{RELEASE_FILE} signed by {check_signature(release_dir, trusted_keys)}")
    files = document["files"]
    differences = check_release_folder(release_dir, document)
    scratch = _new_scratch(scratch)
    try:
        sources = repository_files(root, exclude=[release_dir, scratch])
        _progress(f"copying {len(sources)} source files of {root} to {scratch}")
        for relative in sources:
            (scratch / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / relative, scratch / relative)
        _warn_about_changes(scratch, files)
        _build(scratch, sorted({entry["chain"][-1]["task"] for entry in files.values()}))
        _progress(f"comparing {len(files)} files with {RELEASE_FILE}")
        for path, entry in sorted(files.items()):
            rebuilt = scratch / graph.ARTIFACTS_DIR / path
            got = store.sha256_file(rebuilt) if rebuilt.is_file() else None
            if got != entry["sha256"]:
                differences.append(Difference(path, entry["sha256"], got, "rebuild"))
    finally:
        if keep_scratch:
            _progress(f"scratch build kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return differences


def read_release(release_dir):
    try:
        document = json.loads((Path(release_dir) / RELEASE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise MobileBuildError(f"{release_dir} is not a release: {RELEASE_FILE} cannot be read "
                               f"({exc.__class__.__name__})") from None
    if document.get("format") != FORMAT or not isinstance(document.get("files"), dict):
        raise MobileBuildError(f"{release_dir}/{RELEASE_FILE} is not a release description of format {FORMAT}")
    return document


def _new_scratch(scratch):
    if scratch is None:
        return Path(tempfile.mkdtemp(prefix="mobilebuild-verify-"))
    scratch = Path(scratch).resolve()
    if scratch.exists():  # it is deleted afterwards: never a folder the user already has
        raise MobileBuildError(f"scratch folder {scratch} already exists; name a new one")
    scratch.mkdir(parents=True)
    return scratch


def repository_files(root, exclude=()):
    """The repository's sources, relative to `root`: git's tracked and untracked-but-not-ignored files where `root`
    is in a git work tree, else every file; build state (artifacts/, .mobilebuild/, doit's database, caches, virtual
    environments) and the `exclude`d folders left out."""
    root = Path(root)
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = [p.relative_to(root).as_posix() for p in _walk(root)]
    paths = [PurePosixPath(path) for path in listed if path]
    environments = {path.parent for path in paths if path.name == "pyvenv.cfg"}
    excluded = [Path(folder).resolve() for folder in exclude]
    return sorted(path.as_posix() for path in paths
                  if not _is_state(path) and not environments & set(path.parents) and (root / path).is_file()
                  and not any((root / path).resolve().is_relative_to(folder) for folder in excluded))


def _walk(root):
    for folder, subfolders, names in os.walk(root):
        # a virtual environment (the README's .venv) is not a source
        subfolders[:] = [d for d in subfolders if not Path(folder, d, "pyvenv.cfg").exists()]
        yield from (Path(folder, name) for name in names)


def _is_state(path):
    return path.parts[0] in STATE_AT_TOP or any(fnmatch.fnmatch(part, pattern)
                                                for part in path.parts for pattern in STATE_ANYWHERE)


def _warn_about_changes(scratch, files):
    """A recipe or toolchain that changed since the release explains a difference before the build shows it."""
    seen = set()
    for entry in files.values():
        recipe_file = scratch / entry["recipe_file"]
        if entry["recipe_file"] in seen:
            continue
        seen.add(entry["recipe_file"])
        if not recipe_file.is_file():
            _progress(f"warning: {entry['recipe_file']} is not in the repository any more")
        elif store.sha256_file(recipe_file) != entry["recipe_sha256"]:
            _progress(f"warning: {entry['recipe_file']} changed since the release")
    recorded = next(iter(files.values()))["toolchain"] if files else None
    if recorded is not None and recorded != toolchain.versions():
        _progress(f"warning: the toolchain changed since the release ({_toolchain_change(recorded)})")


def _build(scratch, tasks):
    """Build `tasks` in the scratch copy, from nothing: no doit state, the shared cache off."""
    _progress(f"building {len(tasks)} artifacts from scratch: doit {' '.join(tasks)}")
    env = {**os.environ, "MOBILEBUILD_CACHE": "off"}
    tail = collections.deque(maxlen=10)  # what a failed build's last lines said
    started = 0
    with subprocess.Popen([sys.executable, "-m", "doit", *tasks], cwd=scratch, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as build:
        for line in build.stdout:  # each task as it starts: the build takes minutes
            tail.append(line.rstrip())
            if line.startswith(".  "):
                started += 1
                _progress(f"task {started}: {line[3:].strip()}")
    if build.returncode != 0:
        _progress(f"the scratch build failed (exit status {build.returncode}):")
        for line in tail:
            _progress(f"  {line}")


def _progress(message):
    print(f"verify-release: {message}", file=sys.stderr, flush=True)


# -- commands -----------------------------------------------------------------------------------------------------


def release_command(argv, root="."):
    parser = argparse.ArgumentParser(prog="mobilebuild release", description="Copy the built, verified artifacts "
                                     f"into a release folder with {RELEASE_FILE} (run `doit` first).")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"default: {DEFAULT_OUT}/")
    parser.add_argument("--recipe", action="append", metavar="NAME", help="release this recipe (repeatable; "
                        "default: every recipe)")
    parser.add_argument("--target", action="append", metavar="ID", help="release this target: an id such as "
                        "xnnpack, or <recipe>-<id> (repeatable; default: every target)")
    parser.add_argument("--allow-failed", action="store_true", help="release targets that failed or lack "
                        "verification too")
    parser.add_argument("--signing-key", metavar="KEY", help="sign release.json with this Ed25519 private key (its "
                        f"file, as `mobilebuild keygen` writes it; default: ${SIGNING_KEY_VARIABLE})")
    options = parser.parse_args(argv)
    refused = []
    try:
        key = signing_key_from_environment(options.signing_key)
        document = collect(root, options.out, options.recipe, options.target, options.allow_failed, key)
    except Refused as exc:
        document, refused = exc.document, exc.errors
    except RecipeErrors as exc:
        for error in exc.errors:
            print(error, file=sys.stderr)
        return 1
    except MobileBuildError as exc:
        print(f"mobilebuild release: {exc}", file=sys.stderr)
        return 1
    files = (document or {}).get("files", {})
    for path, entry in sorted(files.items()):
        print(f"{path}  {entry['sha256']}  {entry['bytes']} bytes  verification: "
              f"{(entry['verification'] or {}).get('status', 'none')}")
    if files:
        print(f"released {len(files)} files to {options.out}" + (f", signed by {key.name}" if key else ""))
    for error in refused:
        print(f"mobilebuild release: {error}", file=sys.stderr)
    return 1 if refused else 0


def verify_release_command(argv, root="."):
    parser = argparse.ArgumentParser(prog="mobilebuild verify-release", description=f"Check {RELEASE_FILE}'s "
                                     "signature and the release's files against it, then rebuild the repository "
                                     "in a scratch folder and compare.")
    parser.add_argument("release", type=Path, help="the release folder")
    parser.add_argument("--trusted-key", action="append", metavar="NAME:BASE64", help="a public key the release "
                        f"may be signed with (repeatable; default: ${TRUSTED_KEYS_VARIABLE})")
    parser.add_argument("--signature-only", action="store_true", help="check the signature and every file's hash, "
                        "and rebuild nothing (seconds)")
    parser.add_argument("--keep-scratch", action="store_true", help="keep the scratch build")
    parser.add_argument("--scratch", type=Path, help="build here (a folder that does not exist yet) instead of in "
                        "a temporary folder")
    options = parser.parse_args(argv)
    try:
        trusted = signing.KeyRing.parse(options.trusted_key or [os.environ.get(TRUSTED_KEYS_VARIABLE, "")],
                                        "--trusted-key")
        if options.signature_only and not trusted:
            raise MobileBuildError(f"--signature-only needs the release key's public key: --trusted-key "
                                   f"NAME:BASE64 (or ${TRUSTED_KEYS_VARIABLE})")
        if options.signature_only:
            signer = check_signature(options.release, trusted)
            differences = check_release_folder(options.release, read_release(options.release))
        else:
            differences = verify(root, options.release, options.scratch, options.keep_scratch, trusted)
    except SignatureRefused as exc:
        print(f"mobilebuild verify-release: {exc}", file=sys.stderr)
        return 1
    except MobileBuildError as exc:
        print(f"mobilebuild verify-release: {exc}", file=sys.stderr)
        return 2
    for difference in differences:
        print(difference.line())
    if differences:
        return 1
    count = len(read_release(options.release)["files"])
    if options.signature_only:
        print(f"{options.release}: signed by {signer}; {count} files and the provenance match {RELEASE_FILE} (not "
              "rebuilt: --signature-only)")
    else:
        checked = "signature checked" if trusted else "signature not checked: no --trusted-key"
        print(f"{options.release}: {count} files intact and rebuilt byte for byte ({checked})")
    return 0


def remove(out_dir=DEFAULT_OUT):
    """`doit clean release`: delete the release folder, and nothing that is not a release."""
    out_dir = Path(out_dir)
    if out_dir.is_dir() and _is_release(out_dir):
        shutil.rmtree(out_dir)
