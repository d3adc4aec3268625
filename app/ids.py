"""Identifiers and secrets: prefixed random ids, base62, and checksummed credentials."""
from __future__ import annotations

import hashlib
import secrets
import zlib

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_INDEX = {c: i for i, c in enumerate(ALPHABET)}


def b62encode(n: int, width: int = 0) -> str:
    out = []
    while n:
        n, r = divmod(n, 62)
        out.append(ALPHABET[r])
    s = "".join(reversed(out)) or "0"
    return s.rjust(width, "0")


_UNBIASED = 248  # 4 × 62: a random byte below it maps to a base62 digit without bias


def random_b62(length: int) -> str:
    """``length`` uniformly random base62 characters from the OS CSPRNG, in one read of
    random bytes (rejection sampling; one ``secrets.choice`` per character would read
    the OS randomness once per character — on every id of every metered call)."""
    out: list[str] = []
    while len(out) < length:
        out.extend(ALPHABET[b % 62] for b in secrets.token_bytes(length + 8) if b < _UNBIASED)
    return "".join(out[:length])


def new_id(prefix: str, length: int = 20) -> str:
    """A public object id like ``acct_3kT9...`` (20 base62 chars ≈ 119 bits)."""
    return f"{prefix}_{random_b62(length)}"


def checksum(body: str) -> str:
    """6 base62 characters of CRC32 over ``body`` (lets secret scanners verify a token)."""
    return b62encode(zlib.crc32(body.encode()) & 0xFFFFFFFF, 6)


def new_secret(prefix: str, random_len: int = 32) -> str:
    """``<prefix><32 base62 chars ≈ 190 bits><6-char CRC32>``, e.g. ``svc_live_…``."""
    body = prefix + random_b62(random_len)
    return body + checksum(body)


def secret_is_well_formed(token: str, prefix: str, random_len: int = 32) -> bool:
    if not token.startswith(prefix) or len(token) != len(prefix) + random_len + 6:
        return False
    tail = token[len(prefix):]
    if any(c not in _INDEX for c in tail):
        return False
    return checksum(token[:-6]) == token[-6:]


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()
