"""API keys: minting (checksummed, hashed at rest), listing, scoped creation, spend
limits, expiry, rotation, revocation (docs/keys.md).

Entry points (each one unit of work): ``mint``, ``create_key``, ``update_key``,
``rotate_key``, ``revoke_key``; ``add_key`` is the helper for other entry points' units of
work (sign-up). At most ``MAX_ACTIVE_KEYS`` unrevoked, unexpired keys per account
(409 ``key_limit_reached``; a rotation is exempt: it retires the key it replaces).

Keys have a mode (``live`` / ``test``) and a key only sees and changes keys of its own mode,
as in Stripe. The ``admin`` scope can only be held by keys of admin accounts."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import func, or_, select, update

from app.errors import Conflict, Forbidden, InsufficientScope, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id, new_secret, sha256_hex
from app.models import Account, ApiKey, ChatCompletion, KeySpend, ModuleCall
from app.models.base import utcnow
from app.scopes import ADMIN_SCOPE, KNOWN_SCOPES
from app.services.money import spend
from app.services.platform.uow import transactional, unit_of_work

LIVE_PREFIX = "svc_live_"
TEST_PREFIX = "svc_test_"
DISPLAY_PREFIX_LEN = 13  # "svc_live_" + 4 characters of the random part
MAX_ACTIVE_KEYS = 100
MAX_LIFETIME = timedelta(days=365)
DEFAULT_OVERLAP_SECONDS, MAX_OVERLAP_SECONDS = 86_400, 604_800
MICROS_PER_CENT = 10_000
_UNSET = object()


class KeyAlreadyRotated(Conflict):
    code = "key_already_rotated"
    description = ("This key was already rotated and is retiring; rotate its successor (`rotated_to`) "
                   "instead. Rotating it again would mint one more key while retiring none.")


class KeyLimitReached(Conflict):
    code = "key_limit_reached"
    description = (f"The account already has {MAX_ACTIVE_KEYS} active (unrevoked, unexpired) keys; "
                   "revoke one first.")


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


def _granted(scopes: list[str] | None, creator_scopes: frozenset[str]) -> list[str]:
    """The scopes a new key gets: ``scopes`` (default: the creator's), never one the
    creator lacks (403 insufficient_scope)."""
    if scopes is None:
        return sorted(creator_scopes)
    requested = set(scopes)
    unknown = sorted(requested - set(KNOWN_SCOPES))
    if unknown:
        raise InvalidRequest(f"scopes: unknown scope(s) {', '.join(unknown)}.")
    missing = sorted(requested - set(creator_scopes))
    if missing:
        raise InsufficientScope(f"This credential cannot grant scope(s) it lacks: {', '.join(missing)}.")
    return sorted(requested)


def _limit(cents: int | None, period: str | None) -> tuple[int | None, str | None]:
    """(micros, period) of a spend limit; a limit without a period counts per ``month``."""
    if cents is None:
        if period is not None:
            raise InvalidRequest("spend_limit_period: needs spend_limit_cents.")
        return None, None
    if isinstance(cents, bool) or not isinstance(cents, int) or cents < 1:
        raise InvalidRequest("spend_limit_cents: must be an integer of at least 1.")
    if period is not None and period not in spend.PERIODS:
        raise InvalidRequest(f"spend_limit_period: must be one of {', '.join(spend.PERIODS)}.")
    return cents * MICROS_PER_CENT, period or "month"


def _expiry(expires_at: datetime | None, now: datetime) -> datetime | None:
    if expires_at is None:
        return None
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=timezone.utc)
    if expires_at <= now:
        raise InvalidRequest("expires_at: must be in the future.")
    if expires_at > now + MAX_LIFETIME:
        raise InvalidRequest("expires_at: must be at most one year ahead.")
    return expires_at


def _check_capacity(account_id: str, now: datetime) -> None:
    """409 ``key_limit_reached`` at ``MAX_ACTIVE_KEYS``; locks the account row first (on
    PostgreSQL), so concurrent creations are counted one after the other."""
    db.session.execute(select(Account.id).where(Account.id == account_id).with_for_update())
    active = db.session.execute(select(func.count()).select_from(ApiKey).where(
        ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None),
        or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now))).scalar_one()
    if active >= MAX_ACTIVE_KEYS:
        raise KeyLimitReached(f"This account has {active} active keys (the maximum is {MAX_ACTIVE_KEYS}); "
                              "revoke one before creating another.")


def create_key(account_id: str, name: str, scopes: list[str] | None, *,
               creator_scopes: frozenset[str], creator_mode: str,
               spend_limit_cents: int | None = None, spend_limit_period: str | None = None,
               expires_at: datetime | None = None) -> tuple[ApiKey, str]:
    """POST /api/keys: a key without ``scopes`` inherits the creator's scopes; no key can
    mint a scope it lacks (403 insufficient_scope). The new key has the creator's mode,
    the optional spend limit (period default ``month``) and expiry (future, ≤ 1 year)."""
    name = (name or "").strip()
    if not name:
        raise InvalidRequest("name: must not be empty.")
    granted = _granted(scopes, creator_scopes)
    limit, period = _limit(spend_limit_cents, spend_limit_period)
    now = utcnow()
    expiry = _expiry(expires_at, now)
    with unit_of_work():
        _check_capacity(account_id, now)
        row, secret = add_key(account_id, name, granted, mode=creator_mode)
        row.spend_limit_micros, row.spend_limit_period, row.expires_at = limit, period, expiry
    return with_spent([row])[0], secret


def with_spent(rows: list[ApiKey]) -> list[ApiKey]:
    """Set ``spent_micros`` (current period; None without a limit) on each key, for display."""
    now = utcnow()
    for row in rows:
        row.spent_micros = (spend.spent(row.id, row.spend_limit_period, now)
                            if row.spend_limit_period else None)
    return rows


def list_keys(account_id: str, mode: str) -> list[ApiKey]:
    """Active keys of the account in ``mode`` (the caller's; not revoked, not expired),
    newest first."""
    now = utcnow()
    return with_spent(list(db.session.execute(
        select(ApiKey).where(ApiKey.account_id == account_id, ApiKey.mode == mode, ApiKey.revoked_at.is_(None),
                             or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now))
        .order_by(ApiKey.created_at.desc(), ApiKey.id)
    ).scalars()))


def _own_key(account_id: str, key_id: str, mode: str, *, active: bool = False) -> ApiKey:
    """The account's key of ``mode``; another account's key, or one of the other mode, is 404."""
    row = db.session.get(ApiKey, key_id) if isinstance(key_id, str) and len(key_id) <= 32 else None
    if row is None or row.account_id != account_id or row.mode != mode:
        raise NotFound("No such key.")
    if active and (row.revoked_at is not None or (row.expires_at is not None and row.expires_at <= utcnow())):
        raise NotFound("No such key (it was revoked or has expired).")
    return row


def update_key(account_id: str, key_id: str, changes: dict, mode: str) -> ApiKey:
    """PATCH /api/keys/{id}: ``spend_limit_cents`` (null removes the limit) and
    ``spend_limit_period`` (absent or null: keep the current one, else ``month``). The
    new limit applies to the next charge; the period's count is kept."""
    with unit_of_work():
        row = _own_key(account_id, key_id, mode, active=True)
        cents = changes.get("spend_limit_cents", _UNSET)
        period = changes.get("spend_limit_period")
        if cents is _UNSET:
            if period is None:
                raise InvalidRequest("Nothing to change: send spend_limit_cents and/or spend_limit_period.")
            if row.spend_limit_micros is None:
                raise InvalidRequest("spend_limit_period: the key has no limit; send spend_limit_cents too.")
            cents = row.spend_limit_micros // MICROS_PER_CENT
        limit, new_period = _limit(cents, period or (row.spend_limit_period if cents is not None else None))
        row.spend_limit_micros, row.spend_limit_period = limit, new_period
    _drop_cached(row)
    return with_spent([row])[0]


def rotate_key(account_id: str, key_id: str, overlap_seconds: int | None, *,
               creator_scopes: frozenset[str], mode: str) -> tuple[ApiKey, str]:
    """POST /api/keys/{id}/rotate: a new key with the old one's name, scopes, mode and
    spend limit (carrying this period's count over) and expiry (a key that was to expire
    on a date still does: rotating does not extend it); the old key expires after
    ``overlap_seconds`` (default 86,400, 0–604,800)."""
    overlap = DEFAULT_OVERLAP_SECONDS if overlap_seconds is None else overlap_seconds
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= MAX_OVERLAP_SECONDS:
        raise InvalidRequest(f"overlap_seconds: must be an integer from 0 to {MAX_OVERLAP_SECONDS}.")
    now = utcnow()
    with unit_of_work():
        old = _own_key(account_id, key_id, mode, active=True)
        if old.rotated_to is not None:  # rotation is exempt from the key cap because it retires a key
            raise KeyAlreadyRotated(f"Key {old.id} was already rotated to {old.rotated_to}; rotate that key "
                                    "instead.")
        row, secret = add_key(account_id, old.name, _granted(list(old.scopes or ()), creator_scopes),
                              mode=old.mode)
        row.spend_limit_micros, row.spend_limit_period = old.spend_limit_micros, old.spend_limit_period
        row.expires_at = old.expires_at
        if old.spend_limit_period:
            start, _ = spend.period_bounds(old.spend_limit_period, now)
            used = spend.spent(old.id, old.spend_limit_period, now)
            if used:
                db.session.add(KeySpend(key_id=row.id, period_start=start, spent_micros=used))
        cutoff = now + timedelta(seconds=overlap)
        old.expires_at = min(old.expires_at, cutoff) if old.expires_at else cutoff
        old.rotated_to = row.id
        family = _predecessors(old.id) + [old]
        if old.spend_limit_period:
            # one limit for the rotation: the new key's counter holds the count, so the
            # charges still in flight give their room back there, and the old keys (still
            # working in their overlap) charge there too (``auth.key_of``)
            ids = [k.id for k in family]
            db.session.execute(update(ModuleCall).where(ModuleCall.spend_key_id.in_(ids),
                                                        ModuleCall.status == "pending")
                               .values(spend_key_id=row.id).execution_options(synchronize_session=False))
            db.session.execute(update(ChatCompletion).where(ChatCompletion.spend_key_id.in_(ids),
                                                            ChatCompletion.status == "held")
                               .values(spend_key_id=row.id).execution_options(synchronize_session=False))
    for key in family:  # every worker re-resolves them (and their counter) at once
        _drop_cached(key)
    return with_spent([row])[0], secret


def _predecessors(key_id: str) -> list[ApiKey]:
    """The keys rotated (directly or through others) into ``key_id``, still active."""
    out: list[ApiKey] = []
    frontier = [key_id]
    while frontier and len(out) < 256:
        rows = db.session.execute(select(ApiKey).where(ApiKey.rotated_to.in_(frontier),
                                                       ApiKey.revoked_at.is_(None))).scalars().all()
        out.extend(rows)
        frontier = [r.id for r in rows]
    return out


def _drop_cached(row: ApiKey) -> None:
    """Every worker drops its cached credential, so a new expiry or limit applies at once."""
    from app import auth

    auth.broadcast_revocation(row.key_hash)


def revoke_key(account_id: str, key_id: str, mode: str) -> ApiKey:
    """Revoke (idempotent). Another account's key, or a key of the other mode, is 404. Broadcasts the revocation so
    every worker and node drops its cached credential (app.auth)."""
    from app import auth

    with unit_of_work():
        row = _own_key(account_id, key_id, mode)
        if row.revoked_at is None:
            row.revoked_at = utcnow()
    auth.broadcast_revocation(row.key_hash)
    return row
