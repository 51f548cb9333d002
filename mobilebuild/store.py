"""File writes that never leave a half-written artifact behind, and content hashes."""

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

TEMP_MARKER = ".partial-"


@contextlib.contextmanager
def atomic_output(path):
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.

    The temporary file lives in the same directory so the final rename is atomic on POSIX; a killed build
    leaves only a `.partial-` file that no task lists as a target, so it is never taken as up to date.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARKER}", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path, data):
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def write_text(path, text):
    write_bytes(path, text.encode("utf-8"))


def sha256_file(path, chunk=1 << 20):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def remove_partials(directory):
    """Delete temporary files left by interrupted builds."""
    for stale in Path(directory).rglob(f"*{TEMP_MARKER}*"):
        stale.unlink(missing_ok=True)
