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
import secrets
from pathlib import Path

from mobilebuild.errors import MobileBuildError

_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_KEY_TEXT = re.compile(rf"({_NAME}):([A-Za-z0-9+/]{{43}}=)")
SEED_BYTES = 32


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

    def __init__(self, name, seed):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.name = name
        self._key = Ed25519PrivateKey.from_private_bytes(seed)

    def __repr__(self):  # never the seed, wherever a key ends up printed
        return f"PrivateKey({self.name!r})"

    @classmethod
    def generate(cls, name):
        if not re.fullmatch(_NAME, name):
            raise MobileBuildError(f"{name!r} cannot name a key: letters, digits, '.', '_' and '-' only")
        return cls(name, secrets.token_bytes(SEED_BYTES))

    @classmethod
    def load(cls, value, what="the private key"):
        """`value` is the key's text (NAME:BASE64) or the path of a file holding it."""
        text = str(value).strip()
        if not _KEY_TEXT.fullmatch(text):
            try:
                text = Path(text).expanduser().read_text()
            except OSError as exc:
                raise MobileBuildError(f"{what}: cannot read {value} ({exc.strerror or type(exc).__name__})") \
                    from None
            what = f"{value}"
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

    def verify(self, signature, data):
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(base64.b64decode(signature["sig"], validate=True), data)
        except (InvalidSignature, binascii.Error, ValueError):
            raise BadSignature(f"its signature by {self.name} does not match") from None


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

    def verify(self, signature, data):
        """Raises BadSignature unless `signature` ({"key", "sig"}) is a good signature of `data` by a key here."""
        if not isinstance(signature, dict) or not isinstance(signature.get("sig"), str):
            raise BadSignature("unsigned")
        key = self.keys.get(signature.get("key"))
        if key is None:
            raise BadSignature(f"signed by {signature.get('key')!r}, a key not trusted here (trusted: "
                               f"{self.names()})")
        key.verify(signature, data)
