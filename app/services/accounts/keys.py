"""API keys: minting (checksummed, hashed at rest), listing, scoped creation, revocation.

Keys have a mode (``live`` / ``test``) and a key only sees and revokes keys of its own mode,
as in Stripe. The ``admin`` scope can only be held by keys of admin accounts.

Entry points (each one unit of work): ``mint``, ``create_key``, ``revoke_key``;
``add_key`` is the helper for other entry points' units of work (sign-up)."""
from __future__ import annotations

from sqlalchemy import select

from app.errors import Forbidden, InsufficientScope, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id, new_secret, sha256_hex
from app.models import Account, ApiKey
from app.models.base import utcnow
from app.scopes import ADMIN_SCOPE, KNOWN_SCOPES
from app.services.platform.uow import transactional, unit_of_work

LIVE_PREFIX = "svc_live_"
TEST_PREFIX = "svc_test_"
DISPLAY_PREFIX_LEN = 13  # "svc_live_" + 4 characters of the random part


@transactional
def mint(account_id: str, name: str, scopes: list[str] | tuple[str, ...], *,
         mode: str = "live") -> tuple[ApiKey, str]:
    """Create a key (``add_key``) in its own unit of work; returns (row, full secret)."""
    return add_key(account_id, name, scopes, mode=mode)


def add_key(account_id: str, name: str, scopes: list[str] | tuple[str, ...], *,
            mode: str = "live") -> tuple[ApiKey, str]:
    """Add a key row in the caller's unit of work; returns (row, full secret). The secret
    is never stored. Only an admin account's key can carry the ``admin`` scope (403)."""
    if ADMIN_SCOPE in scopes and not db.session.execute(
            select(Account.is_admin).where(Account.id == account_id)).scalar():
        raise Forbidden("Only keys of admin accounts can carry scope admin.")
    secret = new_secret(TEST_PREFIX if mode == "test" else LIVE_PREFIX)
    row = ApiKey(id=new_id("key"), account_id=account_id, name=name, mode=mode,
                 prefix=secret[:DISPLAY_PREFIX_LEN], key_hash=sha256_hex(secret),
                 scopes=sorted(set(scopes)), created_at=utcnow())
    db.session.add(row)
    return row, secret


def create_key(account_id: str, name: str, scopes: list[str] | None, *,
               creator_scopes: frozenset[str], creator_mode: str) -> tuple[ApiKey, str]:
    """POST /api/keys: a key without ``scopes`` inherits the creator's scopes; no key can
    mint a scope it lacks (403 insufficient_scope). The new key has the creator's mode."""
    name = (name or "").strip()
    if not name:
        raise InvalidRequest("name: must not be empty.")
    if scopes is None:
        requested = set(creator_scopes)
    else:
        requested = set(scopes)
        unknown = sorted(requested - set(KNOWN_SCOPES))
        if unknown:
            raise InvalidRequest(f"scopes: unknown scope(s) {', '.join(unknown)}.")
        missing = sorted(requested - set(creator_scopes))
        if missing:
            raise InsufficientScope(
                f"This credential cannot grant scope(s) it lacks: {', '.join(missing)}."
            )
    return mint(account_id, name, sorted(requested), mode=creator_mode)  # its unit of work


def list_keys(account_id: str, mode: str) -> list[ApiKey]:
    """Active keys of the account in ``mode`` (the caller's), newest first."""
    return list(db.session.execute(
        select(ApiKey).where(ApiKey.account_id == account_id, ApiKey.mode == mode,
                             ApiKey.revoked_at.is_(None))
        .order_by(ApiKey.created_at.desc(), ApiKey.id)
    ).scalars())


def revoke_key(account_id: str, key_id: str, mode: str) -> ApiKey:
    """Revoke (idempotent). Another account's key, or a key of the other mode, is 404.
    Broadcasts the revocation so
    every worker and node drops its cached credential (app.auth)."""
    from app import auth

    with unit_of_work():
        row = db.session.get(ApiKey, key_id)
        if row is None or row.account_id != account_id or row.mode != mode:
            raise NotFound("No such key.")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
    auth.broadcast_revocation(row.key_hash)
    return row
