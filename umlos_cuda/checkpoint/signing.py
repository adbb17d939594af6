"""Ed25519 signatures for run-commit and migration certificates.

A certificate is the canonical CBOR map
``{"algorithm": "Ed25519", "body": BODY, "public_key": bytes(32), "signature": bytes(64)}``
and the signature covers ``DOMAIN || CBOR_CANONICAL(BODY)`` where ``DOMAIN``
names the certificate kind, so a signature over one kind can never be replayed
as another. Ed25519 (RFC 8032) is deterministic: the same key and body give
the same certificate bytes on every machine.

Keys are accepted as an ``Ed25519PrivateKey``, its 32-byte seed, or a PEM file
path; public keys as 32 raw bytes, 64 hex digits, or a PEM file path.
"""

from __future__ import annotations

import os
import re
from functools import partial
from typing import Any

from .. import checks, errors
from .codes import error, exact_map
from ..hashing import cbor_canonical

ALGORITHM = "Ed25519"
RUN_COMMIT_DOMAIN = b"UML_OS.Checkpoint.RunCommit_v1\x00"
MIGRATION_DOMAIN = b"UML_OS.Checkpoint.Migrate_v1\x00"
CERTIFICATE_KEYS = frozenset({"algorithm", "body", "public_key", "signature"})
_HEX64 = re.compile(r"[0-9a-fA-F]{64}\Z")


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - the checkpoint extra is missing
        raise error(
            errors.CHECKPOINT_SIGNATURE_INVALID,
            "signing needs the 'cryptography' package: pip install 'umlos-cuda[checkpoint]'",
        ) from exc
    return ed25519


def load_private_key(key: Any):
    """An ``Ed25519PrivateKey`` from a key object, a 32-byte seed or a PEM file path."""
    ed25519 = _ed25519()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key
    if isinstance(key, (bytes, bytearray)) and len(key) == 32:
        return ed25519.Ed25519PrivateKey.from_private_bytes(bytes(key))
    if isinstance(key, (str, os.PathLike)) and os.path.isfile(key):
        from cryptography.hazmat.primitives import serialization

        try:
            with open(key, "rb") as handle:
                loaded = serialization.load_pem_private_key(handle.read(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise error(errors.CHECKPOINT_SIGNATURE_INVALID, f"cannot load a private key from {key}: {exc}") from None
        if isinstance(loaded, ed25519.Ed25519PrivateKey):
            return loaded
        raise error(errors.CHECKPOINT_SIGNATURE_INVALID, f"{key} holds a {type(loaded).__name__}, not an Ed25519 key")
    raise error(
        errors.CHECKPOINT_SIGNATURE_INVALID,
        "a signing key is an Ed25519PrivateKey, its 32-byte seed or a PEM file path",
    )


def public_key_bytes(private_key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return load_private_key(private_key).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def parse_public_key(value: Any) -> bytes:
    """32 raw public-key bytes from bytes, 64 hex digits or a PEM file path."""
    if isinstance(value, (bytes, bytearray)) and len(value) == 32:
        return bytes(value)
    if isinstance(value, str) and _HEX64.match(value.strip()):
        return bytes.fromhex(value.strip())
    if isinstance(value, (str, os.PathLike)) and os.path.isfile(value):
        from cryptography.hazmat.primitives import serialization

        try:
            with open(value, "rb") as handle:
                raw = handle.read(1 << 16)
            if len(raw) == 32:
                return raw
            text = raw.decode("ascii", "replace").strip()
            if _HEX64.match(text):
                return bytes.fromhex(text)
            loaded = serialization.load_pem_public_key(raw)
        except (OSError, ValueError, TypeError) as exc:
            raise error(errors.CHECKPOINT_SIGNATURE_INVALID, f"cannot load a public key from {value}: {exc}") from None
        ed25519 = _ed25519()
        if not isinstance(loaded, ed25519.Ed25519PublicKey):
            raise error(errors.CHECKPOINT_SIGNATURE_INVALID, f"{value} does not hold an Ed25519 public key")
        return loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    raise error(
        errors.CHECKPOINT_SIGNATURE_INVALID,
        "a public key is 32 bytes, 64 hex digits, or a file holding raw, hex or PEM Ed25519 key bytes",
    )


def sign_certificate(domain: bytes, body: dict, private_key) -> dict:
    """A certificate over ``body`` (see the module docstring)."""
    key = load_private_key(private_key)
    signature = key.sign(domain + cbor_canonical(body))
    return {"algorithm": ALGORITHM, "body": body, "public_key": public_key_bytes(key), "signature": signature}


def check_certificate(domain: bytes, certificate: Any, what: str, trusted_key: bytes | None = None) -> dict:
    """Check a decoded certificate's shape and signature; return its body.

    With ``trusted_key`` the certificate must also carry that key; without one
    the signature proves integrity (the bytes are what the key holder signed)
    but not who signed.
    """
    code = errors.CHECKPOINT_SIGNATURE_INVALID
    exact_map(certificate, CERTIFICATE_KEYS, f"{what}: a certificate has exactly the keys {sorted(CERTIFICATE_KEYS)}",
              code)
    fail = partial(error, code)
    checks.equal(certificate["algorithm"], f"{what}: algorithm", ALGORITHM, fail=fail,
                 message="{name} {value!r} is not {expected}")
    public_key, signature, body = certificate["public_key"], certificate["signature"], certificate["body"]
    for name, value, size in (("public_key", public_key, 32), ("signature", signature, 64)):
        checks.instance(value, f"{what}: {name}", bytes, length=size, fail=fail,
                        message="{name} must be {length} bytes")
    checks.instance(body, f"{what}: body", dict, fail=fail, message="{name} must be a map")
    if trusted_key is not None and public_key != trusted_key:
        raise error(code, f"{what}: signed by key {public_key.hex()}, not the trusted key {trusted_key.hex()}")
    ed25519 = _ed25519()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public_key).verify(signature, domain + cbor_canonical(body))
    except (InvalidSignature, ValueError):
        raise error(code, f"{what}: the Ed25519 signature does not verify") from None
    return body
