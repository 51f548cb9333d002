"""The shared artifact cache on real fsspec filesystems: a local folder and memory://."""

import base64
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import uuid

import fsspec
import pytest

from mobilebuild import signing
from mobilebuild.engine import cache as cachemod
from mobilebuild.errors import MobileBuildError

BLOB = bytes(range(256)) * 400  # 100 kB


def key_of(text):
    return cachemod.entry_key({"stage": "fuse", "config": {"name": text}, "toolchain": {}}, {"model": "0" * 64})


@pytest.fixture(params=["local", "memory"])
def cache(request, tmp_path):
    if request.param == "local":
        yield cachemod.Cache(tmp_path / "cache")
        return
    url = f"memory://mobilebuild-test-{uuid.uuid4().hex}"
    yield cachemod.Cache(url)
    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "built" / "model.pt"
    path.parent.mkdir()
    path.write_bytes(BLOB)
    return path


def blob_path(cache, key, name="artifact"):
    return f"{cache.root}/v1/{key[:2]}/{key}/{name}"


def entry_exists(cache, key):
    return cache.fs.exists(f"{cache.root}/v1/{key[:2]}/{key}")


def test_a_stored_entry_is_fetched_with_identical_bytes_and_its_metadata(cache, source, tmp_path):
    key = key_of("a")
    assert cache.store(key, {"artifact": source}, {"output": "artifacts/m/fused.pt", "seconds": 1.5}) is True
    destination = tmp_path / "checkout" / "artifacts" / "fused.pt"
    assert cache.fetch(key, {"artifact": destination}) == {"output": "artifacts/m/fused.pt", "seconds": 1.5}
    assert destination.read_bytes() == BLOB
    assert [p.name for p in destination.parent.iterdir()] == ["fused.pt"]  # no temporary file left beside it


def test_a_miss_returns_none_and_writes_nothing(cache, tmp_path):
    destination = tmp_path / "out.pt"
    assert cache.fetch(key_of("never stored"), {"artifact": destination}) is None
    assert not destination.exists()


def test_an_entry_without_metadata_is_still_a_hit(cache, source, tmp_path):
    key = key_of("no meta")
    cache.store(key, {"artifact": source})
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) == {}


def test_several_files_in_one_entry(cache, source, tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"ok": true}')
    key = key_of("two files")
    cache.store(key, {"model": source, "report": other})
    outputs = {"model": tmp_path / "o" / "m.pt", "report": tmp_path / "o" / "r.json"}
    assert cache.fetch(key, outputs) == {}
    assert outputs["model"].read_bytes() == BLOB and outputs["report"].read_text() == '{"ok": true}'


def test_the_first_writer_wins_and_later_stores_keep_its_entry(cache, source, tmp_path):
    key = key_of("twice")
    second = tmp_path / "second.pt"
    second.write_bytes(b"different bytes")
    assert cache.store(key, {"artifact": source}, {"writer": 1}) is True
    assert cache.store(key, {"artifact": second}, {"writer": 2}) is False
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) == {"writer": 1}
    assert (tmp_path / "out.pt").read_bytes() == BLOB


def flip_a_byte(cache, key):
    data = bytearray(cache.fs.cat_file(blob_path(cache, key)))
    data[len(data) // 2] ^= 0xFF
    cache.fs.pipe_file(blob_path(cache, key), bytes(data))


def truncate(cache, key):
    cache.fs.pipe_file(blob_path(cache, key), cache.fs.cat_file(blob_path(cache, key))[:1000])


def garble_entry_json(cache, key):
    cache.fs.pipe_file(blob_path(cache, key, "entry.json"), b'{"files": ')


def remove_blob(cache, key):
    cache.fs.rm_file(blob_path(cache, key))


@pytest.mark.parametrize("damage", [flip_a_byte, truncate, garble_entry_json, remove_blob])
def test_a_damaged_entry_is_a_miss_that_leaves_the_destination_alone_and_is_removed(cache, source, tmp_path, damage):
    key = key_of(damage.__name__)
    cache.store(key, {"artifact": source})
    damage(cache, key)
    destination = tmp_path / "out.pt"
    destination.write_bytes(b"previous build")
    assert cache.fetch(key, {"artifact": destination}) is None
    assert destination.read_bytes() == b"previous build"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.pt")] == []
    assert not entry_exists(cache, key)
    assert cache.store(key, {"artifact": source}) is True  # the key is free to be published again
    assert cache.fetch(key, {"artifact": destination}) == {}


def test_a_blob_longer_than_recorded_is_a_miss(cache, source, tmp_path):
    key = key_of("longer")
    cache.store(key, {"artifact": source})
    cache.fs.pipe_file(blob_path(cache, key), BLOB + b"tail")
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) is None
    assert not (tmp_path / "out.pt").exists()


