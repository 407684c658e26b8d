"""NATS nkeys: ed25519 keys written as base32 text with a role prefix and a CRC-16.

A public key is ``base32(prefix byte + 32 key bytes + crc16 little-endian)`` (56
characters: ``A…`` an account, ``N…`` a server, ``U…`` a user); a seed is the
same with a two-byte ``S<role>`` header (``SA…``). The ed25519 arithmetic is
PyNaCl's, through the ``nkeys`` package; the text forms are checked here, so a
wrong role, length or checksum is a clear :class:`NkeyError`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

import nacl.exceptions
import nacl.signing
import nkeys

ACCOUNT, SERVER, USER = "A", "N", "U"
_ROLE_BYTES = {ACCOUNT: nkeys.PREFIX_BYTE_ACCOUNT, SERVER: nkeys.PREFIX_BYTE_SERVER, USER: nkeys.PREFIX_BYTE_USER}
_NAMES = {ACCOUNT: "account", SERVER: "server", USER: "user"}
_MIN_MATERIAL = 32


class NkeyError(ValueError):
    """Text that is not the nkey it should be (the message says why)."""


def _crc(data: bytes) -> bytes:
    return int(nkeys.crc16(data)).to_bytes(2, "little")


def _unbase32(text: str, what: str) -> bytes:
    try:
        return base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise NkeyError(f"{what} {text[:12]!r}… is not base32") from None


def encode_public(raw: bytes, role: str) -> str:
    if len(raw) != 32:
        raise NkeyError(f"an ed25519 public key has 32 bytes, not {len(raw)}")
    body = bytes([_ROLE_BYTES[role]]) + raw
    return base64.b32encode(body + _crc(body)).decode().rstrip("=")


def decode_public(text: str, role: str) -> bytes:
    """The 32 key bytes of public key ``text``, which must be of ``role``."""
    data = _unbase32(text, f"{_NAMES[role]} public key")
    if len(data) != 35:
        raise NkeyError(f"{_NAMES[role]} public key {text[:12]!r}… decodes to {len(data)} bytes, not 35")
    if data[0] != _ROLE_BYTES[role]:
        raise NkeyError(f"{text[:12]!r}… is not a {_NAMES[role]} public key (it starts with {text[:1]!r})")
    if _crc(data[:33]) != data[33:]:
        raise NkeyError(f"{_NAMES[role]} public key {text[:12]!r}… fails its checksum")
    return data[1:33]


def verify(public: str, role: str, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` over ``data`` is by the key ``public`` (of ``role``)."""
    key = nacl.signing.VerifyKey(decode_public(public, role))
    try:
        key.verify(data, signature)
    except (nacl.exceptions.BadSignatureError, ValueError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class Signer:
    """A private key that signs, with its public key."""

    public: str
    _key: nacl.signing.SigningKey

    def sign(self, data: bytes) -> bytes:
        return bytes(self._key.sign(data).signature)


def signer(raw_seed: bytes, role: str) -> Signer:
    if len(raw_seed) != 32:
        raise NkeyError(f"an ed25519 seed has 32 bytes, not {len(raw_seed)}")
    key = nacl.signing.SigningKey(raw_seed)
    return Signer(encode_public(bytes(key.verify_key), role), key)


def encode_seed(raw_seed: bytes, role: str) -> str:
    return bytes(nkeys.encode_seed(raw_seed, _ROLE_BYTES[role])).decode()


def from_seed(text: str, role: str) -> Signer:
    """The signer of seed text ``S<role>…``."""
    data = _unbase32(text, "seed")
    if len(data) != 36:
        raise NkeyError(f"a seed decodes to 36 bytes, not {len(data)}")
    expected = encode_seed(data[2:34], role)
    if text.rstrip("=") != expected:
        raise NkeyError(f"{text[:2]!r}… is not a valid {_NAMES[role]} seed (want S{role}…, with its checksum)")
    return signer(data[2:34], role)


def account_signer(secret: str) -> Signer:
    """The account key of an issuer secret: an account seed (``SA…``) as ``nsc``/``nk`` write it,
    or at least 32 characters of random text from which the seed is derived (SHA-256)."""
    text = secret.strip()
    if text.startswith("SA"):
        return from_seed(text, ACCOUNT)
    if len(text) < _MIN_MATERIAL:
        raise NkeyError(f"the issuer secret is neither an account seed (SA…) nor random text of at least "
                        f"{_MIN_MATERIAL} characters ({len(text)} characters)")  # fmt: skip
    return signer(hashlib.sha256(text.encode()).digest(), ACCOUNT)
