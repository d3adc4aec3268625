"""Signature primitives, each written once: canonical base58, ed25519 verification
(PyNaCl), EVM signature recovery (eth-account: EIP-191 personal messages, which
EIP-4361 sign-in texts are, and EIP-712 typed data as x402 uses) and Standard Webhooks
signing (one cached signer per secret).

Every parser here is strict and answers ``None`` (or ``False``) for anything that is
not exactly what it expects, so callers turn that into their own 4xx error; nothing in
this module touches the database or raises domain errors.
"""
from __future__ import annotations

from datetime import datetime
from functools import lru_cache

import base58
from nacl.bindings import crypto_core_ed25519_is_valid_point
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.secret import SecretBox
from nacl.signing import VerifyKey
from standardwebhooks import Webhook

ED25519_KEY_BYTES = 32
ED25519_SIG_BYTES = 64
EVM_SIG_BYTES = 65
_B58_MAX_LEN = 100  # 64 bytes encode to at most 88 characters


# --- base58 ------------------------------------------------------------------------------

def b58encode(raw: bytes) -> str:
    """Bitcoin-alphabet base58 text of ``raw``."""
    return base58.b58encode(raw).decode("ascii")


def b58decode(text: str, size: int) -> bytes | None:
    """The ``size`` bytes that ``text`` encodes, or None unless ``text`` is their one
    canonical base58 spelling: no whitespace or other characters, no extra leading
    ``1`` (zero byte), and exactly ``size`` bytes. Re-encoding gives ``text`` back."""
    if (not isinstance(text, str) or not text or len(text) > _B58_MAX_LEN or not text.isascii()
            or not text.isalnum()):
        return None
    try:
        raw = base58.b58decode(text)
    except ValueError:
        return None
    if len(raw) != size or b58encode(raw) != text:
        return None
    return raw


# --- ed25519 -----------------------------------------------------------------------------

def ed25519_key_is_valid(raw: bytes) -> bool:
    """Whether ``raw`` is 32 bytes encoding a point on the curve (a usable public key)."""
    return (isinstance(raw, bytes) and len(raw) == ED25519_KEY_BYTES
            and bool(crypto_core_ed25519_is_valid_point(raw)))


def ed25519_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Whether ``signature`` (64 bytes) is ``public_key``'s ed25519 signature of ``message``."""
    if len(public_key) != ED25519_KEY_BYTES or len(signature) != ED25519_SIG_BYTES:
        return False
    try:
        VerifyKey(public_key).verify(message, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True


# --- EVM (secp256k1) ---------------------------------------------------------------------

def evm_signature(text: str) -> bytes | None:
    """The 65 bytes (r, s, v) of a ``0x``-prefixed (or bare) hex signature, else None."""
    if not isinstance(text, str):
        return None
    hexsig = text[2:] if text.startswith("0x") else text
    if len(hexsig) != 2 * EVM_SIG_BYTES:
        return None
    try:
        return bytes.fromhex(hexsig)
    except ValueError:
        return None


def recover_personal_message(message: str, signature: bytes) -> str | None:
    """EIP-55 address that signed the EIP-191 personal message ``message`` (the text a
    wallet shows, e.g. an EIP-4361 sign-in message), or None when it cannot be recovered."""
    from eth_account import Account  # about 1 s to import: only where a signature is checked
    from eth_account.messages import encode_defunct

    try:
        return Account.recover_message(encode_defunct(text=message), signature=signature)
    except Exception:  # eth-account raises several types for a malformed (r, s, v)
        return None


def recover_typed_data(typed_data: dict, signature: bytes) -> str | None:
    """EIP-55 address that signed the EIP-712 ``typed_data`` (full message: types,
    primaryType, domain, message), or None when it cannot be recovered."""
    from eth_account import Account  # see recover_personal_message
    from eth_account.messages import encode_typed_data

    try:
        return Account.recover_message(encode_typed_data(full_message=typed_data), signature=signature)
    except Exception:  # malformed typed data or signature values
        return None


# --- Standard Webhooks --------------------------------------------------------------------

@lru_cache(maxsize=512)
def _signer(secret: str) -> Webhook:
    return Webhook(secret)


def webhook_headers(msg_id: str, timestamp: datetime, body: bytes | str,
                    secret: str | None) -> dict:
    """``webhook-id``, ``webhook-timestamp`` and, when a ``whsec_`` secret is given,
    ``webhook-signature`` of a Standard Webhooks delivery of ``body``."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(timestamp.timestamp()))}
    if secret:
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        headers["webhook-signature"] = _signer(secret).sign(msg_id, timestamp, text)
    return headers


# --- secrets at rest (SecretBox) ---------------------------------------------------------

def seal(key: bytes, plaintext: str) -> bytes:
    """``plaintext`` encrypted and authenticated under the 32-byte ``key`` (XSalsa20-Poly1305,
    PyNaCl's SecretBox; a random nonce, stored in front of the ciphertext)."""
    return bytes(SecretBox(key).encrypt(plaintext.encode("utf-8")))


def unseal(key: bytes, sealed: bytes) -> str | None:
    """The text ``seal`` encrypted, or None when ``sealed`` was not sealed under ``key``
    (another key, or altered)."""
    try:
        return SecretBox(key).decrypt(bytes(sealed)).decode("utf-8")
    except (CryptoError, ValueError, UnicodeDecodeError):
        return None
