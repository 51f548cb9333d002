"""manifest.json: what a recipe built, with hashes, sizes, the toolchain that built it, and what verification and
benchmarking found. No torch here."""

import json
import os
from pathlib import PurePosixPath

from mobilebuild import store
from mobilebuild.plan import graph, toolchain


def relative(path):
    return PurePosixPath(path).relative_to(graph.ARTIFACTS_DIR).as_posix()


def describe(entry):
    return {
        "stage": entry["stage"],
        "backend": entry.get("backend"),
        "runtime": entry.get("runtime"),
        "target": entry.get("target"),
        "path": relative(entry["path"]),
        "sha256": store.sha256_file(entry["path"]),
        "bytes": os.path.getsize(entry["path"]),
    }


def read_result(path, subject):
    """A verify or bench result about the current `subject` file, or None where there is none: not produced yet,
    or left from an earlier build of the subject (a result names the sha256 of what it measured)."""
    try:
        with open(path) as handle:
            result = json.load(handle)
    except (OSError, ValueError):
        return None
    return result if result.get("artifact_sha256") == store.sha256_file(subject) else None


def _target(target, verification):
    # the interpreter is a path of this machine's; an error, the failure of the target's chain in this run (written
    # by build/actions.write_manifests_despite)
    described = {key: value for key, value in target.items() if key not in ("interpreter", "error")}
    built = os.path.exists(target["path"]) and not target.get("error")  # a file there is from an earlier build
    if target.get("tokenizer"):  # a language model's, shipped beside it
        described["tokenizer"] = relative(target["tokenizer"])
    described.update(path=relative(target["path"]), bytes=os.path.getsize(target["path"]) if built else None,
                     status=(verification or {}).get("status", "not verified"),
                     outputs=(verification or {}).get("output_spec"))
    if target.get("error"):
        described.update(status="failed", reason=target["error"])
    if target["interpreter"]:  # built by another interpreter (`toolchain:`): its versions, not this one's
        described["toolchain"] = toolchain.versions(target["interpreter"])
    return described


def run(inputs, config, output):
    subjects = {t["target"]: t["path"] for t in config.targets}
    verification = {target: read_result(path, subjects[target]) for target, path in config.verification.items()}
    benchmarks = {target: read_result(path, subjects.get(target, config.checkpoint))
                  for target, path in config.benchmarks.items()}
    layers = {target: read_result(path, subjects[target]) for target, path in (config.layers or {}).items()}
    document = {
        "recipe": config.recipe,
        "recipe_file": config.recipe_file,
        "recipe_sha256": config.recipe_sha256,
        "inputs": config.inputs,
        **({"outputs": config.outputs} if config.outputs else {}),
        "toolchain": toolchain.versions(),
        "artifacts": [describe(entry) for entry in config.artifacts if os.path.exists(entry["path"])],
        "targets": [_target(t, verification[t["target"]]) for t in config.targets],
        "verification": {k: v for k, v in verification.items() if v is not None},
        "benchmarks": {k: v for k, v in benchmarks.items() if v is not None},
    }
    if config.layers:  # the per-layer comparisons of int8 artifacts (worker/stages/layers.py)
        document["layers"] = {k: v for k, v in layers.items() if v is not None}
    if config.arm64:  # each CPU artifact on emulated ARM CPUs (worker/stages/arm64.py)
        document["arm64"] = {target: found for target, cpus in config.arm64.items()
                             if (found := {cpu: result for cpu, path in cpus.items()
                                           if (result := read_result(path, subjects[target])) is not None})}
    with open(output, "w") as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write("\n")
