"""Ed25519 keys and signatures for the shared artifact cache and releases (the `cryptography` package does the
cryptography; this module only names, reads and writes keys).

Keys are written as Nix writes its binary caches' keys, `NAME:BASE64`: the name says which key signed (and so which
to retire when rotating), the base64 is the 32-byte public key, or for a private key its 32-byte seed. A signature
is {"key": NAME, "sig": BASE64} over bytes; Ed25519 signatures are deterministic, so signing the same bytes twice
gives the same signature (a release stays byte-identical).

A key ring is the public keys a reader trusts: a signature is good when its key's name is in the ring and it
verifies with that key. Listing the old and the new key while rotating lets readers accept both until every
writer has the new one.
"""

import base64
import binascii
import os
import re
from pathlib import Path

from mobilebuild.errors import MobileBuildError

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_KEY_TEXT = re.compile(rf"({_NAME}):([A-Za-z0-9+/]{{43}}=)")


class BadSignature(Exception):
    """A signature that does not hold: the message says why, in a few words."""


def _decode(text, what):
    match = _KEY_TEXT.fullmatch(text.strip())
    if not match:
        raise MobileBuildError(f"{what} is not a key of the form NAME:BASE64 (as `mobilebuild keygen` prints)")
    try:
        raw = base64.b64decode(match.group(2), validate=True)
    except binascii.Error:
        raise MobileBuildError(f"{what} is not a key of the form NAME:BASE64") from None
    return match.group(1), raw


class PrivateKey:
    """A named Ed25519 private key, read from its text or from a file holding it."""

    def __init__(self, name, seed=None):
        """A new key, or the one of this 32-byte seed."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.name = name
        self._key = Ed25519PrivateKey.generate() if seed is None else Ed25519PrivateKey.from_private_bytes(seed)

    def __repr__(self):  # never the seed, wherever a key ends up printed
        return f"PrivateKey({self.name!r})"

    @classmethod
    def generate(cls, name):
        if not re.fullmatch(_NAME, name):
            raise MobileBuildError(f"{name!r} cannot name a key: letters, digits, '.', '_' and '-' only")
        return cls(name)

    @classmethod
    def load(cls, value, what="the private key"):
        """`value` is the key's text (NAME:BASE64) or the path of a file holding it."""
        text = str(value).strip()
        if not _KEY_TEXT.fullmatch(text):
            # a mistyped key is a secret too: only what cannot be one (no colon) is named
            shown = "its value (neither a key NAME:BASE64 nor a file)" if ":" in text else text
            try:
                text = Path(text).expanduser().read_text()
            except OSError as exc:
                raise MobileBuildError(f"{what}: cannot read {shown} ({exc.strerror or type(exc).__name__})") \
                    from None
            what = shown
        return cls(*_decode(text, what))

    def text(self):
        """NAME:BASE64 of the seed: what the key file holds. Secret."""
        from cryptography.hazmat.primitives import serialization

        seed = self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())
        return f"{self.name}:{base64.b64encode(seed).decode()}"

    def public(self):
        from cryptography.hazmat.primitives import serialization

        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return PublicKey(self.name, raw)

    def sign(self, data):
        return {"key": self.name, "sig": base64.b64encode(self._key.sign(data)).decode()}

    def write(self, path):
        """Write the key to a new file only its owner can read; never replaces a file."""
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(self.text() + "\n")


class PublicKey:
    def __init__(self, name, raw):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        self.name = name
        self._raw = raw
        self._key = Ed25519PublicKey.from_public_bytes(raw)

    @classmethod
    def parse(cls, text, what="a trusted key"):
        try:
            return cls(*_decode(text, what))
        except ValueError:  # 32 bytes that are not a point of the curve
            raise MobileBuildError(f"{what} is not an Ed25519 public key") from None

    def text(self):
        return f"{self.name}:{base64.b64encode(self._raw).decode()}"

    def __eq__(self, other):
        return isinstance(other, PublicKey) and (self.name, self._raw) == (other.name, other._raw)

    def __hash__(self):
        return hash((self.name, self._raw))

    def verify(self, signature, data, altered="altered"):
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(base64.b64decode(signature["sig"], validate=True), data)
        except (InvalidSignature, binascii.Error, ValueError):
            raise BadSignature(f"its signature by {self.name} does not match ({altered})") from None


class KeyRing:
    """The public keys a reader trusts, by name."""

    def __init__(self, keys=()):
        self.keys = {}
        for key in keys:
            if key.name in self.keys and self.keys[key.name] != key:
                raise MobileBuildError(f"two trusted keys are named {key.name!r}: give each key its own name")
            self.keys[key.name] = key

    @classmethod
    def parse(cls, texts, what="a trusted key"):
        """Keys from texts, each holding one or more NAME:BASE64 separated by spaces, commas or newlines."""
        return cls(PublicKey.parse(word, what) for text in texts for word in re.split(r"[\s,]+", text) if word)

    def __bool__(self):
        return bool(self.keys)

    def names(self):
        return ", ".join(sorted(self.keys)) or "none"

    def verify(self, signature, data, unsigned="unsigned", altered="altered"):
        """Raises BadSignature unless `signature` ({"key", "sig"}) is a good signature of `data` by a key here; its
        message is `unsigned` where there is no signature, and names `altered`, what a mismatch means, where one
        does not match."""
        if not isinstance(signature, dict) or not isinstance(signature.get("sig"), str):
            raise BadSignature(unsigned)
        key = self.keys.get(signature.get("key"))
        if key is None:
            raise BadSignature(f"signed by {signature.get('key')!r}, a key not trusted here (trusted: "
                               f"{self.names()})")
        key.verify(signature, data, altered)


KEYGEN_ADVICE = """\
wrote the private key {name} to {path} (readable by you only): keep it on the machines that sign, never in a
repository, a log or a reader's environment.
public key: {public}

Shared artifact cache
  writers (CI):               MOBILEBUILD_CACHE_SIGNING_KEY={path}  (the file, or its content from a CI secret)
  every machine that reads:   MOBILEBUILD_CACHE_TRUSTED_KEYS="{public}"
                              (several keys separated by spaces: list the old and the new one while rotating)
Releases
  sign:                       mobilebuild release --signing-key {path}  (or MOBILEBUILD_RELEASE_SIGNING_KEY)
  check (an app's CI):        mobilebuild verify-release DIR --signature-only --trusted-key {public}
                              (or MOBILEBUILD_RELEASE_TRUSTED_KEYS)"""


def keygen_command(argv):
    """`mobilebuild keygen NAME [--out FILE]`: a new key pair; the private key to a file, the rest printed."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="mobilebuild keygen", description="Make an Ed25519 key pair for signing "
                                     "the shared artifact cache or releases, and say what to put where.")
    parser.add_argument("name", help="the key's name, e.g. ci-2026: signatures name it, readers trust it by it")
    parser.add_argument("--out", type=Path, help="the private key's file (default: NAME.key); never replaced")
    options = parser.parse_args(argv)
    path = options.out or Path(f"{options.name}.key")
    try:
        key = PrivateKey.generate(options.name)
        key.write(path)
    except MobileBuildError as exc:
        print(f"mobilebuild keygen: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mobilebuild keygen: cannot write {path}: {exc.strerror or type(exc).__name__}"
              f"{' (choose another --out)' if path.exists() else ''}", file=sys.stderr)
        return 1
    print(KEYGEN_ADVICE.format(name=key.name, path=path.resolve(), public=key.public().text()))
    return 0
