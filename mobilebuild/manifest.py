"""manifest.json: what a recipe built, with hashes, sizes and the toolchain that built it. No torch here."""

import json
import os
from pathlib import PurePosixPath

from mobilebuild import graph, store, toolchain


def describe(entry):
    return {
        "stage": entry["stage"],
        "backend": entry.get("backend"),
        "runtime": entry.get("runtime"),
        "target": entry.get("target"),
        "path": PurePosixPath(entry["path"]).relative_to(graph.ARTIFACTS_DIR).as_posix(),
        "sha256": store.sha256_file(entry["path"]),
        "bytes": os.path.getsize(entry["path"]),
    }


def run(inputs, config, output):
    document = {
        "recipe": config["recipe"],
        "recipe_sha256": config["recipe_sha256"],
        "toolchain": toolchain.versions(),
        "artifacts": [describe(entry) for entry in config["artifacts"]],
    }
    with open(output, "w") as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write("\n")
