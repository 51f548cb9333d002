"""File writes that never leave a half-written artifact behind, and content hashes."""

import contextlib
import filecmp
import functools
import hashlib
import os
import tempfile
from pathlib import Path

TEMP_MARKER = ".partial-"


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def atomic_output(path):
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.

    The temporary file lives in the same directory so the final rename is atomic on POSIX; a killed build
    leaves only a `.partial-` file that no task lists as a target, so it is never taken as up to date. Like make
    and ninja, no fsync: a killed process loses nothing written, and a power cut is not worth a flush per file.
    A file written again with the same bytes is left as it was, timestamp included: what reads it (a plot, the
    report, a rsync) sees no change.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TEMP_MARKER}", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's private 0600 would make released artifacts unreadable to others
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        if not _same_bytes(tmp, path):
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _same_bytes(new, old):
    try:
        return os.path.getsize(new) == os.path.getsize(old) and filecmp.cmp(new, old, shallow=False)
    except OSError:
        return False


def write_bytes(path, data):
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def write_text(path, text):
    write_bytes(path, text.encode("utf-8"))


def sha256_file(path):
    """The file's sha256, computed once per process for a given (path, inode, size, mtime): the doit checker, the
    manifest and later stages all ask for the same multi-megabyte files."""
    stat = os.stat(path)
    return _sha256(os.fspath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _sha256(path, inode, size, mtime_ns):
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def remove_partials(directory):
    """Delete temporary files left by interrupted builds."""
    for stale in Path(directory).rglob(f"*{TEMP_MARKER}*"):
        stale.unlink(missing_ok=True)
