"""The shared artifact cache: built artifacts stored under a key of what made them, on any fsspec filesystem.

An entry's key (`entry_key`) is the node's up-to-date key (stage, config slice, toolchain versions) plus the content
hashes of its inputs, so two checkouts, two machines or two branches that would build the same bytes fetch them
instead. Layout, under the cache's URL:

    v1/<key[:2]>/<key>/<name>        the files (blobs) of the entry
    v1/<key[:2]>/<key>/entry.json    {"files": {name: {"sha256", "bytes"}}, "meta": {...}, "created": time}
    v1/<key[:2]>/<key>/used          the time of the latest hit, for least-recently-used pruning

entry.json is written last and a reader trusts only the blobs that match it: a missing, truncated or corrupt entry is
a miss, never a wrong artifact. Those hashes are the writer's word, so they guard against accidents, not against a
writer: writers holding an Ed25519 private key (`MOBILEBUILD_CACHE_SIGNING_KEY`) sign each entry (its key, its
files' hashes and sizes, its metadata), and readers given public keys (`MOBILEBUILD_CACHE_TRUSTED_KEYS`, a key
ring; see mobilebuild/signing.py) use only entries signed by one of them. The signature covers the entry's key, so a
validly signed entry moved under another key is refused too. A reader may also refuse a file by its content (the
`check` of `fetch`). Untrusted entries are never used, and removed where this machine may write, so that a rebuild
replaces them. With `MOBILEBUILD_CACHE_READ_ONLY` set, a machine reads the cache and never writes to it; a machine
that checks signatures but holds no private key writes no entries either (its readers would refuse them).

On a local filesystem an entry is assembled in `v1/.staging/` and renamed into place whole, so concurrent writers
and killed writers leave either a complete entry or nothing. Object stores have no directory rename: there the blobs
are written in place and entry.json last, and unfinished entries are left to `prune` once they are older than
STALE_AFTER_S (a reader cannot tell them from an upload in progress).

No fsspec at import time: `doit list` imports the task layer, which must stay fast.
"""

import contextlib
import hashlib
import json
import os
import posixpath
import re
import secrets
import shutil
import time
import urllib.parse
from datetime import datetime

from mobilebuild import signing, store

LAYOUT = "v1"
ENTRY_FILE = "entry.json"
USED_FILE = "used"
STAGING_DIR = ".staging"
TRASH_DIR = ".trash"
CHUNK_BYTES = 1 << 20
# Unfinished entries younger than this may be uploads in progress; older ones are garbage from killed writers.
STALE_AFTER_S = 3600.0
OFF_VALUES = ("", "off", "none")
TRUE_VALUES = ("1", "true", "yes", "on")
SIGNING_KEY_VARIABLE = "MOBILEBUILD_CACHE_SIGNING_KEY"  # writers: a private key, its text or its file
TRUSTED_KEYS_VARIABLE = "MOBILEBUILD_CACHE_TRUSTED_KEYS"  # readers: public keys, separated by spaces
# The HMAC secret of earlier versions: every reader held the power to forge. Where it is still set, entries are
# refused (never trusted on its say-so) until the public keys replace it.
RETIRED_KEY_VARIABLE = "MOBILEBUILD_CACHE_KEY"
READ_ONLY_VARIABLE = "MOBILEBUILD_CACHE_READ_ONLY"

_KEY = re.compile(r"[0-9a-f]{64}")
_USER_INFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:/{0,2})[^/@?#]*@")  # scheme://user:password@
_RESERVED_NAMES = (ENTRY_FILE, USED_FILE)
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)(b?)\s*", re.IGNORECASE)
_UNIT_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def default_url(environ=None):
    """$MOBILEBUILD_CACHE, else a folder in the user's cache directory; None when the cache is switched off."""
    environ = os.environ if environ is None else environ
    if "MOBILEBUILD_CACHE" in environ:
        value = environ["MOBILEBUILD_CACHE"].strip()
        return None if value.lower() in OFF_VALUES else value
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mobilebuild")


def from_environment(environ=None):
    """The shared cache the environment names ($MOBILEBUILD_CACHE, its keys and read-only setting), or None when it
    is off. Raises MobileBuildError for a key that cannot be read."""
    environ = os.environ if environ is None else environ
    url = default_url(environ)
    if url is None:
        return None
    return Cache(url, read_only=environ.get(READ_ONLY_VARIABLE, "").strip().lower() in TRUE_VALUES,
                 **keys_from_environment(environ))


