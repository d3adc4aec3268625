"""Tokens: single-use tokens of every purpose (one table, one consumption rule) and the
signed, non-expiring list-unsubscribe tokens (RFC 8058 one-click links).

Single-use tokens serve agent sign-in nonces, wallet-connect nonces, sign-up links,
newsletter confirmations, alert e-mail target confirmations, console sign-in links and console sessions (a session row is
usable until it expires — the absolute timeout — or is consumed by signing out):

* ``issue`` stores only the SHA-256 of the token (with its purpose, subject, expiry and
  extra data) and returns the token text, which exists nowhere else.
* ``lookup`` / ``find_usable`` read without consuming, for the checks that must pass
  first (a signature over the nonce, a confirmation page).
* ``consume`` is the one place a token is used: a single conditional
  ``UPDATE … SET used_at = now WHERE token_hash = ? AND purpose = ? AND used_at IS NULL
  AND expires_at > now RETURNING …``; a replay, an expired token or a concurrent second
  use changes no row and gets None.
* ``purge`` (scheduled: ``tokens-purge``) deletes tokens used or expired long enough ago.

None of these commit: the caller's unit of work does, so consuming a token and acting on
it (a session, a wallet, an account) commit or roll back together.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from flask import current_app
from itsdangerous import BadSignature, URLSafeSerializer
from sqlalchemy import delete, or_, select, update

from app.extensions import db
from app.ids import sha256_hex
from app.models.base import utcnow
from app.models.tokens import SingleUseToken
from app.services.platform.uow import transactional

AGENT_SIGNIN = "agent_signin"
WALLET_CONNECT = "wallet_connect"
SIGNUP = "signup"
NEWSLETTER_CONFIRM = "newsletter_confirm"
CONSOLE_SIGNIN = "console_signin"    # the e-mailed console sign-in link
CONSOLE_SESSION = "console_session"  # a console session: used_at = signed out
ALERT_CONFIRM = "alert_confirm"

MAX_TOKEN_LEN = 100
PURGE_AFTER = timedelta(days=1)
_UNSUB_SALT = "list-unsubscribe.v1"


# --- single-use tokens ------------------------------------------------------------------

def token_hash(token: str | None) -> str | None:
    """SHA-256 of a presented token, or None when it cannot be one of ours."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LEN:
        return None
    return sha256_hex(token)


def keyed_token(purpose: str, salt: str) -> str:
    """A token the server can derive again from ``salt`` (stored in the token's data)
    and SECRET_KEY, but a database reader cannot: 128 bits of HMAC-SHA256, hex. For
    flows where the client may come back without the token text."""
    key = current_app.config["SECRET_KEY"].encode()
    return hmac.new(key, f"{purpose}:{salt}".encode(), hashlib.sha256).hexdigest()[:32]


def issue(purpose: str, subject: str | None, ttl: timedelta | int, data: dict | None = None, *,
          token: str | None = None, now: datetime | None = None) -> str:
    """Store a new single-use token for ``purpose`` and return its text (256 random bits,
    URL-safe, unless the caller brings its own ``token`` format). It expires ``ttl``
    (seconds or timedelta) after ``now``."""
    token = token or secrets.token_urlsafe(32)
    digest = token_hash(token)
    if digest is None:
        raise ValueError("token: 1 to 100 characters")
    now = now or utcnow()
    ttl = ttl if isinstance(ttl, timedelta) else timedelta(seconds=int(ttl))
    db.session.add(SingleUseToken(purpose=purpose, token_hash=digest, subject=subject, data=data,
                                  created_at=now, expires_at=now + ttl))
    return token


def lookup(purpose: str, token: str | None) -> SingleUseToken | None:
    """The token's row whatever its state (used, expired), or None if never issued for
    ``purpose``. Read-only: use it to tell why ``consume`` refused, or to check things
    before consuming."""
    digest = token_hash(token)
    if digest is None:
        return None
    return db.session.execute(select(SingleUseToken).where(
        SingleUseToken.token_hash == digest, SingleUseToken.purpose == purpose)).scalar_one_or_none()


def used_subject(purpose: str, token: str | None) -> str | None:
    """The subject of ``token`` once it was used, else None: a page whose button was pressed
    twice (a double click, a reload) tells what the first press did rather than "invalid"."""
    row = lookup(purpose, token)
    return row.subject if row is not None and row.used_at is not None else None


def is_usable(row: SingleUseToken | None) -> bool:
    """Whether ``row`` could still be consumed (unused and unexpired) right now."""
    return row is not None and row.used_at is None and row.expires_at > utcnow()


def find_usable(purpose: str, subject: str) -> SingleUseToken | None:
    """The newest unused, unexpired token issued for ``subject`` (read-only)."""
    return db.session.execute(
        select(SingleUseToken)
        .where(SingleUseToken.purpose == purpose, SingleUseToken.subject == subject,
               SingleUseToken.used_at.is_(None), SingleUseToken.expires_at > utcnow())
        .order_by(SingleUseToken.created_at.desc(), SingleUseToken.id.desc()).limit(1)
    ).scalar_one_or_none()


def consume(purpose: str, token: str | None):
    """Use the token once. Returns its ``(id, subject, data)`` row, or None when it is
    unknown, of another purpose, already used or expired — including when a concurrent
    request consumed it first. Not committed here: the caller's transaction decides."""
    digest = token_hash(token)
    if digest is None:
        return None
    now = utcnow()
    return db.session.execute(
        update(SingleUseToken)
        .where(SingleUseToken.token_hash == digest, SingleUseToken.purpose == purpose,
               SingleUseToken.used_at.is_(None), SingleUseToken.expires_at > now)
        .values(used_at=now)
        .returning(SingleUseToken.id, SingleUseToken.subject, SingleUseToken.data)
        .execution_options(synchronize_session=False)
    ).first()


def revoke(purpose: str, subject: str) -> int:
    """Delete the unused tokens issued for ``subject`` (e.g. a newer link replaces them)."""
    return db.session.execute(
        delete(SingleUseToken)
        .where(SingleUseToken.purpose == purpose, SingleUseToken.subject == subject,
               SingleUseToken.used_at.is_(None))
        .execution_options(synchronize_session=False)).rowcount or 0


@transactional
def purge(older_than: timedelta = PURGE_AFTER) -> int:
    """Delete tokens that expired, or were used, more than ``older_than`` ago (kept that
    long so a late replay is still told "already used"); returns how many. Its own unit
    of work (the scheduled purge job)."""
    cutoff = utcnow() - older_than
    n = db.session.execute(
        delete(SingleUseToken)
        .where(or_(SingleUseToken.expires_at < cutoff, SingleUseToken.used_at < cutoff))
        .execution_options(synchronize_session=False)).rowcount or 0
    return n


# --- signed list-unsubscribe tokens -----------------------------------------------------

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
