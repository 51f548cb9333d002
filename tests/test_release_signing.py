"""Signed releases and their provenance, on release folders of real files made here with real Ed25519 keys: what an
app's CI runs on download (`verify-release --signature-only`) passes on an intact release and fails, one line naming
the file, on a flipped byte, an edited release.json or another key; it never imports torch. The releases of a real
build are in test_release.py."""

import copy
import hashlib
import json
import os
import subprocess
import sys

import pytest

from mobilebuild import signing
from mobilebuild.errors import MobileBuildError
from mobilebuild.results import provenance, release

RELEASE_KEY = signing.PrivateKey.generate("release-1")
OTHER_KEY = signing.PrivateKey.generate("release-1")  # the same name, another key: what a forger would try
TOOLCHAIN = {"python": "3.11.7", "torch": "2.12.1", "executorch": "1.3.1", "onnxruntime": "1.23.0",
             "mobilebuild": "0.1.0", "stages_sha256": "ab" * 32}
ARTIFACTS = {"tiny/tiny-xnnpack.ptl": b"a TorchScript Lite archive" * 40, "tiny/tiny-xnnpack.pte": b"ExecuTorch" * 99}


def entry(path, data):
    target = path.rsplit("-", 1)[1].replace(".", "-")
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "recipe": "tiny",
            "recipe_file": "recipes/tiny.yaml", "recipe_sha256": "cd" * 32, "target": target,
            "sources": {"recipes/tiny.yaml": "cd" * 32, "tinynet.py": "ef" * 32},
            "chain": [{"stage": "optimize", "task": f"optimize:tiny-{target}", "path": path,
                       "sha256": hashlib.sha256(data).hexdigest()}],
            "toolchain": TOOLCHAIN, "verification": {"status": "passed", "metrics": {"sqnr_db": 41.5}},
            "benchmark": {"status": "ok", "median_ms": 0.25}}


def make_release(folder, key=RELEASE_KEY):
    """A release folder as `collect` writes it: the artifacts, release.json, the provenance, the signature."""
    folder.mkdir()
    for path, data in ARTIFACTS.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return release._describe(folder, {path: entry(path, data) for path, data in ARTIFACTS.items()}, key)


@pytest.fixture
def released(tmp_path):
    make_release(tmp_path / "release")
    return tmp_path / "release"


def verify_signature_only(folder, *keys, env=None):
    return subprocess.run([sys.executable, "-m", "mobilebuild.cli", "verify-release", str(folder), "--signature-only",
                           *(arg for key in keys for arg in ("--trusted-key", key.public().text()))],
                          capture_output=True, text=True, cwd=folder.parent, env={**os.environ, **(env or {})})


def test_a_signed_release_passes_signature_only_without_torch(released, poisoned_torch):
    result = verify_signature_only(released, RELEASE_KEY, env={
        "PYTHONPATH": os.pathsep.join(filter(None, [poisoned_torch["PYTHONPATH"], os.environ.get("PYTHONPATH")]))})
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"{released}: signed by release-1; 2 files and the provenance match release.json (not "
                             "rebuilt: --signature-only)\n")


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_an_artifact_fails_naming_it(released):
    flip_a_byte(released / "tiny/tiny-xnnpack.pte")
    result = verify_signature_only(released, RELEASE_KEY)
    assert result.returncode == 1
    expected = hashlib.sha256(ARTIFACTS["tiny/tiny-xnnpack.pte"]).hexdigest()
    got = hashlib.sha256((released / "tiny/tiny-xnnpack.pte").read_bytes()).hexdigest()
    assert result.stdout == f"tiny/tiny-xnnpack.pte: released file: sha256 {got}, release.json says {expected}\n"


def test_an_edited_release_json_fails_naming_it(released):
    document = json.loads((released / "release.json").read_text())
    document["files"]["tiny/tiny-xnnpack.ptl"]["verification"]["status"] = "passed "  # one byte more
    (released / "release.json").write_text(release.dumps(document))
    result = verify_signature_only(released, RELEASE_KEY)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"mobilebuild verify-release: {released}/release.json: its signature by release-1 does "
                             "not match (the file was changed after it was signed)\n")


@pytest.mark.parametrize("signer, message", [
    (OTHER_KEY, "its signature by release-1 does not match (the file was changed after it was signed)"),
    (signing.PrivateKey.generate("laptop"), "signed by 'laptop', a key not trusted here (trusted: release-1)"),
    (None, "unsigned (no valid release.json.sig beside it)"),
])
def test_a_release_signed_with_another_key_or_unsigned_fails_naming_release_json(tmp_path, signer, message):
    make_release(tmp_path / "release", signer)
    result = verify_signature_only(tmp_path / "release", RELEASE_KEY)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"mobilebuild verify-release: {tmp_path}/release/release.json: {message}\n"


def test_a_rotated_key_ring_accepts_the_old_and_the_new_key(tmp_path):
    new = signing.PrivateKey.generate("release-2")
    make_release(tmp_path / "old")
    make_release(tmp_path / "new", new)
    ring = signing.KeyRing([RELEASE_KEY.public(), new.public()])
    assert [release.check_signature(tmp_path / name, ring) for name in ("old", "new")] == ["release-1", "release-2"]


