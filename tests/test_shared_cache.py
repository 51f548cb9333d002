"""Checkouts of one repository sharing one artifact cache: the second builds nothing itself; what it fetches never
runs code, signed caches use only entries signed with their key, and read-only ones are never written."""

import hashlib
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import checkouts, tiny_recipe

from mobilebuild import signing

pytestmark = pytest.mark.slow  # checkouts built end to end


def digests(project):
    """Every file the build made for the recipe but its manifest: the artifacts, the results and its plot."""
    files = [p for p in sorted(project.artifact("tiny").iterdir()) if p.name != "manifest.json"]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files + [project.artifact("plots/tiny.png")]}


def test_a_second_checkout_builds_everything_from_the_shared_cache(tmp_path):
    cache = {"MOBILEBUILD_CACHE": str(tmp_path / "shared-cache")}
    first, second = checkouts(tmp_path, "first", "second")

    cold = first.run(env=cache)
    warm = second.run(env=cache)

    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    assert "(from the cache)" not in cold.stdout
    written = [line for line in warm.stdout.splitlines() if line.startswith("   artifacts/")]
    fetched = [line for line in written if line.endswith("(from the cache)")]
    assert len(fetched) == len(digests(second)) == len(written) - 1  # all but the manifest, always rewritten
    assert digests(second) == digests(first)  # benchmark results too: fetched, not measured again


def test_a_corrupt_cache_entry_is_rebuilt_never_used(tmp_path):
    cache_dir = tmp_path / "shared-cache"
    first, second = checkouts(tmp_path, "first", "second", recipe=tiny_recipe(targets=[{"backend": "xnnpack"}]))
    assert first.run("optimize", env={"MOBILEBUILD_CACHE": str(cache_dir)}).returncode == 0
    wanted = first.artifact("tiny/tiny-xnnpack.ptl").read_bytes()
    for blob in cache_dir.rglob("artifact"):  # flip one byte of every stored artifact
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))

    result = second.run("optimize", env={"MOBILEBUILD_CACHE": str(cache_dir)})

    assert result.returncode == 0, result.stderr
    assert "(from the cache)" not in result.stdout
    assert second.artifact("tiny/tiny-xnnpack.ptl").read_bytes() == wanted


POISON = textwrap.dedent('''
    import os
    import sys

    import torch


    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {sys.argv[2]}",)


    torch.save({"weight": torch.ones(2), "payload": Payload()}, sys.argv[1])
''')


