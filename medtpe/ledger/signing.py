"""The key that signs receipts (Ed25519, `cryptography`), its public JWK (RFC 8037) and its id
(the JWK thumbprint, RFC 7638).

The key comes from `MEDTPE_LEDGER_SIGNING_KEY` (PEM PKCS#8 text, or the base64 of the 32-byte
seed). A local SQLite ledger without it gets a key generated once and kept in
`.cache/ledger-signing-key` (mode 0600, created atomically: processes starting at once share
one key), with a warning; a key file that group or others may open, or that is empty or holds no
key, is refused, never replaced. Any other ledger refuses to start without a configured key."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from medtpe.ledger.receipt import Receipt

logger = logging.getLogger(__name__)
SEED_BYTES = 32


class SigningKeyError(ValueError):
    """The signing key is missing where it is required, or cannot be read."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public_key: Ed25519PublicKey) -> str:
    """The key's id: its RFC 7638 JWK thumbprint (SHA-256, base64url)."""
    members = {"crv": "Ed25519", "kty": "OKP", "x": _b64url(_raw_public(public_key))}
    canonical = json.dumps(members, sort_keys=True, separators=(",", ":")).encode()
    return _b64url(hashlib.sha256(canonical).digest())


def public_jwk(public_key: Ed25519PublicKey) -> dict[str, str]:
    """The public key as a JWK (`GET /ledger/public-key` serves it)."""
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": _b64url(_raw_public(public_key)),
        "alg": "EdDSA",
        "use": "sig",
        "kid": key_id(public_key),
    }


def public_key_from_jwk(jwk: dict[str, Any]) -> Ed25519PublicKey:
    """An Ed25519 public key from its JWK; a SigningKeyError when it is none."""
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519" or "x" not in jwk:
        raise SigningKeyError("the JWK is no Ed25519 public key (kty OKP, crv Ed25519, x)")
    try:
        return Ed25519PublicKey.from_public_bytes(_b64url_decode(str(jwk["x"])))
    except (ValueError, binascii.Error) as exc:
        raise SigningKeyError(f"the JWK's x is no Ed25519 public key: {exc}") from exc


def parse_private_key(text: str) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM (PKCS#8) text or the base64 of its 32-byte seed."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError) as exc:
            raise SigningKeyError(f"the signing key's PEM cannot be read: {exc}") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError("the signing key's PEM holds no Ed25519 private key")
        return key
    try:
        seed = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise SigningKeyError("the signing key is neither PEM nor base64") from exc
    if len(seed) != SEED_BYTES:
        raise SigningKeyError(
            f"the signing key's base64 holds {len(seed)} bytes, an Ed25519 seed has {SEED_BYTES}"
        )
    return Ed25519PrivateKey.from_private_bytes(seed)


def local_key(path: Path) -> Ed25519PrivateKey:
    """The key kept in `path` (`read_key_file`), generated there the first time
    (`create_key_file`): every process that starts at once ends up with the same key."""
    if not path.exists():
        create_key_file(path)
    return read_key_file(path)


def create_key_file(path: Path) -> None:
    """Write a new key to `path` unless a key is there: the seed goes to a temporary file in the
    same directory (mode 0600 from its creation, synced), which is then hard-linked as `path`.
    The link fails when `path` exists, so of processes racing to create it one wins and the
    others read its complete file; a failed write (a full disk) leaves no `path` behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(base64.b64encode(seed) + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:  # another process made it meanwhile: its key is the key
            return
        _sync_directory(path.parent)
    except OSError as exc:
        raise SigningKeyError(
            f"the signing key file {path} cannot be created ({exc.strerror or exc}): free the "
            "space or fix the directory, or set MEDTPE_LEDGER_SIGNING_KEY"
        ) from exc
    finally:
        temporary.unlink(missing_ok=True)
    logger.warning(
        "no MEDTPE_LEDGER_SIGNING_KEY: receipts are signed with a key generated in %s (fine for "
        "a local ledger; set MEDTPE_LEDGER_SIGNING_KEY for a shared one)",
        path,
    )


def _sync_directory(directory: Path) -> None:
    """Make a new name in `directory` durable (fsync of the directory itself)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_key_file(path: Path) -> Ed25519PrivateKey:
    """The key in the local key file `path`; a `SigningKeyError` naming the file when group or
    others may open it, or when it is empty or holds no key. Such a file is never replaced by a
    new key: the receipts signed with its key verify only with it."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise SigningKeyError(
                f"the signing key file {path} is open to group or others (mode {mode:04o}): "
                f"run `chmod 600 {path}`"
            )
        text = path.read_text()
    except OSError as exc:
        raise SigningKeyError(
            f"the signing key file {path} cannot be read: {exc.strerror or exc}"
        ) from exc
    keep = (
        "restore it from a backup (the receipts it signed verify only with its key), or move it "
        "away to start a new key"
    )
    if not text.strip():
        raise SigningKeyError(f"the signing key file {path} is empty: {keep}")
    try:
        return parse_private_key(text)
    except SigningKeyError as exc:
        raise SigningKeyError(f"the signing key file {path} holds no key ({exc}): {keep}") from exc


@dataclass(frozen=True)
class Signer:
    """Signs receipts with one private key."""

    private_key: Ed25519PrivateKey

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The key that checks this signer's signatures."""
        return self.private_key.public_key()

    @property
    def key_id(self) -> str:
        """The public key's thumbprint (a ledger row's `key_id`)."""
        return key_id(self.public_key)

    def jwk(self) -> dict[str, str]:
        """The public key as a JWK."""
        return public_jwk(self.public_key)

    def sign(self, receipt: Receipt) -> str:
        """The base64url Ed25519 signature of the receipt's canonical bytes."""
        return self.sign_bytes(receipt.canonical())

    def sign_bytes(self, data: bytes) -> str:
        """The base64url Ed25519 signature of `data` (a ledger checkpoint's signed bytes)."""
        return _b64url(self.private_key.sign(data))


def signer_for(url: str, key_text: str | None, key_file: Path) -> Signer:
    """The signer of the ledger at `url`: the configured key, else for a SQLite ledger the
    local key in `key_file`; a SigningKeyError for any other ledger without a key."""
    if key_text:
        return Signer(parse_private_key(key_text))
    if not url.startswith("sqlite"):
        raise SigningKeyError(
            "MEDTPE_LEDGER_SIGNING_KEY is required with a ledger other than a local SQLite file "
            "(PEM PKCS#8 text or the base64 of a 32-byte Ed25519 seed)"
        )
    return Signer(local_key(key_file))


def verify_signature(receipt: Receipt, signature: str, public_key: Ed25519PublicKey) -> bool:
    """Whether `signature` (base64url) signs `receipt`'s canonical bytes under `public_key`."""
    return verify_bytes(receipt.canonical(), signature, public_key)


def verify_bytes(data: bytes, signature: str, public_key: Ed25519PublicKey) -> bool:
    """Whether `signature` (base64url) signs `data` under `public_key`."""
    try:
        public_key.verify(_b64url_decode(signature), data)
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True
