"""SLSA build provenance of a release: an in-toto Statement v1 (https://in-toto.io/Statement/v1) whose predicate is
SLSA Provenance v1 (https://slsa.dev/provenance/v1), written beside release.json as provenance.intoto.json.

    subject                  every released artifact and its sha256
    buildDefinition          buildType; externalParameters: the recipes, targets and the exact command that rebuilds
                             the artifacts; internalParameters: what the stage workers fix (hash seed, threads);
                             resolvedDependencies: the recipe files and model source files with their sha256, and
                             the toolchain (interpreter, torch, ExecuTorch, ONNX Runtime... with versions)
    runDetails               builder: its id and the machine kind (CPU, cores, system); byproducts: each artifact's
                             verification verdict and benchmark summary, as annotations

It holds no timestamps and no absolute paths, and is written with sorted keys: releasing the same build twice gives
the same bytes. release.json records its sha256, and release.json's signature covers that.

`validate` checks a statement against the published schema: the in-toto attestation framework's protobuf
definitions of Statement v1, ResourceDescriptor v1 and SLSA Provenance v1, as the `in-toto-attestation` package
ships them, parsed strictly (an unknown field or a wrong type fails), then the fields the specification requires (as
the framework's own validators check them: a subject with a digest, buildType, externalParameters, builder.id).
"""

import json
import platform
import re

from mobilebuild.errors import MobileBuildError

STATEMENT_FILE = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
# What a mobilebuild release's externalParameters and internalParameters mean: docs/trust.md, "Provenance".
BUILD_TYPE = "urn:mobilebuild:release:v1"
BUILDER_ID = "urn:mobilebuild:builder:{system}-{machine}"
# The stage workers' fixed settings (engine/worker_pool.py): part of how the bytes came to be.
WORKER_SETTINGS = {"PYTHONHASHSEED": "0", "compute_threads": 1}
_SHA256 = re.compile(r"[0-9a-f]{64}")


def statement(files, sources, command):
    """The statement for release.json's `files`, the source files they were built from ({path: sha256}: recipes,
    model sources), and `command`, the exact command that rebuilds them."""
    from mobilebuild.worker.stages.bench import host  # no torch there

    machine = host()
    toolchains = {json.dumps(entry["toolchain"], sort_keys=True) for entry in files.values()}
    predicate = {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "recipes": sorted({entry["recipe_file"] for entry in files.values()}),
                "targets": sorted(f"{entry['recipe']}-{entry['target']}" for entry in files.values()
                                  if entry["target"]),  # not the files they ship with (a tokenizer)
                "command": command,
            },
            "internalParameters": {"stage_workers": WORKER_SETTINGS},
            "resolvedDependencies": [
                *({"name": path, "digest": {"sha256": digest}} for path, digest in sorted(sources.items())),
                *(descriptor for toolchain in sorted(toolchains)
                  for descriptor in _toolchain_descriptors(json.loads(toolchain))),
            ],
        },
        "runDetails": {
            "builder": {"id": BUILDER_ID.format(system=machine["system"].lower(), machine=machine["machine"]),
                        "version": {"mobilebuild": _mobilebuild_version(files), "python": platform.python_version()}},
            "byproducts": [{"name": f"verification of {path}", "digest": {"sha256": entry["sha256"]},
                            "annotations": {"verification": entry["verification"], "benchmark": entry["benchmark"],
                                            "machine": machine}}
                           for path, entry in sorted(files.items()) if entry["target"]],
        },
    }
    return {"_type": STATEMENT_TYPE, "predicateType": PREDICATE_TYPE, "predicate": predicate,
            "subject": [{"name": path, "digest": {"sha256": entry["sha256"]}} for path, entry in sorted(files.items())]}


def _toolchain_descriptors(versions):
    """The toolchain as resource descriptors: package URLs (purl) for the interpreter and the distributions, a
    digest for the stage code."""
    for name, version in sorted(versions.items()):
        if _SHA256.fullmatch(str(version)):
            yield {"name": name, "digest": {"sha256": version}}
        else:
            kind = "generic" if name == "python" else "pypi"
            yield {"name": name, "uri": f"pkg:{kind}/{name}@{version}"}


def _mobilebuild_version(files):
    return next(iter(files.values()))["toolchain"].get("mobilebuild", "unknown") if files else "unknown"


def validate(document, where=STATEMENT_FILE):
    """Raise MobileBuildError (one line naming `where`) unless `document` is an in-toto Statement v1 with a valid SLSA
    Provenance v1 predicate."""
    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement_pb2
    from in_toto_attestation.v1.statement import Statement

    try:
        parsed = json_format.ParseDict(document, statement_pb2.Statement())
        Statement.copy_from_pb(parsed).validate()
        if parsed.type != STATEMENT_TYPE or parsed.predicate_type != PREDICATE_TYPE:
            raise ValueError(f"not an {STATEMENT_TYPE} statement of {PREDICATE_TYPE}")
        provenance = json_format.ParseDict(document["predicate"], provenance_pb2.Provenance())
        _check_required(provenance)
    except (json_format.ParseError, ValueError, KeyError, TypeError) as exc:
        raise MobileBuildError(f"{where}: not valid SLSA provenance: {' '.join(str(exc).split())}") from None


def _check_required(provenance):
    """What SLSA Provenance v1 requires beyond the schema's types (Build L1)."""
    from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor

    if not provenance.HasField("build_definition") or not provenance.build_definition.build_type:
        raise ValueError("buildDefinition.buildType is required")
    if not provenance.build_definition.HasField("external_parameters"):
        raise ValueError("buildDefinition.externalParameters is required")
    if not provenance.HasField("run_details") or not provenance.run_details.builder.id:
        raise ValueError("runDetails.builder.id is required")
    for field, descriptors in (("resolvedDependencies", provenance.build_definition.resolved_dependencies),
                               ("builderDependencies", provenance.run_details.builder.builder_dependencies),
                               ("byproducts", provenance.run_details.byproducts)):
        for index, descriptor in enumerate(descriptors):
            try:
                ResourceDescriptor.copy_from_pb(descriptor).validate()
            except ValueError as exc:
                raise ValueError(f"{field}[{index}]: {exc}") from None