def test_a_local_entry_without_entry_json_is_a_miss_and_is_removed(tmp_path, source):
    cache = cachemod.Cache(tmp_path / "cache")
    key = key_of("no entry.json")
    cache.store(key, {"artifact": source})
    cache.fs.rm_file(blob_path(cache, key, "entry.json"))
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) is None
    assert not entry_exists(cache, key)
    assert cache.stats()["entries"] == 0


def test_on_an_object_store_an_entry_without_entry_json_is_a_miss_until_prune_removes_it(monkeypatch, source,
                                                                                         tmp_path):
    cache = cachemod.Cache(f"memory://mobilebuild-test-{uuid.uuid4().hex}")
    key = key_of("upload in progress")
    cache.store(key, {"artifact": source})
    cache.fs.rm_file(blob_path(cache, key, "entry.json"))
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) is None
    assert cache.stats() == {"location": cache.location, "entries": 0, "bytes": 0, "unfinished": 1}
    assert cache.prune(10**9)["unfinished_removed"] == 0  # it may be an upload in progress
    monkeypatch.setattr(cachemod, "STALE_AFTER_S", 0.0)
    assert cache.prune(10**9)["unfinished_removed"] == 1
    assert not entry_exists(cache, key)
    cache.clear()


def store_concurrently(url, key, payload_path, barrier, results):
    barrier.wait()
    results.put(cachemod.Cache(url).store(key, {"artifact": payload_path}, {"writer": os.getpid()}))


def test_concurrent_writers_of_one_key_leave_one_valid_entry(tmp_path):
    url, key = str(tmp_path / "cache"), key_of("race")
    context = multiprocessing.get_context("spawn")  # not "fork": this process may have imported JAX
    barrier, results = context.Barrier(4), context.Queue()
    payloads = []
    for writer in range(4):  # different bytes per writer: a mixed entry would not match any of them
        payloads.append(tmp_path / f"payload-{writer}")
        payloads[-1].write_bytes(bytes([writer]) * 3_000_000)
    workers = [context.Process(target=store_concurrently, args=(url, key, p, barrier, results)) for p in payloads]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    published = [results.get(timeout=10) for _ in workers]
    assert sorted(published) == [False, False, False, True]
    destination = tmp_path / "out"
    meta = cachemod.Cache(url).fetch(key, {"artifact": destination})
    assert meta is not None
    assert destination.read_bytes() in [p.read_bytes() for p in payloads]
    entry_dir = tmp_path / "cache" / "v1" / key[:2] / key
    assert sorted(p.name for p in entry_dir.iterdir()) == ["artifact", "entry.json", "used"]
    assert list((tmp_path / "cache" / "v1" / ".staging").iterdir()) == []


KILLED_WRITER = """
import sys
from mobilebuild.engine import cache
cache.Cache(sys.argv[1]).store(sys.argv[2], {"artifact": sys.argv[3]})
"""