def poison_every_entry(cache_dir, first, marker, tmp_path):
    """What anyone who can write to the cache can do: replace the file of each entry the build reads back (the
    checkpoint, fused, quantized and TorchScript models) with a pickle that runs a command when loaded, and record
    its hash and size in entry.json. Returns the artifacts poisoned."""
    (tmp_path / "poison.py").write_text(POISON)
    payload = tmp_path / "payload.pt"
    subprocess.run([sys.executable, str(tmp_path / "poison.py"), str(payload), str(marker)], check=True)
    data = payload.read_bytes()
    built = {hashlib.sha256(p.read_bytes()).hexdigest(): p.name for p in first.artifact("tiny").iterdir()}
    poisoned = []
    for entry_json in cache_dir.rglob("entry.json"):
        blob = entry_json.with_name("artifact")
        name = built.get(hashlib.sha256(blob.read_bytes()).hexdigest()) if blob.is_file() else None
        if name and name.endswith(".pt"):
            blob.write_bytes(data)
            entry = json.loads(entry_json.read_text())
            entry["files"]["artifact"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            entry_json.write_text(json.dumps(entry))
            poisoned.append(name)
    return sorted(poisoned)


def test_a_poisoned_cache_runs_nothing_and_its_entries_are_rebuilt(tmp_path):
    cache = {"MOBILEBUILD_CACHE": str(tmp_path / "shared-cache")}
    # trained, pruned: every intermediate a stage reads back
    recipe = tiny_recipe(model={"factory": "tinynet:make", "seed": 0, "batchnorm_stats": 2,
                                "train": {"function": "trainer:train"}},
                         prune={"method": "l1_unstructured", "amount": 0.3})
    first, second = checkouts(tmp_path, "first", "second", recipe=recipe)
    for project in (first, second):
        (project.root / "trainer.py").write_text("def train(model):\n    return model\n")
    assert first.run(env=cache).returncode == 0
    marker = tmp_path / "the-payload-ran"
    poisoned = poison_every_entry(tmp_path / "shared-cache", first, marker, tmp_path)
    assert poisoned == ["checkpoint.pt", "fused.pt", "pruned.pt", "quantized-qnnpack.pt", "scripted-fp32.pt",
                        "scripted-int8-qnnpack.pt", "trained.pt"]

    result = second.run(env=cache)

    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    (summary,) = [line for line in result.stderr.splitlines() if "did not trust" in line]
    assert summary.startswith("the shared artifact cache held 7 entries this build did not trust, and rebuilt: ")
    assert "holds code, not only tensors (would call posix.system): train:tiny, checkpoint:tiny, prune:tiny and " \
           "2 more" in summary
    assert "not a TorchScript archive: script:tiny-fp32, script:tiny-int8-qnnpack" in summary
    assert digests(second) == digests(first)
    assert second.run(env=cache).stderr.count("did not trust") == 0  # the rebuilt entries replaced them


def test_a_reader_with_only_the_public_key_builds_from_what_the_writer_signed(tmp_path):
    shared = str(tmp_path / "shared-cache")
    unsigned, signer, reader, stranger = checkouts(tmp_path, "unsigned", "signer", "reader", "stranger")
    ci, laptop = signing.PrivateKey.generate("ci-1"), signing.PrivateKey.generate("laptop")  # real keys
    ci.write(tmp_path / "ci-1.key")
    assert unsigned.run(env={"MOBILEBUILD_CACHE": shared}).returncode == 0
    trusting = {"MOBILEBUILD_CACHE": shared, "MOBILEBUILD_CACHE_TRUSTED_KEYS": ci.public().text()}

    signing_run = signer.run(env={**trusting, "MOBILEBUILD_CACHE_SIGNING_KEY": str(tmp_path / "ci-1.key")})
    reading = reader.run(env=trusting)
    other = stranger.run(env={"MOBILEBUILD_CACHE": shared, "MOBILEBUILD_CACHE_SIGNING_KEY": laptop.text(),
                              "MOBILEBUILD_CACHE_TRUSTED_KEYS": laptop.public().text()})

    assert signing_run.returncode == reading.returncode == other.returncode == 0
    assert "(from the cache)" not in signing_run.stdout
    (summary,) = [line for line in signing_run.stderr.splitlines() if "did not trust" in line]
    assert "unsigned (MOBILEBUILD_CACHE_TRUSTED_KEYS is set): checkpoint:tiny, fuse:tiny," in summary
    fetched = [line for line in reading.stdout.splitlines() if line.endswith("(from the cache)")]
    assert len(fetched) == len(digests(reader)) and "did not trust" not in reading.stderr
    assert "(from the cache)" not in other.stdout
    assert "signed by 'ci-1', a key not trusted here (trusted: laptop)" in other.stderr
    # timings measured again differ: the benchmarks, the per-layer comparison's seconds, the plot of them
    models = [{name: digest for name, digest in digests(project).items()
               if not name.startswith(("bench-", "layers-")) and not name.endswith(".png")}
              for project in (unsigned, signer, reader, stranger)]
    assert models[0] == models[1] == models[2] == models[3]
    # nothing secret in any file the builds wrote, the cache's included, nor in what they printed
    secrets = [key.text().split(":")[1].encode() for key in (ci, laptop)]
    written = [path for folder in (tmp_path / "shared-cache", *(p.root for p in (signer, reader, stranger)))
               for path in folder.rglob("*") if path.is_file()]
    printed = "".join(run.stdout + run.stderr for run in (signing_run, reading, other)).encode()
    assert len(written) > 50 and not [path for path in written for secret in secrets if secret in path.read_bytes()]
    assert not [secret for secret in secrets if secret in printed]


def test_a_tampered_or_swapped_signed_entry_is_rebuilt_with_one_line_naming_why(tmp_path):
    shared = tmp_path / "shared-cache"
    writer, reader = checkouts(tmp_path, "writer", "reader", recipe=tiny_recipe(targets=[{"backend": "xnnpack"}]))
    ci = signing.PrivateKey.generate("ci-1")
    trusting = {"MOBILEBUILD_CACHE": str(shared), "MOBILEBUILD_CACHE_TRUSTED_KEYS": ci.public().text()}
    assert writer.run("optimize", env={**trusting, "MOBILEBUILD_CACHE_SIGNING_KEY": ci.text()}).returncode == 0
    entries = {hashlib.sha256(blob.read_bytes()).hexdigest(): blob.parent for blob in shared.rglob("artifact")}
    entry = {name: entries[hashlib.sha256(writer.artifact(f"tiny/{name}").read_bytes()).hexdigest()]
             for name in ("checkpoint.pt", "fused.pt", "scripted-fp32.pt")}
    blob = entry["scripted-fp32.pt"] / "artifact"  # one byte flipped: entry.json, and its signature, unchanged
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    for name in ("artifact", "entry.json"):  # the checkpoint's validly signed entry moved under the fused model's key
        (entry["fused.pt"] / name).write_bytes((entry["checkpoint.pt"] / name).read_bytes())

    result = reader.run("optimize", env=trusting)

    assert result.returncode == 0, result.stderr
    (summary,) = [line for line in result.stderr.splitlines() if "did not trust" in line]
    assert summary == ("the shared artifact cache held 2 entries this build did not trust, and rebuilt: artifact "
                       "differs from the sha256 its signature covers: script:tiny-fp32; its signature by ci-1 does "
                       "not match (altered, or moved from another entry): fuse:tiny")
    shipped = "tiny/tiny-xnnpack.ptl"
    assert reader.artifact(shipped).read_bytes() == writer.artifact(shipped).read_bytes()


def test_a_read_only_cache_is_read_and_never_written(tmp_path):
    shared = tmp_path / "shared-cache"
    writer, reader, empty = checkouts(tmp_path, "writer", "reader", "empty")
    assert empty.run(env={"MOBILEBUILD_CACHE": str(shared), "MOBILEBUILD_CACHE_READ_ONLY": "1"}).returncode == 0
    assert not shared.exists()
    assert writer.run(env={"MOBILEBUILD_CACHE": str(shared)}).returncode == 0
    listing = sorted(shared.rglob("*"))

    result = reader.run(env={"MOBILEBUILD_CACHE": str(shared), "MOBILEBUILD_CACHE_READ_ONLY": "1"})

    assert result.returncode == 0
    assert len([line for line in result.stdout.splitlines() if line.endswith("(from the cache)")]) == len(
        digests(reader))
    assert sorted(shared.rglob("*")) == listing  # not even the entries' `used` times


def test_no_key_and_no_cache_credential_in_anything_a_signed_build_and_release_leave(tmp_path):
    (project,) = checkouts(tmp_path, "project", recipe=tiny_recipe(targets=[{"backend": "xnnpack"}]))
    cache_key, release_key = signing.PrivateKey.generate("ci-1"), signing.PrivateKey.generate("release-1")
    env = {"MOBILEBUILD_CACHE": "memory://AKIAEXAMPLE:hunter2@bucket/mobilebuild",
           "MOBILEBUILD_CACHE_SIGNING_KEY": cache_key.text(), "MOBILEBUILD_RELEASE_SIGNING_KEY": release_key.text()}

    result = project.run("release", env=env)  # the build, its report, then the signed release

    assert result.returncode == 0, result.stdout + result.stderr
    assert (project.root / "release/release.json.sig").is_file()
    secrets = [b"hunter2", b"AKIAEXAMPLE", *(key.text().split(":")[1].encode() for key in (cache_key, release_key))]
    written = [path for path in project.root.rglob("*") if path.is_file()]
    assert {"manifest.json", "report.md", "report.html", "release.json"} <= {path.name for path in written}
    assert not [(path, secret) for path in written for secret in secrets if secret in path.read_bytes()]
    assert not [secret for secret in secrets if secret in (result.stdout + result.stderr).encode()]
