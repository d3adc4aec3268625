"""Tokens mailed to people: single-use confirmation tokens (stored hashed) and signed,
non-expiring list-unsubscribe tokens (RFC 8058 one-click links)."""
from __future__ import annotations

import secrets

from flask import current_app
from itsdangerous import BadSignature, URLSafeSerializer

from app.ids import sha256_hex

_UNSUB_SALT = "list-unsubscribe.v1"


def new_token() -> tuple[str, str]:
    """A fresh URL-safe token (256 bits) and its SHA-256, which is all that is stored."""
    token = secrets.token_urlsafe(32)
    return token, sha256_hex(token)


def token_hash(token: str | None) -> str | None:
    """SHA-256 of a presented token, or None when it cannot be one of ours."""
    if not token or len(token) > 100:
        return None
    return sha256_hex(token)


def _serializer() -> URLSafeSerializer:
    return URLSafeSerializer(current_app.config["SECRET_KEY"], salt=_UNSUB_SALT)


def unsubscribe_token(email: str) -> str:
    """Signed token naming ``email`` (HMAC with SECRET_KEY). Unsubscribe links must keep
    working for as long as the mail sits in an inbox, so it does not expire."""
    return _serializer().dumps({"e": email})


def unsubscribe_email(token: str) -> str | None:
    """The address a valid unsubscribe token names, else None."""
    if not token or len(token) > 600:
        return None
    try:
        data = _serializer().loads(token)
    except BadSignature:
        return None
    email = data.get("e") if isinstance(data, dict) else None
    return email if isinstance(email, str) else None


def link(path: str) -> str:
    """Absolute link under BASE_URL."""
    return current_app.config["BASE_URL"].rstrip("/") + path