def test_a_writer_killed_mid_store_leaves_no_trusted_entry(tmp_path, source, monkeypatch):
    url, key = str(tmp_path / "cache"), key_of("killed")
    fifo = tmp_path / "endless-model.pt"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, url, key, str(fifo)])
    # The writer reads its "large file" from a pipe: it is mid-store for as long as the pipe stays open.
    pipe = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # never blocks, even if the writer died before opening it
    try:
        feed(pipe, b"\x01" * 4_000_000, writer)
        staged = tmp_path / "cache" / "v1" / ".staging"
        wait_for(lambda: any(p.stat().st_size >= 1 << 20 for p in staged.rglob("artifact")))
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        os.close(pipe)
        if writer.poll() is None:
            writer.kill()
    cache = cachemod.Cache(url)
    assert writer.returncode == -signal.SIGKILL
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) is None
    assert not (tmp_path / "out.pt").exists()
    assert cache.stats()["entries"] == 0 and cache.stats()["unfinished"] == 1
    assert cache.store(key, {"artifact": source}) is True
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) == {}
    monkeypatch.setattr(cachemod, "STALE_AFTER_S", 0.0)
    assert cache.prune(10**9)["unfinished_removed"] == 1
    assert list((tmp_path / "cache" / "v1" / ".staging").iterdir()) == []


def feed(pipe, data, writer):
    while data:
        try:
            data = data[os.write(pipe, data):]
        except BlockingIOError:
            assert writer.poll() is None, "the writer died before reading its input"
            time.sleep(0.01)


def wait_for(condition, attempts=1200):
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("the writer never started writing its blob")


def test_prune_keeps_the_recently_used_entries_under_the_size_limit(cache, tmp_path, source):
    first, second, third = key_of("first"), key_of("second"), key_of("third")
    for key in (first, second, third):
        cache.store(key, {"artifact": source})
    assert cache.fetch(first, {"artifact": tmp_path / "hit.pt"}) == {}  # first is now the most recently used
    entry_bytes = cache.stats()["bytes"] // 3
    result = cache.prune(max_bytes=int(entry_bytes * 2.5))
    assert result["removed"] == 1 and result["entries"] == 2 and result["bytes"] <= entry_bytes * 2.5
    assert cache.fetch(second, {"artifact": tmp_path / "second.pt"}) is None
    assert cache.fetch(first, {"artifact": tmp_path / "first.pt"}) == {}
    assert cache.fetch(third, {"artifact": tmp_path / "third.pt"}) == {}
    assert cache.prune(max_bytes=0)["entries"] == 0
    assert cache.stats()["entries"] == 0


def test_stats_count_entries_and_their_bytes(cache, source, tmp_path):
    assert cache.stats() == {"location": cache.location, "entries": 0, "bytes": 0, "unfinished": 0}
    cache.store(key_of("one"), {"artifact": source})
    small = tmp_path / "small"
    small.write_bytes(b"x" * 10)
    cache.store(key_of("two"), {"artifact": small})
    stats = cache.stats()
    assert stats["entries"] == 2 and len(BLOB) + 10 < stats["bytes"] < len(BLOB) + 10 + 4000
    assert cache.clear() == {"removed": 2, "freed": stats["bytes"]}
    assert cache.stats()["entries"] == 0


def test_entry_json_records_each_blob(cache, source):
    key = key_of("record")
    cache.store(key, {"artifact": source}, {"stage": "fuse"})
    entry = json.loads(cache.fs.cat_file(blob_path(cache, key, "entry.json")))
    assert entry["files"] == {"artifact": {"sha256": cachemod.store.sha256_file(source), "bytes": len(BLOB)}}
    assert entry["meta"] == {"stage": "fuse"} and entry["created"] > 0


@pytest.mark.parametrize("name", ["entry.json", "used", "../escape", ".hidden", "a/b"])
def test_names_that_would_clash_with_the_layout_are_refused(cache, source, name):
    with pytest.raises(ValueError):
        cache.store(key_of("names"), {name: source})


def test_keys_must_be_sha256_hex(cache, tmp_path):
    with pytest.raises(ValueError):
        cache.fetch("../../etc", {"artifact": tmp_path / "x"})


