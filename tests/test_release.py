"""Releases: the shipped artifacts of a real build with a deterministic release.json, refusals when the build is not
current, and verify-release rebuilding the sources in a scratch folder to compare byte for byte."""

import json
import shutil
import subprocess

import pytest
from conftest import Project, tiny_recipe

from mobilebuild import signing, store
from mobilebuild.errors import MobileBuildError
from mobilebuild.results import provenance, release

pytestmark = pytest.mark.slow  # a built project, and verify-release rebuilding it

SHIPPED = ["tiny/tiny-qnnpack.ptl", "tiny/tiny-xnnpack.ptl"]
KEY = signing.PrivateKey.generate("release-1")  # a real Ed25519 release key, made here


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One built tiny project (a git work tree) shared by the tests; tests that change it work on a copy."""
    project = Project(tmp_path_factory.mktemp("built"))
    project.write_recipe(tiny_recipe())
    subprocess.run(["git", "init", "-q"], cwd=project.root, check=True)
    (project.root / ".gitignore").write_text("artifacts/\n.doit.db*\n.mobilebuild/\n/release*/\n")
    project.doit()
    return project


@pytest.fixture
def copy(built, tmp_path):
    """A copy of the built project, artifacts and doit state included, to damage freely."""
    project = Project.__new__(Project)
    project.root = tmp_path / "copy"
    shutil.copytree(built.root, project.root)
    return project


def manifest_of(project):
    return json.loads(project.artifact("tiny/manifest.json").read_text())


def test_release_copies_each_target_artifact_with_how_it_was_made(built, tmp_path):
    out = tmp_path / "release"
    document = release.collect(built.root, out)
    assert sorted(document["files"]) == SHIPPED
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "provenance.intoto.json", "release.json", *SHIPPED]  # unsigned: no release key given
    assert json.loads((out / "release.json").read_text()) == document
    manifest = manifest_of(built)
    for path, entry in document["files"].items():
        assert (out / path).read_bytes() == built.artifact(path).read_bytes()
        assert entry["sha256"] == store.sha256_file(out / path)
        assert entry["bytes"] == (out / path).stat().st_size
        assert (entry["recipe"], entry["recipe_file"]) == ("tiny", "recipes/tiny.yaml")
        assert entry["recipe_sha256"] == store.sha256_file(built.root / "recipes/tiny.yaml")
        assert entry["sources"] == {"recipes/tiny.yaml": entry["recipe_sha256"],
                                    "tinynet.py": store.sha256_file(built.root / "tinynet.py")}
        assert entry["toolchain"] == manifest["toolchain"]
        assert entry["chain"][-1]["sha256"] == entry["sha256"]
        for step in entry["chain"]:
            assert step["sha256"] == store.sha256_file(built.artifact(step["path"]))
        assert entry["verification"]["status"] == "passed"
        assert entry["verification"]["metrics"]["sqnr_db"] > 15
        assert entry["benchmark"]["threads"] == 1 and entry["benchmark"]["iters"] == 5
        assert 0 < entry["benchmark"]["median_ms"] <= entry["benchmark"]["p90_ms"]
        # what an app developer needs to feed the artifact and read its results
        assert entry["inputs"] == [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32",
                                    "memory_format": "contiguous"}]
        assert entry["fixed_shape"] is None  # no dynamic dims
        assert entry["outputs"] == [{"name": "output", "shape": [1, 5], "dtype": "float32"}]
    fp32, int8 = document["files"]["tiny/tiny-xnnpack.ptl"], document["files"]["tiny/tiny-qnnpack.ptl"]
    assert (fp32["target"], fp32["backend"], fp32["runtime"], fp32["precision"]) == (
        "xnnpack", "xnnpack", "pytorch-mobile", "fp32")
    assert (int8["target"], int8["precision"], int8["quantization"]["mode"]) == ("qnnpack", "int8", "static")
    assert [step["task"] for step in fp32["chain"]] == [
        "checkpoint:tiny", "fuse:tiny", "script:tiny-fp32", "optimize:tiny-xnnpack"]
    assert [step["stage"] for step in int8["chain"]] == ["checkpoint", "fuse", "quantize", "script", "optimize"]


def test_release_json_has_no_machine_paths_and_two_signed_releases_are_byte_identical(built, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    release.collect(built.root, first, signing_key=KEY)
    (first / "stray.txt").write_text("left from an earlier release")
    release.collect(built.root, second, signing_key=KEY)
    release.collect(built.root, first, signing_key=KEY)  # replaces the earlier release whole
    for name in ("release.json", "release.json.sig", "provenance.intoto.json"):
        text = (first / name).read_text()
        assert text == (second / name).read_text()
        assert str(built.root) not in text and str(tmp_path) not in text
    assert not (first / "stray.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "second"]  # no staging folder left


def test_release_selects_recipes_and_targets(built, tmp_path):
    assert list(release.collect(built.root, tmp_path / "a", targets=["xnnpack"])["files"]) == [SHIPPED[1]]
    assert list(release.collect(built.root, tmp_path / "b", recipes=["tiny"], targets=["tiny-qnnpack"])["files"]) == [
        SHIPPED[0]]
    with pytest.raises(MobileBuildError, match="no target 'vulkan' in the selected recipes"):
        release.collect(built.root, tmp_path / "c", targets=["vulkan"])
    with pytest.raises(MobileBuildError, match=r"no recipe named 'other' \(recipes: tiny\)"):
        release.collect(built.root, tmp_path / "c", recipes=["other"])
    assert not (tmp_path / "c").exists()


def test_a_changed_artifact_is_refused_in_one_line_and_the_rest_released(copy, tmp_path, capsys):
    shipped = copy.artifact("tiny/tiny-qnnpack.ptl")
    shipped.write_bytes(shipped.read_bytes() + b"\0")
    out = tmp_path / "release"
    assert release.release_command(["--out", str(out)], root=copy.root) == 1
    printed = capsys.readouterr()
    assert printed.err == ("mobilebuild release: artifacts/tiny/tiny-qnnpack.ptl does not match "
                           "artifacts/tiny/manifest.json (stale manifest): run `doit` first\n")
    assert printed.out.splitlines()[-1] == f"released 1 files to {out}"
    # the qnnpack file was copied before its refusal: it is not in the release, and no staging folder remains
    assert sorted(json.loads((out / release.RELEASE_FILE).read_text())["files"]) == ["tiny/tiny-xnnpack.ptl"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "provenance.intoto.json", "release.json", "tiny", "tiny/tiny-xnnpack.ptl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "release"]


def test_every_refusal_is_listed_one_line_each(copy, tmp_path):
    manifest = manifest_of(copy)
    for target in manifest["targets"]:
        target["status"] = "failed"
        manifest["verification"][target["target"]].update(status="failed", failures=["sqnr_db 1.0 < 40"])
    copy.artifact("tiny/manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(release.Refused) as refused:
        release.collect(copy.root, tmp_path / "out")
    assert [str(error) for error in refused.value.errors] == [
        f"tiny-{target}: verification failed (sqnr_db 1.0 < 40); fix it, or pass --allow-failed to release it anyway"
        for target in ("xnnpack", "qnnpack")]
    assert refused.value.document is None and not (tmp_path / "out").exists()


def test_missing_artifacts_and_changed_recipes_are_refused(copy, tmp_path):
    copy.artifact("tiny/scripted-fp32.pt").unlink()
    with pytest.raises(MobileBuildError, match=r"^artifacts/tiny/scripted-fp32.pt is missing: run `doit` first$"):
        release.collect(copy.root, tmp_path / "out", targets=["xnnpack"])
    assert release.collect(copy.root, tmp_path / "out", targets=["qnnpack"])  # its chain does not need that file
    copy.write_recipe(tiny_recipe(benchmark={"warmup": 1, "iters": 6}))
    with pytest.raises(MobileBuildError, match=r"manifest.json is stale: recipes/tiny.yaml changed since it was "
                                               r"built; run `doit` first$"):
        release.collect(copy.root, tmp_path / "other")


def test_a_manifest_from_another_toolchain_is_refused(copy, tmp_path):
    manifest = manifest_of(copy)
    manifest["toolchain"]["torch"] = "2.11.0"
    copy.artifact("tiny/manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MobileBuildError, match=r"built with another toolchain \(torch 2.11.0 -> 2.12.1\); run `doit` "
                                               r"first$"):
        release.collect(copy.root, tmp_path / "out")


def test_release_command_lists_each_released_file(built, tmp_path, capsys):
    out = tmp_path / "out"
    assert release.release_command(["--out", str(out), "--target", "xnnpack"], root=built.root) == 0
    sha256 = store.sha256_file(out / SHIPPED[1])
    assert capsys.readouterr().out.splitlines() == [
        f"tiny/tiny-xnnpack.ptl  {sha256}  {(out / SHIPPED[1]).stat().st_size} bytes  verification: passed",
        f"released 1 files to {out}",
    ]


def test_failed_verification_is_refused_unless_allowed(copy, tmp_path):
    manifest = manifest_of(copy)
    manifest["targets"][1]["status"] = "failed"
    manifest["verification"]["qnnpack"].update(status="failed", failures=["sqnr_db 17.3 < 40"])
    copy.artifact("tiny/manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MobileBuildError) as refused:
        release.collect(copy.root, tmp_path / "out")
    assert str(refused.value) == ("tiny-qnnpack: verification failed (sqnr_db 17.3 < 40); fix it, or pass "
                                  "--allow-failed to release it anyway")
    document = release.collect(copy.root, tmp_path / "out", allow_failed=True)
    assert document["files"]["tiny/tiny-qnnpack.ptl"]["verification"]["status"] == "failed"


def test_an_existing_folder_that_is_not_a_release_is_never_replaced(built, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(MobileBuildError, match="exists and is not a release"):
        release.collect(built.root, precious)
    assert [p.name for p in precious.iterdir()] == ["notes.txt"]


def test_verify_release_checks_the_signature_then_rebuilds_the_sources_byte_for_byte(built, tmp_path, capsys):
    out, scratch = built.root / "release", tmp_path / "scratch"
    release.collect(built.root, out, signing_key=KEY)
    assert release.verify(built.root, out, scratch=scratch, trusted_keys=signing.KeyRing([KEY.public()])) == []
    progress = capsys.readouterr().err
    assert progress.startswith("verify-release: release.json signed by release-1\n")
    # git's listing: the recipe, the factory, dodo.py and .gitignore; not the release, artifacts or doit's state
    assert "verify-release: copying 4 source files" in progress
    assert "doit optimize:tiny-qnnpack optimize:tiny-xnnpack" in progress
    assert "verify-release: task 1: checkpoint:tiny" in progress  # each task as it starts
    assert not scratch.exists()


def test_verify_release_reports_altered_files_and_rebuilds_that_differ(copy, tmp_path, capsys):
    out = tmp_path / "release"
    document = release.collect(copy.root, out)
    shipped = out / "tiny/tiny-xnnpack.ptl"
    shipped.write_bytes(shipped.read_bytes()[:-1])
    (out / "tiny/extra.ptl").write_bytes(b"not released")
    # the recipe's calibration changes after the release: the int8 artifact no longer rebuilds the same
    copy.write_recipe(tiny_recipe(quantize={"calibration": {"source": "random", "batches": 3, "seed": 0}}))
    status = release.verify_release_command([str(out)], root=copy.root)
    captured = capsys.readouterr()
    expected = {path: entry["sha256"] for path, entry in document["files"].items()}
    lines = captured.out.splitlines()
    assert status == 1
    altered, released = store.sha256_file(shipped), expected["tiny/tiny-xnnpack.ptl"]
    assert lines[:2] == [
        f"tiny/tiny-xnnpack.ptl: released file: sha256 {altered}, release.json says {released}",
        f"tiny/extra.ptl: not listed in release.json (sha256 {store.sha256_file(out / 'tiny/extra.ptl')})",
    ]
    assert len(lines) == 3  # the xnnpack artifact itself rebuilt identically
    assert lines[2].startswith("tiny/tiny-qnnpack.ptl: rebuilt from the recipes: sha256 ")
    assert lines[2].endswith(f", release.json says {expected['tiny/tiny-qnnpack.ptl']}")
    assert "warning: recipes/tiny.yaml changed since the release" in captured.err


def test_verify_release_needs_a_release(built, tmp_path, capsys):
    assert release.verify_release_command([str(tmp_path)], root=built.root) == 2
    assert capsys.readouterr().err.startswith(f"mobilebuild verify-release: {tmp_path} is not a release")


def test_repository_files_are_the_sources_without_build_state(tmp_path):
    for name in ["dodo.py", "recipes/a.yaml", "artifacts/a/x.ptl", ".doit.db", ".mobilebuild/build.lock",
                 "pkg/__pycache__/m.pyc", ".venv/pyvenv.cfg", ".venv/lib/site.py", "release/release.json",
                 "scratch.log"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    expected = ["dodo.py", "recipes/a.yaml", "scratch.log"]
    assert release.repository_files(tmp_path, exclude=[tmp_path / "release"]) == expected
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("*.log\n")
    # git lists the virtual environment (not ignored here): it is still left out
    assert release.repository_files(tmp_path, exclude=[tmp_path / "release"]) == [
        ".gitignore", "dodo.py", "recipes/a.yaml"]


def test_release_json_is_sorted_and_ends_with_a_newline(built, tmp_path):
    release.collect(built.root, tmp_path / "out")
    text = (tmp_path / "out" / "release.json").read_text()
    assert text == release.dumps(json.loads(text))
    assert list(json.loads(text)) == ["files", "format", "provenance"]


def test_a_signed_release_of_a_real_build_passes_signature_only_and_fails_once_altered(built, tmp_path, capsys):
    key_file = tmp_path / "release-1.key"
    KEY.write(key_file)
    out = tmp_path / "release"
    assert release.release_command(["--out", str(out), "--signing-key", str(key_file)], root=built.root) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"released 2 files to {out}, signed by release-1"
    check = [str(out), "--signature-only", "--trusted-key", KEY.public().text()]
    assert release.verify_release_command(check, root=tmp_path) == 0  # no repository needed
    assert "signed by release-1; 2 files and the provenance match" in capsys.readouterr().out
    # the provenance: every artifact, the recipe and model source, the toolchain, the verdicts
    statement = json.loads((out / provenance.STATEMENT_FILE).read_text())
    provenance.validate(statement)
    document = json.loads((out / "release.json").read_text())
    assert {s["name"]: s["digest"]["sha256"] for s in statement["subject"]} == {
        path: entry["sha256"] for path, entry in document["files"].items()}
    dependencies = {d["name"]: d for d in statement["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert dependencies["tinynet.py"]["digest"]["sha256"] == store.sha256_file(built.root / "tinynet.py")
    assert dependencies["torch"]["uri"] == "pkg:pypi/torch@2.12.1"
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["command"] == (
        "doit optimize:tiny-qnnpack optimize:tiny-xnnpack")
    # nothing secret in the release, nor in what the build left
    seed = KEY.text().split(":")[1].encode()
    assert not [p for folder in (out, built.root) for p in folder.rglob("*") if p.is_file() and seed in p.read_bytes()]
    shipped = out / SHIPPED[0]
    shipped.write_bytes(shipped.read_bytes()[:-1] + bytes([shipped.read_bytes()[-1] ^ 1]))
    assert release.verify_release_command(check, root=tmp_path) == 1
    assert capsys.readouterr().out.startswith(f"{SHIPPED[0]}: released file: sha256 ")