def keys_from_environment(environ=None):
    """{"signing_key", "trusted_keys", "retired_key"} as Cache takes them, from the environment (a Dask worker reads
    its own: keys never travel through the scheduler)."""
    environ = os.environ if environ is None else environ
    private = environ.get(SIGNING_KEY_VARIABLE, "").strip()
    return {"signing_key": signing.PrivateKey.load(private, SIGNING_KEY_VARIABLE) if private else None,
            "trusted_keys": signing.KeyRing.parse([environ.get(TRUSTED_KEYS_VARIABLE, "")], TRUSTED_KEYS_VARIABLE),
            "retired_key": bool(environ.get(RETIRED_KEY_VARIABLE))}


def redact(url):
    """The URL with what may be a secret replaced by ***: a user name and password, and query values such as a token
    or a signature (an S3 presigned URL, an Azure SAS)."""
    text = _USER_INFO.sub(r"\1***@", str(url))
    parts = urllib.parse.urlsplit(text)
    if not parts.query:
        return text
    query = "&".join(f"{name}=***" if value else name
                     for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    return urllib.parse.urlunsplit(parts._replace(query=query))


def entry_key(stage_key, input_hashes):
    """sha256 of the canonical JSON of the node's key (graph.Node.key()) and its inputs' content hashes."""
    canonical = json.dumps({"node": stage_key, "inputs": input_hashes}, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def parse_size(text):
    """'500MB' -> 500_000_000; '2GiB' -> 2 * 1024**3; a bare number is bytes. Raises ValueError."""
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size (examples: 500MB, 2GiB, 1.5G, 1000000)")
    number, unit, binary, _ = match.groups()
    if binary and not unit:
        raise ValueError(f"{text!r} is not a size (examples: 500MB, 2GiB, 1.5G, 1000000)")
    base = 1024 if binary else 1000
    return int(float(number) * base ** _UNIT_POWERS[unit.lower()])


class _Corrupt(Exception):
    """The entry is not what its entry.json says: it must be removed, never used."""


class Untrusted(Exception):
    """An entry this reader must not use: unsigned or not signed by a trusted key while signatures are checked, a
    file that differs from its signed hash, or a file that is not what the caller's check requires. The message says
    which, in a few words."""


class Cache:
    """A content-addressed artifact cache at an fsspec URL (a plain path is a local folder). With `signing_key` (a
    signing.PrivateKey), entries are signed when stored; with `trusted_keys` (a signing.KeyRing; the signing key's
    own public key is added), entries are used only when signed by one of them, and a cache that cannot sign stores
    nothing. With `read_only`, nothing is ever written (no entries, no usage times, no removals). `retired_key`:
    the retired HMAC variable is set, and every entry is refused until it is replaced."""

    def __init__(self, url, signing_key=None, trusted_keys=None, read_only=False, retired_key=False,
                 **storage_options):
        from fsspec.core import url_to_fs
        from fsspec.implementations.local import LocalFileSystem

        self.url = os.fspath(url)
        self.signing_key = signing_key
        self.trusted_keys = signing.KeyRing([*(trusted_keys.keys.values() if trusted_keys else ()),
                                             *([signing_key.public()] if signing_key else ())])
        self.retired_key = retired_key
        self.read_only = read_only
        self.fs, root = url_to_fs(self.url, **storage_options)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.root = root.rstrip("/") or "/"
        self.location = self.root if self.local else redact(self.url)
        self._layout = posixpath.join(self.root, LAYOUT)

    def __repr__(self):
        return f"Cache({self.location!r})"

    @property
    def writes(self):
        """Whether this machine stores entries: not read-only, and able to sign where signatures are checked."""
        return not (self.read_only or self.retired_key or (self.trusted_keys and self.signing_key is None))

    # -- reading --------------------------------------------------------------------------------------------------

    def fetch(self, key, outputs, check=None):
        """Copy the entry's files to their destinations ({name: path}) and return its metadata; None on a miss.

        All destinations are replaced together, only after every file matched its recorded sha256 and size, and
        `check(name, path)` (if given) found nothing wrong with each: it returns None, or the problem. A broken
        entry is removed; a failure of the cache's storage or of the destination is just a miss. Raises Untrusted
        for an entry not signed by a trusted key while keys are set (or whose files differ from what it signed), or
        that `check` refuses; it is removed where this machine writes.
        """
        directory = self._entry_dir(key)
        try:
            entry = self._read_entry(directory)
            if entry is None or not set(outputs) <= set(entry["files"]):
                return None
            signed = self._check_signature(key, entry)
            with contextlib.ExitStack() as replacements:
                for name, destination in outputs.items():
                    temporary = replacements.enter_context(store.atomic_output(destination))
                    try:
                        self._copy_verified(posixpath.join(directory, name), temporary, entry["files"][name])
                    except _Corrupt:
                        if signed:  # not an accident of storage: a file changed after a trusted writer signed it
                            raise Untrusted(f"{name} differs from the sha256 its signature covers") from None
                        raise
                    problem = check(name, temporary) if check else None
                    if problem:
                        raise Untrusted(problem)
        except _Corrupt:
            self._remove(directory)
            return None
        except Untrusted:
            if self.writes:  # the rebuild replaces it; a reader that cannot sign leaves it to those who may
                self._remove(directory)
            raise
        except OSError:
            return None
        self._mark_used(directory)
        return entry["meta"]

    def fetch_blob(self, digest, destination):
        """fetch() of an entry stored under its own content's sha256 (a Dask build's input files): the file must
        hash to its key, whatever entry.json says. Returns whether it was found."""
        def same_content(name, path):
            return None if store.sha256_file(path) == digest else "content differs from its key"

        return self.fetch(digest, {"blob": destination}, check=same_content) is not None

    def _read_entry(self, directory):
        try:
            raw = self.fs.cat_file(posixpath.join(directory, ENTRY_FILE))
        except FileNotFoundError:
            # Locally, entries appear whole by rename: a folder without entry.json is broken. Elsewhere it may be an
            # upload in progress, left to prune.
            if self.local and os.path.isdir(directory):
                raise _Corrupt(f"{directory}: no {ENTRY_FILE}") from None
            return None
        try:
            entry = json.loads(raw)
            files = entry["files"]
            for name, recorded in files.items():
                _check_name(name)
                if not (isinstance(recorded["sha256"], str) and isinstance(recorded["bytes"], int)):
                    raise TypeError(name)
            if not isinstance(entry["meta"], dict):
                raise TypeError("meta")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _Corrupt(f"{directory}: unreadable {ENTRY_FILE} ({exc})") from None
        return entry

    def _copy_verified(self, source, destination, recorded):
        digest, size = hashlib.sha256(), 0
        try:
            reader = self.fs.open(source, "rb")
        except FileNotFoundError:
            raise _Corrupt(f"{source}: missing") from None
        with reader, open(destination, "wb") as writer:
            while chunk := reader.read(CHUNK_BYTES):
                size += len(chunk)
                if size > recorded["bytes"]:
                    raise _Corrupt(f"{source}: longer than recorded")
                digest.update(chunk)
                writer.write(chunk)
        if size != recorded["bytes"] or digest.hexdigest() != recorded["sha256"]:
            raise _Corrupt(f"{source}: does not match {ENTRY_FILE}")

    def _check_signature(self, key, entry):
        """Whether the entry's signature was checked (and held); raises Untrusted where it must be and does not."""
        if self.retired_key:
            raise Untrusted(f"{RETIRED_KEY_VARIABLE} (an HMAC secret) is no longer read: set "
                            f"{TRUSTED_KEYS_VARIABLE} and {SIGNING_KEY_VARIABLE} (`mobilebuild keygen`)")
        if not self.trusted_keys:
            return False
        try:
            self.trusted_keys.verify(entry.get("signature"), _signed_bytes(key, entry["files"], entry["meta"]),
                                     unsigned=f"unsigned ({TRUSTED_KEYS_VARIABLE} is set)",
                                     altered="altered, or moved from another entry")
        except signing.BadSignature as exc:
            raise Untrusted(str(exc)) from None
        return True

    def _mark_used(self, directory):
        if self.read_only:
            return
        # Best effort: a read-only shared cache, or an entry pruned meanwhile, still served this hit.
        with contextlib.suppress(OSError):
            self.fs.pipe_file(posixpath.join(directory, USED_FILE), f"{time.time():.6f}".encode())

    # -- writing --------------------------------------------------------------------------------------------------

    def store(self, key, files, meta=None):
        """Publish {name: local path} as the entry `key`. Returns True when this call published it, False when an
        entry was already there (it is kept: the first writer wins). Raises OSError when the cache cannot be
        written; the build does not depend on it, so callers may warn and carry on. A read-only cache stores
        nothing, and so does one that checks signatures but cannot sign; a signing one first removes an entry in the
        way that it would not trust."""
        directory = self._entry_dir(key)
        for name in files:
            _check_name(name)
        if not self.writes:
            return False
        meta = dict(meta or {})
        if self.trusted_keys:
            self._remove_untrusted(key, directory)
        if self.local:
            return self._publish_by_rename(key, directory, files, meta)
        return self._publish_in_place(key, directory, files, meta)

    def _remove_untrusted(self, key, directory):
        with contextlib.suppress(_Corrupt, OSError):
            entry = self._read_entry(directory)
            if entry is not None:
                try:
                    self._check_signature(key, entry)
                except Untrusted:
                    self._remove(directory)

    def _publish_by_rename(self, key, directory, files, meta):
        if os.path.isfile(posixpath.join(directory, ENTRY_FILE)):
            return False
        staging = posixpath.join(self._layout, STAGING_DIR, f"{key}.{os.getpid()}.{secrets.token_hex(4)}")
        os.makedirs(staging)
        try:
            self._write_entry(key, staging, files, meta)
            os.makedirs(posixpath.dirname(directory), exist_ok=True)
            for _ in range(2):
                try:
                    os.rename(staging, directory)
                    return True
                except OSError:  # ENOTEMPTY / EEXIST: someone published first, or a broken folder is in the way
                    if not os.path.isdir(directory):
                        raise
                    if os.path.isfile(posixpath.join(directory, ENTRY_FILE)):
                        return False
                    self._remove(directory)
            return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _publish_in_place(self, key, directory, files, meta):
        entry_path = posixpath.join(directory, ENTRY_FILE)
        if self.fs.exists(entry_path):
            return False
        self.fs.makedirs(directory, exist_ok=True)
        record = self._write_blobs(directory, files)
        if self.fs.exists(entry_path):  # another writer finished first: keep its entry.json
            return False
        self.fs.pipe_file(entry_path, self._entry_json(key, record, meta))
        return True

    def _write_entry(self, key, directory, files, meta):
        record = self._write_blobs(directory, files)
        self.fs.pipe_file(posixpath.join(directory, ENTRY_FILE), self._entry_json(key, record, meta))

    def _entry_json(self, key, record, meta):
        entry = {"files": record, "meta": meta, "created": time.time()}
        if self.signing_key is not None:
            entry["signature"] = self.signing_key.sign(_signed_bytes(key, record, meta))
        return json.dumps(entry, sort_keys=True, indent=1).encode()

    def _write_blobs(self, directory, files):
        record = {}
        for name, source in files.items():
            digest, size = hashlib.sha256(), 0
            with open(source, "rb") as reader, self.fs.open(posixpath.join(directory, name), "wb") as writer:
                while chunk := reader.read(CHUNK_BYTES):
                    digest.update(chunk)
                    size += len(chunk)
                    writer.write(chunk)
            record[name] = {"sha256": digest.hexdigest(), "bytes": size}
        return record

    # -- housekeeping ---------------------------------------------------------------------------------------------

    def stats(self):
        """{"location", "entries", "bytes", "unfinished"}: complete entries and the bytes they hold (metadata
        included), and folders of unfinished or interrupted writes."""
        entries, unfinished = self._scan()
        return {"location": self.location, "entries": len(entries),
                "bytes": sum(entry["bytes"] for entry in entries.values()), "unfinished": len(unfinished)}

    def prune(self, max_bytes):
        """Remove least-recently-used entries until the complete ones hold at most `max_bytes`, and leftovers of
        writes older than STALE_AFTER_S. Returns {"removed", "freed", "entries", "bytes", "unfinished_removed"}."""
        self._refuse_if_read_only()
        entries, unfinished = self._scan()
        swept = self._sweep(unfinished)
        last_used = self._last_used(entries)
        total = sum(entry["bytes"] for entry in entries.values())
        removed = freed = 0
        for directory in sorted(entries, key=lambda d: (last_used[d], d)):
            if total <= max_bytes:
                break
            self._remove(directory)
            total -= entries[directory]["bytes"]
            freed += entries[directory]["bytes"]
            removed += 1
        return {"removed": removed, "freed": freed, "entries": len(entries) - removed, "bytes": total,
                "unfinished_removed": swept}

    def clear(self):
        """Remove every entry (and leftovers). Returns {"removed", "freed"}."""
        self._refuse_if_read_only()
        entries, _ = self._scan()
        if self.fs.exists(self._layout):
            self.fs.rm(self._layout, recursive=True)
        return {"removed": len(entries), "freed": sum(entry["bytes"] for entry in entries.values())}

    def _refuse_if_read_only(self):
        if self.read_only:
            raise PermissionError(f"the artifact cache {self.location} is read-only here ({READ_ONLY_VARIABLE}): "
                                  "prune or clear it where it is written")

    def _scan(self):
        """Complete entries {folder: {"bytes", "names"}} and unfinished folders {folder: newest time or None}, from
        one listing (one paginated request on an object store)."""
        groups = {}
        for path, info in self.fs.find(self._layout, detail=True).items():
            parts = self.fs._strip_protocol(path)[len(self._layout) + 1:].split("/")
            if len(parts) < 3:
                continue
            group = groups.setdefault(posixpath.join(self._layout, parts[0], parts[1]),
                                      {"bytes": 0, "names": set(), "time": None, "entry": _is_entry(parts)})
            group["bytes"] += info.get("size") or 0
            group["names"].add("/".join(parts[2:]))
            group["time"] = _newest(group["time"], _modified(info))
        if self.local:  # folders of writers killed before their first file
            for folder in (STAGING_DIR, TRASH_DIR):
                with contextlib.suppress(OSError), os.scandir(posixpath.join(self._layout, folder)) as found:
                    for child in found:
                        group = groups.setdefault(child.path, {"bytes": 0, "names": set(), "time": None,
                                                               "entry": False})
                        group["time"] = _newest(group["time"], child.stat(follow_symlinks=False).st_mtime)
        entries, unfinished = {}, {}
        for directory, group in groups.items():
            if group["entry"] and ENTRY_FILE in group["names"]:
                entries[directory] = group
            else:
                unfinished[directory] = group["time"]
        return entries, unfinished

    def _sweep(self, unfinished):
        now = time.time()
        stale = [d for d, newest in unfinished.items() if newest is not None and now - newest >= STALE_AFTER_S]
        for directory in stale:
            self._remove(directory)
        return len(stale)

    def _last_used(self, entries):
        """Each entry's latest hit, else its creation: read from the small `used` and entry.json files."""
        paths = [posixpath.join(d, name) for d in entries for name in (USED_FILE, ENTRY_FILE)
                 if name in entries[d]["names"]]
        contents = self.fs.cat(paths, on_error="omit") if paths else {}
        contents = {self.fs._strip_protocol(path): data for path, data in contents.items()}
        last_used = {}
        for directory in entries:
            times = [_float(contents.get(posixpath.join(directory, USED_FILE)))]
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                times.append(float(json.loads(contents[posixpath.join(directory, ENTRY_FILE)])["created"]))
            last_used[directory] = max(t for t in [*times, 0.0] if t is not None)
        return last_used

    def _remove(self, directory):
        """Best effort, and never on a read-only cache. Locally the folder is first renamed away, so that no reader
        sees it half deleted."""
        if self.read_only:
            return
        if self.local:
            trash = posixpath.join(self._layout, TRASH_DIR, f"{posixpath.basename(directory)}.{secrets.token_hex(4)}")
            with contextlib.suppress(OSError):
                os.makedirs(posixpath.dirname(trash), exist_ok=True)
                os.rename(directory, trash)
                directory = trash
            shutil.rmtree(directory, ignore_errors=True)
            return
        with contextlib.suppress(OSError):  # entry.json first: from then on no reader trusts the rest
            self.fs.rm_file(posixpath.join(directory, ENTRY_FILE))
        with contextlib.suppress(OSError):
            self.fs.rm(directory, recursive=True)

    def _entry_dir(self, key):
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"cache key must be 64 lowercase hex digits, not {key!r}")
        return posixpath.join(self._layout, key[:2], key)


def _signed_bytes(key, files, meta):
    """What an entry's signature covers: its key (so it cannot be moved under another), its files' hashes and sizes,
    and its metadata."""
    return json.dumps({"key": key, "files": files, "meta": meta}, sort_keys=True, separators=(",", ":")).encode()


def _check_name(name):
    if not isinstance(name, str) or name in _RESERVED_NAMES or name.startswith(".") or "/" in name or "\\" in name:
        raise ValueError(f"{name!r} cannot name a file of a cache entry")


def _is_entry(parts):
    prefix, key = parts[0], parts[1]
    return bool(_KEY.fullmatch(key)) and key[:2] == prefix


def _modified(info):
    """A listing entry's modification time in seconds, whichever name the filesystem gives it; None if none."""
    for name in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "timestamp"):
            return value.timestamp()
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(str(value)).timestamp()
    return None


def _newest(current, candidate):
    if candidate is None:
        return current
    return candidate if current is None else max(current, candidate)


def _float(data):
    try:
        return float(data)
    except (TypeError, ValueError):
        return None