def test_signature_only_needs_a_trusted_key(released):
    result = verify_signature_only(released)
    assert result.returncode == 2
    assert result.stderr == ("mobilebuild verify-release: --signature-only needs the release key's public key: "
                             "--trusted-key NAME:BASE64 (or $MOBILEBUILD_RELEASE_TRUSTED_KEYS)\n")


def test_the_provenance_is_signed_through_release_json_and_checked(released):
    statement = json.loads((released / provenance.STATEMENT_FILE).read_text())
    statement["predicate"]["runDetails"]["builder"]["id"] = "urn:someone-else"
    (released / provenance.STATEMENT_FILE).write_text(release.dumps(statement))
    result = verify_signature_only(released, RELEASE_KEY)
    assert result.returncode == 1 and result.stdout.startswith("provenance.intoto.json: released file: sha256 ")


def test_release_folders_are_byte_identical_and_hold_no_secret(tmp_path):
    first, second = make_release(tmp_path / "first"), make_release(tmp_path / "second")
    assert first == second
    names = ["release.json", "release.json.sig", "provenance.intoto.json"]
    assert [(tmp_path / "first" / n).read_bytes() for n in names] == [(tmp_path / "second" / n).read_bytes()
                                                                       for n in names]
    seed = RELEASE_KEY.text().split(":")[1]
    for path in (tmp_path / "first").rglob("*"):
        assert not path.is_file() or seed.encode() not in path.read_bytes()


def test_the_provenance_is_an_in_toto_statement_of_slsa_provenance(released):
    statement = json.loads((released / provenance.STATEMENT_FILE).read_text())
    provenance.validate(statement)  # the published protobuf schema, parsed strictly, and the required fields
    assert (statement["_type"], statement["predicateType"]) == (
        "https://in-toto.io/Statement/v1", "https://slsa.dev/provenance/v1")
    assert statement["subject"] == [{"name": path, "digest": {"sha256": hashlib.sha256(data).hexdigest()}}
                                    for path, data in sorted(ARTIFACTS.items())]
    definition, run = statement["predicate"]["buildDefinition"], statement["predicate"]["runDetails"]
    assert definition["externalParameters"]["command"] == "doit optimize:tiny-xnnpack-pte optimize:tiny-xnnpack-ptl"
    dependencies = {d["name"]: d for d in definition["resolvedDependencies"]}
    assert dependencies["tinynet.py"]["digest"] == {"sha256": "ef" * 32}
    assert dependencies["torch"]["uri"] == "pkg:pypi/torch@2.12.1"
    assert dependencies["executorch"]["uri"] == "pkg:pypi/executorch@1.3.1"
    assert dependencies["python"]["uri"] == "pkg:generic/python@3.11.7"
    assert run["builder"]["id"].startswith("urn:mobilebuild:builder:")
    assert {b["annotations"]["verification"]["status"] for b in run["byproducts"]} == {"passed"}


@pytest.mark.parametrize("damage, problem", [
    (lambda s: s["predicate"]["buildDefinition"].update(extra=1), 'has no field named "extra"'),
    (lambda s: s["predicate"]["runDetails"]["builder"].pop("id"), "runDetails.builder.id is required"),
    (lambda s: s["predicate"]["buildDefinition"].pop("externalParameters"),
     "buildDefinition.externalParameters is required"),
    (lambda s: s.update(subject=[]), "At least one subject required"),
    (lambda s: s["subject"][0].update(digest={}), "At least one digest required"),
    (lambda s: s.update(predicateType="https://slsa.dev/provenance/v0.2"), "not an https://in-toto.io/Statement/v1"),
])
def test_validation_refuses_what_the_schema_does_not_allow(released, damage, problem):
    statement = json.loads((released / provenance.STATEMENT_FILE).read_text())
    damaged = copy.deepcopy(statement)
    damage(damaged)
    with pytest.raises(MobileBuildError, match=problem):
        provenance.validate(damaged)


def test_keygen_writes_a_private_key_only_its_owner_reads_and_prints_the_public_key(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mobilebuild.cli", "keygen", "ci-2027"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    key = signing.PrivateKey.load(tmp_path / "ci-2027.key")
    assert (tmp_path / "ci-2027.key").stat().st_mode & 0o777 == 0o600
    assert f"public key: {key.public().text()}" in result.stdout
    assert f'MOBILEBUILD_CACHE_TRUSTED_KEYS="{key.public().text()}"' in result.stdout
    assert key.text().split(":")[1] not in result.stdout + result.stderr
    again = subprocess.run([sys.executable, "-m", "mobilebuild.cli", "keygen", "ci-2027"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert again.returncode == 1 and "cannot write ci-2027.key: File exists (choose another --out)" in again.stderr
    assert signing.PrivateKey.load(tmp_path / "ci-2027.key").text() == key.text()  # never replaced
