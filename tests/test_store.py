"""Atomic writes: a failed or interrupted write never leaves a file at the target path."""

import os

import pytest

from mobilebuild import store


def test_a_successful_write_replaces_the_target(tmp_path):
    target = tmp_path / "deep" / "a.ptl"
    store.write_bytes(target, b"old")
    store.write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in target.parent.iterdir()] == ["a.ptl"]


def test_a_failed_write_leaves_the_previous_file_and_no_partial(tmp_path):
    target = tmp_path / "a.ptl"
    store.write_bytes(target, b"good")
    with pytest.raises(RuntimeError):
        with store.atomic_output(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"good"
    assert [p.name for p in tmp_path.iterdir()] == ["a.ptl"]


def test_partials_of_killed_builds_are_recognisable_and_removable(tmp_path):
    target = tmp_path / "a.ptl"
    with store.atomic_output(target) as tmp:
        assert store.TEMP_MARKER in tmp.name and tmp.parent == tmp_path
        (tmp_path / tmp.name.replace("a.ptl", "b.ptl")).write_bytes(b"left by SIGKILL")
    store.remove_partials(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["a.ptl"]


def test_sha256(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    assert store.sha256_file(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_artifacts_get_the_usual_permissions(tmp_path):
    target = tmp_path / "a.ptl"
    store.write_bytes(target, b"x")
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
