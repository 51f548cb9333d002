"""Two checkouts of one repository sharing one artifact cache: the second builds nothing itself."""

import hashlib

import pytest
from conftest import checkouts, tiny_recipe

pytestmark = pytest.mark.slow  # checkouts built end to end


def digests(project):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(project.artifact("tiny").iterdir())
            if p.name != "manifest.json"}


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
