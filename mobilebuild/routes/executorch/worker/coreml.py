"""Reproducible Core ML payloads in ExecuTorch programs.

Core ML payloads carry a random model identifier (uuid4, ExecuTorch), random .mlpackage item ids and the conversion
date, and their spec's metadata map in a per-process order (coremltools): two builds of one model would differ.
`reproducible_coreml` patches ExecuTorch's Core ML backend for the length of one lowering so that they do not.
"""

import contextlib
import hashlib
import json
import tempfile
import threading
import uuid
from pathlib import Path

CONVERSION_DATE = "com.github.apple.coremltools.conversion_date"


def _derived_uuid(*parts):
    digest = hashlib.sha256(b"\0".join(parts)).digest()
    return uuid.UUID(bytes=digest[:16], version=4)


def _mlmodel_digest(mlmodel):
    digest = hashlib.sha256(mlmodel.get_spec().SerializeToString(deterministic=True))
    weights = Path(mlmodel.weights_dir) if getattr(mlmodel, "weights_dir", None) else None
    for file in sorted(weights.rglob("*")) if weights and weights.is_dir() else []:
        if file.is_file():
            digest.update(file.relative_to(weights).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.digest()


def _normalize_manifest(package):
    """An .mlpackage's Manifest.json keys its items by fresh random UUIDs: derive them from the item paths."""
    manifest_path = Path(package) / "Manifest.json"
    if not manifest_path.is_file():
        return
    manifest = json.loads(manifest_path.read_text())
    renamed = {old: str(_derived_uuid(b"mlpackage-item", item["path"].encode()))
               for old, item in manifest.get("itemInfoEntries", {}).items()}
    manifest["itemInfoEntries"] = {renamed[old]: item for old, item in manifest["itemInfoEntries"].items()}
    if manifest.get("rootModelIdentifier") in renamed:
        manifest["rootModelIdentifier"] = renamed[manifest["rootModelIdentifier"]]
    manifest_path.write_text(json.dumps(manifest, indent=4, sort_keys=True))


def _serialize_specs_deterministically(package):
    """coremltools writes the model spec with protobuf's default serialization, where map fields (the metadata)
    come out in a per-process hash order."""
    from coremltools.proto import Model_pb2

    for spec_file in sorted(Path(package).rglob("*.mlmodel")):
        spec = Model_pb2.Model()
        spec.ParseFromString(spec_file.read_bytes())
        spec_file.write_bytes(spec.SerializeToString(deterministic=True))


@contextlib.contextmanager
def reproducible_coreml(delegate):
    """Lower for `delegate` reproducibly: for Core ML, the identifier becomes a digest of the Core ML model's content
    (the runtime caches compiled models by it, so equal ids must mean equal models), the item ids derive from their
    paths, the date is dropped and the spec is written with protobuf's deterministic serialization."""
    if delegate != "coreml":
        yield
        return
    with _COREML_PATCH_LOCK, _content_identified_coreml():  # the patch is process-wide: one lowering at a time
        yield


_COREML_PATCH_LOCK = threading.Lock()


class _TempfileIn:
    """The tempfile module, with gettempdir() answering one private directory."""

    def __init__(self, directory):
        self._directory = directory

    def gettempdir(self):
        return self._directory

    def __getattr__(self, name):
        return getattr(tempfile, name)


@contextlib.contextmanager
def _content_identified_coreml():
    from executorch.backends.apple.coreml.compiler import coreml_preprocess

    backend = coreml_preprocess.CoreMLBackend
    original = backend.__dict__["preprocess_model"]

    def preprocess_model(mlmodel, model_type):
        metadata = mlmodel.user_defined_metadata
        if CONVERSION_DATE in metadata:
            del metadata[CONVERSION_DATE]
        identifier = _derived_uuid(b"coreml-model", _mlmodel_digest(mlmodel))
        save = mlmodel.save

        def save_normalized(path):
            save(path)
            _normalize_manifest(path)
            _serialize_specs_deterministically(path)

        mlmodel.save = save_normalized
        real_uuid, real_tempfile = coreml_preprocess.uuid, coreml_preprocess.tempfile
        coreml_preprocess.uuid = type("DerivedUuid", (), {"uuid4": staticmethod(lambda: identifier)})
        # ExecuTorch works in <tmp>/executorch_<identifier> and removes it after: with a derived identifier, two
        # processes lowering one model (doit -n, two checkouts) would share, and delete, each other's directory.
        with tempfile.TemporaryDirectory(prefix="mobilebuild-coreml-") as scratch:
            coreml_preprocess.tempfile = _TempfileIn(scratch)
            try:
                return original.__func__(mlmodel, model_type)
            finally:
                coreml_preprocess.uuid, coreml_preprocess.tempfile = real_uuid, real_tempfile

    backend.preprocess_model = staticmethod(preprocess_model)
    try:
        yield
    finally:
        backend.preprocess_model = original