def test_entry_key_is_canonical_and_covers_config_toolchain_and_inputs():
    node = {"stage": "quantize", "config": {"engine": "qnnpack", "mode": "static"}, "toolchain": {"torch": "2.12.1"}}
    reordered = {"toolchain": {"torch": "2.12.1"}, "config": {"mode": "static", "engine": "qnnpack"},
                 "stage": "quantize"}
    inputs = {"model": "a" * 64, "file:calib/1.png": "b" * 64}
    key = cachemod.entry_key(node, inputs)
    assert len(key) == 64 and key == cachemod.entry_key(reordered, dict(reversed(inputs.items())))
    assert key != cachemod.entry_key(node, {**inputs, "model": "c" * 64})
    assert key != cachemod.entry_key({**node, "config": {"engine": "fbgemm", "mode": "static"}}, inputs)
    assert key != cachemod.entry_key({**node, "toolchain": {"torch": "2.13.0"}}, inputs)


def test_default_url(tmp_path):
    assert cachemod.default_url({"MOBILEBUILD_CACHE": "s3://bucket/cache"}) == "s3://bucket/cache"
    for off in ("off", "none", "", " OFF "):
        assert cachemod.default_url({"MOBILEBUILD_CACHE": off}) is None
    assert cachemod.default_url({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "mobilebuild")
    assert cachemod.default_url({"HOME": "/home/u"}).endswith(os.path.join(".cache", "mobilebuild"))


@pytest.mark.parametrize("text, size", [("500MB", 500_000_000), ("2GiB", 2 * 1024**3), ("1.5G", 1_500_000_000),
                                        ("10 kb", 10_000), ("1000", 1000), ("0", 0), ("3K", 3000), ("7b", 7)])
def test_parse_size(text, size):
    assert cachemod.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MB", "5XB", "-1GB", "1e3", "2i", "GiB"])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError):
        cachemod.parse_size(text)


def test_importing_the_cache_does_not_import_fsspec():
    code = "import sys, mobilebuild.engine.cache; print('fsspec' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


# --- trust: what a writer can do to a reader ------------------------------------------------------------------------

def forge(cache, key, data):
    """What anyone who can write to the cache can do: replace a blob and record its hash and size."""
    import hashlib

    cache.fs.pipe_file(blob_path(cache, key), data)
    entry = json.loads(cache.fs.cat_file(blob_path(cache, key, "entry.json")))
    entry["files"]["artifact"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    cache.fs.pipe_file(blob_path(cache, key, "entry.json"), json.dumps(entry).encode())


TEAM = signing.PrivateKey.generate("ci-1")  # real Ed25519 keys, made here
STRANGER = signing.PrivateKey.generate("laptop")


def writer(cache, key=TEAM, **options):
    """The same storage, seen by a machine that signs with `key` (and trusts its own public key)."""
    return cachemod.Cache(cache.url, signing_key=key, **options)


def reader(cache, *trusted, **options):
    """The same storage, seen by a machine holding only these public keys (by default the team's)."""
    return cachemod.Cache(cache.url, trusted_keys=signing.KeyRing(trusted or [TEAM.public()]), **options)


def entry_json(cache, key):
    return json.loads(cache.fs.cat_file(blob_path(cache, key, "entry.json")))


def test_without_keys_a_forged_entry_matches_its_hashes(cache, source, tmp_path):
    """Why signing exists: the hashes are the writer's word."""
    key = key_of("forged")
    cache.store(key, {"artifact": source})
    forge(cache, key, b"someone else's bytes")
    assert cache.fetch(key, {"artifact": tmp_path / "out.pt"}) == {}
    assert (tmp_path / "out.pt").read_bytes() == b"someone else's bytes"


def test_a_reader_with_only_the_public_key_uses_what_the_writer_signed(cache, source, tmp_path):
    key = key_of("signed")
    assert writer(cache).store(key, {"artifact": source}, {"seconds": 1.0}) is True
    signature = entry_json(cache, key)["signature"]
    assert signature["key"] == "ci-1" and len(base64.b64decode(signature["sig"])) == 64
    assert reader(cache).fetch(key, {"artifact": tmp_path / "a.pt"}) == {"seconds": 1.0}
    assert cache.fetch(key, {"artifact": tmp_path / "b.pt"}) == {"seconds": 1.0}  # a reader that checks nothing
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes() == BLOB
    assert TEAM.text().split(":")[1].encode() not in cache.fs.cat_file(blob_path(cache, key, "entry.json"))


def swap(cache, key, other_key):
    """Move a validly signed entry under another node's key, as a writer without the private key could."""
    for name in ("artifact", "entry.json"):
        cache.fs.pipe_file(blob_path(cache, key, name), cache.fs.cat_file(blob_path(cache, other_key, name)))


def edit_meta(cache, key):
    entry = entry_json(cache, key)
    entry["meta"]["seconds"] = 2.0
    cache.fs.pipe_file(blob_path(cache, key, "entry.json"), json.dumps(entry).encode())


@pytest.mark.parametrize("case, reason", [
    ("unsigned", "unsigned (MOBILEBUILD_CACHE_TRUSTED_KEYS is set)"),
    ("unknown key", "signed by 'laptop', a key not trusted here (trusted: ci-1)"),
    ("forged", "its signature by ci-1 does not match (altered, or moved from another entry)"),
    ("forged meta", "its signature by ci-1 does not match (altered, or moved from another entry)"),
    ("swapped", "its signature by ci-1 does not match (altered, or moved from another entry)"),
    ("tampered file", "artifact differs from the sha256 its signature covers"),
])
@pytest.mark.parametrize("who", ["reader", "writer"])
def test_an_entry_not_signed_by_a_trusted_key_is_never_used(cache, source, tmp_path, case, reason, who):
    key = key_of(case)
    {"unsigned": cache, "unknown key": writer(cache, STRANGER)}.get(case, writer(cache)).store(
        key, {"artifact": source}, {"seconds": 1.0})
    if case == "forged":
        forge(cache, key, b"someone else's bytes")
    elif case == "forged meta":
        edit_meta(cache, key)
    elif case == "swapped":
        other = key_of("another node")
        second = tmp_path / "other.pt"
        second.write_bytes(b"another node's artifact")
        writer(cache).store(other, {"artifact": second})
        swap(cache, key, other)
    elif case == "tampered file":
        flip_a_byte(cache, key)
    destination = tmp_path / "out.pt"
    destination.write_bytes(b"previous build")
    listing = sorted(cache.fs.find(cache.root))
    checking = reader(cache) if who == "reader" else writer(cache)

    with pytest.raises(cachemod.Untrusted) as refused:
        checking.fetch(key, {"artifact": destination})

    assert str(refused.value) == reason
    assert destination.read_bytes() == b"previous build"
    if who == "reader":  # it cannot sign a replacement: it leaves the entry to those who can
        assert sorted(cache.fs.find(cache.root)) == listing
        return
    assert not entry_exists(cache, key)  # removed, so the signing writer's rebuild takes its place
    assert writer(cache).store(key, {"artifact": source}) is True
    assert reader(cache).fetch(key, {"artifact": destination}) == {}


def test_a_reader_cannot_write_a_signed_entry(cache, source, tmp_path):
    key = key_of("reader writes")
    assert reader(cache).store(key, {"artifact": source}) is False  # no private key: it writes nothing
    assert not entry_exists(cache, key)
    # signing with a key of its own gets it nowhere: the team's readers refuse it
    assert writer(cache, STRANGER).store(key, {"artifact": source}) is True
    with pytest.raises(cachemod.Untrusted, match="signed by 'laptop', a key not trusted here"):
        reader(cache).fetch(key, {"artifact": tmp_path / "out.pt"})
    assert not (tmp_path / "out.pt").exists()


def test_a_key_ring_rotates_keys_without_a_flag_day(cache, source, tmp_path):
    new = signing.PrivateKey.generate("ci-2")
    old_entry, new_entry = key_of("old key"), key_of("new key")
    writer(cache).store(old_entry, {"artifact": source})
    writer(cache, new).store(new_entry, {"artifact": source})
    both = reader(cache, TEAM.public(), new.public())
    assert both.fetch(old_entry, {"artifact": tmp_path / "a"}) == both.fetch(new_entry, {"artifact": tmp_path / "b"})
    with pytest.raises(cachemod.Untrusted, match=r"signed by 'ci-1', a key not trusted here \(trusted: ci-2\)"):
        reader(cache, new.public()).fetch(old_entry, {"artifact": tmp_path / "c"})  # the old key retired


def test_a_signing_writer_replaces_an_unsigned_entry_in_its_way(cache, source, tmp_path):
    key = key_of("in the way")
    cache.store(key, {"artifact": source})
    assert writer(cache).store(key, {"artifact": source}) is True
    assert writer(cache).store(key, {"artifact": source}) is False  # its own, signed entry stays
    assert reader(cache).fetch(key, {"artifact": tmp_path / "out.pt"}) == {}


def test_a_check_refusing_a_file_makes_the_entry_untrusted_and_leaves_nothing(cache, source, tmp_path):
    key = key_of("checked")
    cache.store(key, {"artifact": source})
    seen = []

    def refuse(name, path):
        seen.append((name, path.read_bytes() == BLOB))
        return "not what the stage makes"

    with pytest.raises(cachemod.Untrusted, match="not what the stage makes"):
        cache.fetch(key, {"artifact": tmp_path / "checkout" / "out.pt"}, check=refuse)
    assert seen == [("artifact", True)]
    assert list((tmp_path / "checkout").iterdir()) == []  # neither the destination nor a temporary
    assert not entry_exists(cache, key)


def test_a_blob_must_hash_to_its_key_whatever_entry_json_says(cache, source, tmp_path):
    import hashlib

    digest = hashlib.sha256(BLOB).hexdigest()
    cache.store(digest, {"blob": source})
    assert cache.fetch_blob(digest, tmp_path / "good") and (tmp_path / "good").read_bytes() == BLOB
    cache.fs.pipe_file(blob_path(cache, digest, "blob"), b"import os")
    entry = json.loads(cache.fs.cat_file(blob_path(cache, digest, "entry.json")))
    entry["files"]["blob"] = {"sha256": hashlib.sha256(b"import os").hexdigest(), "bytes": 9}
    cache.fs.pipe_file(blob_path(cache, digest, "entry.json"), json.dumps(entry).encode())

    with pytest.raises(cachemod.Untrusted, match="content differs from its key"):
        cache.fetch_blob(digest, tmp_path / "bad.py")
    assert not (tmp_path / "bad.py").exists()
    assert cache.fetch_blob(digest, tmp_path / "again") is False  # removed


def test_a_read_only_cache_reads_and_never_writes(cache, source, tmp_path):
    key, damaged = key_of("read"), key_of("damaged")
    cache.store(key, {"artifact": source})
    cache.store(damaged, {"artifact": source})
    flip_a_byte(cache, damaged)
    reader = cachemod.Cache(cache.url, read_only=True)
    listing = sorted(cache.fs.find(cache.root))

    assert reader.fetch(key, {"artifact": tmp_path / "out.pt"}) == {}
    assert reader.fetch(damaged, {"artifact": tmp_path / "damaged.pt"}) is None
    assert reader.store(key_of("new"), {"artifact": source}) is False
    for action in (lambda: reader.prune(0), reader.clear):
        with pytest.raises(PermissionError, match="read-only here"):
            action()

    assert sorted(cache.fs.find(cache.root)) == listing  # no new entry, no `used` time, the damaged one left alone


def test_from_environment_reads_the_keys_and_the_read_only_setting(tmp_path):
    key_file = tmp_path / "ci-1.key"
    TEAM.write(key_file)
    other = signing.PrivateKey.generate("ci-2").public()
    environ = {"MOBILEBUILD_CACHE": str(tmp_path / "c"), "MOBILEBUILD_CACHE_SIGNING_KEY": str(key_file),
               "MOBILEBUILD_CACHE_TRUSTED_KEYS": f"{TEAM.public().text()} {other.text()}",
               "MOBILEBUILD_CACHE_READ_ONLY": "1"}
    shared = cachemod.from_environment(environ)
    assert shared.signing_key.public() == TEAM.public() and shared.read_only
    assert sorted(shared.trusted_keys.keys) == ["ci-1", "ci-2"]
    by_text = cachemod.from_environment({**environ, "MOBILEBUILD_CACHE_SIGNING_KEY": TEAM.text()})
    assert by_text.signing_key.public() == TEAM.public()
    plain = cachemod.from_environment({"MOBILEBUILD_CACHE": str(tmp_path / "c")})
    assert plain.signing_key is None and not plain.trusted_keys and not plain.read_only and plain.writes
    assert cachemod.from_environment({"MOBILEBUILD_CACHE": "off"}) is None


@pytest.mark.parametrize("variable, value, message", [
    ("MOBILEBUILD_CACHE_SIGNING_KEY", "/nonexistent/ci.key",
     "MOBILEBUILD_CACHE_SIGNING_KEY: cannot read /nonexistent/ci.key (No such file or directory)"),
    ("MOBILEBUILD_CACHE_SIGNING_KEY", "ci-1:c2VjcmV0IGJ1dCB0b28gc2hvcnQ=",  # a mistyped key: never echoed
     "MOBILEBUILD_CACHE_SIGNING_KEY: cannot read its value (neither a key NAME:BASE64 nor a file) (No such file or "
     "directory)"),
    ("MOBILEBUILD_CACHE_TRUSTED_KEYS", "ci-1:not-a-key",
     "MOBILEBUILD_CACHE_TRUSTED_KEYS is not a key of the form NAME:BASE64 (as `mobilebuild keygen` prints)"),
])
def test_a_key_that_cannot_be_read_is_one_line_naming_the_variable(tmp_path, variable, value, message):
    with pytest.raises(MobileBuildError) as refused:
        cachemod.from_environment({"MOBILEBUILD_CACHE": str(tmp_path / "c"), variable: value})
    assert str(refused.value) == message


def test_the_retired_hmac_secret_trusts_nothing(cache, source, tmp_path):
    key = key_of("retired")
    writer(cache).store(key, {"artifact": source})
    retired = cachemod.from_environment({"MOBILEBUILD_CACHE": cache.url, "MOBILEBUILD_CACHE_KEY": "team secret"})
    with pytest.raises(cachemod.Untrusted, match="MOBILEBUILD_CACHE_KEY .an HMAC secret. is no longer read"):
        retired.fetch(key, {"artifact": tmp_path / "out.pt"})
    assert retired.store(key_of("retired writes"), {"artifact": source}) is False


@pytest.mark.parametrize("url, shown", [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/mobilebuild", "s3://***@bucket/mobilebuild"),
    ("https://user:hunter2@cache.example.com/mb", "https://***@cache.example.com/mb"),
    ("https://acct.blob.core.windows.net/c/mb?sv=2022&sig=abc%2Fdef",
     "https://acct.blob.core.windows.net/c/mb?sv=***&sig=***"),
    ("gs://bucket/mobilebuild", "gs://bucket/mobilebuild"),
    ("/home/me/.cache/mobilebuild", "/home/me/.cache/mobilebuild"),
])
def test_a_url_is_shown_without_its_credentials(url, shown):
    assert cachemod.redact(url) == shown


def test_cache_stats_never_prints_credentials(tmp_path):
    secret_url = "memory://AKIAEXAMPLE:hunter2@bucket/mobilebuild"
    for action in ("stats", "clear"):
        result = subprocess.run([sys.executable, "-m", "mobilebuild.cli", "cache", action], capture_output=True,
                                text=True, env={**os.environ, "MOBILEBUILD_CACHE": secret_url,
                                                "MOBILEBUILD_CACHE_READ_ONLY": "1" if action == "clear" else ""})
        assert "hunter2" not in result.stdout + result.stderr and "AKIAEXAMPLE" not in result.stdout + result.stderr
        assert (result.returncode, action) in ((0, "stats"), (1, "clear")), result.stderr
