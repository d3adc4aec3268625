"""API keys: minting (checksummed, hashed at rest), listing, scoped creation, spend
limits, expiry, rotation, revocation (docs/keys.md).

Entry points (each one unit of work): ``mint``, ``create_key``, ``update_key``,
``rotate_key``, ``revoke_key``; ``add_key`` is the helper for other entry points' units of
work (sign-up). At most ``MAX_ACTIVE_KEYS`` unrevoked, unexpired keys per account
(409 ``key_limit_reached``; a rotation counts too: its old key stays active through the
overlap).

Keys have a mode (``live`` / ``test``) and a key only sees and changes keys of its own mode,
as in Stripe. The ``admin`` scope can only be held by keys of admin accounts."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from sqlalchemy import func, or_, select, update

from app.errors import Conflict, Forbidden, InsufficientScope, InvalidRequest, NotFound, Unprocessable
from app.extensions import db
from app.ids import new_id, new_secret, sha256_hex
from app.models import Account, ApiKey, ChatCompletion, ModuleCall
from app.models.base import utcnow
from app.scopes import ADMIN_SCOPE, KNOWN_SCOPES
from app.services.accounts import key_controls
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


class KeyRetiring(Conflict):
    code = "key_retiring"
    description = ("This key was rotated and is retiring: its spend limit and its rpm/tpm limits are its "
                   "successor's (`rotated_to`), one limit for both keys; change them on the successor.")


class BeyondCreator(Forbidden):
    code = "beyond_own_limits"
    description = ("A key may create, rotate or change only keys whose scopes and limits are within its "
                   "own: a spend limit no larger over a period no shorter, an expiry no later; a key with a "
                   "spend limit may not set auto top-up or the payout destination. A console session (the "
                   "account owner) has no such bound.")


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
    if expires_at <= now:  # the clock: a rule the document states in words only (422)
        raise Unprocessable("expires_at: must be in the future.", param="expires_at")
    if expires_at > now + MAX_LIFETIME:
        raise Unprocessable("expires_at: must be at most one year ahead.", param="expires_at")
    return expires_at


PERIOD_ORDER = ("day", "week", "month", "total")  # shorter to longer


def _creator_key(creator_key_id: str | None) -> SimpleNamespace | None:
    """The bounds of the key acting, read once (None: the account owner, a console
    session: no bound): a copy, so a key changing itself is judged by what it was allowed
    before the change. A retiring key (rotated, in its overlap) is bound by the spend limit
    its charges count under: its rotation's newest key's (until 2026-11-29 by its own row's,
    which may have none: it minted unlimited keys next to the rotation's budget). A credential that is not a key (an agent session) is refused rather
    than left unbounded."""
    if creator_key_id is None:
        return None
    row = db.session.get(ApiKey, creator_key_id)
    if row is None:
        raise BeyondCreator("Only API keys and the console can manage keys.")
    bounds = SimpleNamespace(**{f: getattr(row, f) for f in ("scopes", "expires_at")}, **_controls(row))
    bounds.spend_limit_micros, bounds.spend_limit_period = _spend_limit(row)
    return bounds


def _controls(row: ApiKey) -> dict:
    """The controls ``row`` is held to: its own allow-lists and the rpm/tpm of the counter it
    counts on — its own, or for a retiring key its rotation's newest key's (as its spend limit)."""
    under = _rotation_head(row.id) if row.rotated_to is not None else row
    return {f: getattr(under if f in key_controls.RATES else row, f) for f in key_controls.FIELDS}


def require_unlimited(key_id: str | None, setting: str) -> None:
    """403 ``beyond_own_limits`` when the acting key (``key_id``) has a spend limit (its own,
    or a retiring key's rotation's) or is an organisation key whose member has a monthly
    budget (its charges count under that too): ``setting`` moves money with no one present, past any
    key's limit (auto top-up charges the saved card; the payout destination decides where
    earnings go), so it needs a key without one. None (the console's owner) and a credential
    that is not a key (an agent session: its own money, no key limit) pass
    (docs/decisions.md "Money settings need a key without a spend limit")."""
    row = db.session.get(ApiKey, key_id) if key_id is not None else None
    if row is None:
        return
    micros, period = _spend_limit(row)
    if micros is not None:
        raise BeyondCreator(f"{setting} needs a key without a spend limit (or the console): this key may spend "
                            f"{micros // MICROS_PER_CENT} cents per {period}.")
    _, _, budget = spend.key_member_budget(row.id)
    if budget is not None:
        raise BeyondCreator(f"{setting} needs a key without a spend limit (or the console): this organisation "
                            f"key's member has a monthly budget of {budget // MICROS_PER_CENT} cents.")


def _spend_limit(row: ApiKey) -> tuple[int | None, str | None]:
    """(micros, period) of the spend limit ``row``'s charges count under: its own, or for a
    retiring key (rotated, in its overlap) its rotation's newest key's (``auth.key_of``)."""
    if row.rotated_to is not None:
        row = _rotation_head(row.id)
    return row.spend_limit_micros, row.spend_limit_period


def _defaults_from(creator: ApiKey | None, limit: int | None, period: str | None,
                   expiry: datetime | None) -> tuple[int | None, str | None, datetime | None]:
    """A key made by a bounded key inherits the bounds it was not given (like its scopes)."""
    if creator is None:
        return limit, period, expiry
    if limit is None and creator.spend_limit_micros is not None:
        limit, period = creator.spend_limit_micros, creator.spend_limit_period
    return limit, period, expiry if expiry is not None else creator.expires_at


def _check_within(creator: ApiKey | None, limit: int | None, period: str | None,
                  expiry: datetime | None, controls: dict | None = None) -> None:
    """403 ``beyond_own_limits`` unless a key with this limit (micros per ``period``),
    ``expiry`` and ``controls`` (every control field: the key's result; None: not checked)
    could spend no more, live no longer and reach no further than ``creator``. A limit of L per a period
    at least as long as the creator's, with L at most the creator's, allows at most the
    creator's limit in any of the creator's periods; allow-lists must be subsets and
    per-minute limits no larger (``key_controls.beyond``)."""
    if creator is None:
        return
    why = None if controls is None else key_controls.beyond(creator, controls)
    if why is not None:
        raise BeyondCreator(why)
    if creator.spend_limit_micros is not None:
        if limit is None:
            raise BeyondCreator("This key has a spend limit: it cannot create or leave a key without one.")
        if limit > creator.spend_limit_micros or \
                PERIOD_ORDER.index(period) < PERIOD_ORDER.index(creator.spend_limit_period):
            raise BeyondCreator(
                f"spend_limit_cents: at most {creator.spend_limit_micros // MICROS_PER_CENT} per "
                f"{creator.spend_limit_period} or a longer period (this key's own limit).")
    if creator.expires_at is not None and (expiry is None or expiry > creator.expires_at):
        raise BeyondCreator(f"expires_at: at most this key's own expiry ({creator.expires_at.isoformat()}).")


def _check_scopes_within(creator: SimpleNamespace | None, scopes) -> None:
    """403 ``beyond_own_limits`` when a key (``creator``; None: the console's owner) would
    change or revoke a key holding a scope it lacks (as creating or rotating one is 403)."""
    if creator is None:
        return
    missing = sorted(set(scopes or ()) - set(creator.scopes or ()))
    if missing:
        raise BeyondCreator(f"This key cannot change or revoke a key with scope(s) it lacks: {', '.join(missing)}.")


def _check_capacity(account_id: str, now: datetime, *, retiring_now: int = 0) -> None:
    """409 ``key_limit_reached`` when one more key would pass ``MAX_ACTIVE_KEYS`` active
    keys (``retiring_now``: keys of the count that stop being active in this same unit of
    work, e.g. a rotation without overlap); locks the account row first (on PostgreSQL),
    so concurrent creations and rotations are counted one after the other."""
    db.session.execute(select(Account.id).where(Account.id == account_id).with_for_update())
    active = db.session.execute(select(func.count()).select_from(ApiKey).where(
        ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None),
        or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > now))).scalar_one()
    if active - retiring_now >= MAX_ACTIVE_KEYS:
        raise KeyLimitReached(f"This account has {active} active keys (the maximum is {MAX_ACTIVE_KEYS}); "
                              "revoke one before creating another (or rotate with overlap_seconds 0: the "
                              "old key then stops at once).")


def create_key(account_id: str, name: str, scopes: list[str] | None, *,
               creator_scopes: frozenset[str], creator_mode: str,
               spend_limit_cents: int | None = None, spend_limit_period: str | None = None,
               expires_at: datetime | None = None, member_account_id: str | None = None,
               actor=None, controls: dict | None = None,
               creator_key_id: str | None = None) -> tuple[ApiKey, str]:
    """POST /api/keys: a key without ``scopes`` inherits the creator's scopes; no key can
    mint a scope it lacks (403 insufficient_scope). The new key has the creator's mode,
    the optional spend limit (period default ``month``) and expiry (future, ≤ 1 year), and
    the optional controls (``key_controls``: allow-lists, rpm/tpm limits).
    Made by a key (``creator_key_id``; None: the console's owner), it inherits that key's
    limit and expiry when given none and may not exceed them (403 ``beyond_own_limits``).
    With ``member_account_id`` it is an organisation key (``account_id`` is the
    organisation, which pays; the member owns it), recorded in the organisation's audit log
    as done by ``actor`` (``app.services.orgs.audit.Actor``)."""
    name = (name or "").strip()
    if not name:
        raise InvalidRequest("name: must not be empty.")
    granted = _granted(scopes, creator_scopes)
    limit, period = _limit(spend_limit_cents, spend_limit_period)
    now = utcnow()
    expiry = _expiry(expires_at, now)
    ctl = key_controls.validated(controls or {})
    with unit_of_work():
        creator = _creator_key(creator_key_id)
        limit, period, expiry = _defaults_from(creator, limit, period, expiry)
        ctl = key_controls.inherited(creator, ctl)
        _check_within(creator, limit, period, expiry, ctl)
        _check_capacity(account_id, now)
        row, secret = add_key(account_id, name, granted, mode=creator_mode)
        row.spend_limit_micros, row.spend_limit_period, row.expires_at = limit, period, expiry
        for name, value in ctl.items():
            setattr(row, name, value)
        _key_audit(row, member_account_id, actor, "key.create")
    return with_spent([row])[0], secret


def _key_audit(row: ApiKey, member_account_id: str | None, actor, action: str) -> None:
    """An organisation key's owner is set, and the new key is written to its account's
    audit log (the organisation's, or the person's own), in the caller's unit of work."""
    from app.services.orgs import audit

    row.member_account_id = member_account_id
    audit.record(row.account_id, actor or audit.current() or audit.Actor(member_account_id or row.account_id),
                 action, row.id, after={"member_id": member_account_id, "name": row.name, "mode": row.mode,
                                        "scopes": list(row.scopes or ()),
                                        "spend_limit_micros": row.spend_limit_micros})


def with_spent(rows: list[ApiKey]) -> list[ApiKey]:
    """Set, for display, the spend limit each key's charges count under (``limit_shown``:
    (micros, period); a retiring key's is its rotation's newest key's) and what was counted
    under it this period (``spent_micros``; None without a limit)."""
    now = utcnow()
    for row in rows:
        under = _rotation_head(row.id) if row.rotated_to is not None else row
        row.limit_shown = (under.spend_limit_micros, under.spend_limit_period)
        row.rates_shown = (under.rpm_limit, under.tpm_limit)
        row.spent_micros = (spend.spent(under.id, under.spend_limit_period, now)
                            if under.spend_limit_period else None)
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


def _settings(row: ApiKey) -> dict:
    """A key's changeable settings, for the audit log's before/after."""
    return {"spend_limit_micros": row.spend_limit_micros, "spend_limit_period": row.spend_limit_period,
            **{name: getattr(row, name) for name in key_controls.FIELDS}}


def update_key(account_id: str, key_id: str, changes: dict, mode: str, *,
               creator_key_id: str | None = None) -> ApiKey:
    """PATCH /api/keys/{id}: ``spend_limit_cents`` (null removes the limit) and
    ``spend_limit_period`` (absent or null: keep the current one, else ``month``). The
    new limit applies to the next charge; the period's count is kept. The controls
    (``allowed_models``, ``allowed_modules``, ``rpm_limit``, ``tpm_limit``; null removes
    one) apply to the next request on every worker. A retiring key (rotated, in its
    overlap) takes no spend-limit, rpm or tpm change (409 ``key_retiring``): its charges and
    requests count under its rotation's newest key's limits (its allow-lists do change). Changed by a key (``creator_key_id``), the key must
    hold no scope the acting key lacks and the result must be within that key's own limit
    and controls (403 ``beyond_own_limits``): a limited key cannot lift its own limit or
    another's."""
    ctl = key_controls.validated(changes)
    with unit_of_work():
        creator = _creator_key(creator_key_id)  # before any change: a key may edit itself
        row = _own_key(account_id, key_id, mode, active=True)
        _check_scopes_within(creator, row.scopes)
        before = _settings(row)
        cents = changes.get("spend_limit_cents", _UNSET)
        period = changes.get("spend_limit_period")
        if cents is _UNSET and period is not None:  # a new period for the key's limit
            if row.spend_limit_micros is None:
                raise Conflict("spend_limit_period: the key has no limit; send spend_limit_cents too.")
            cents = row.spend_limit_micros // MICROS_PER_CENT
        elif cents is _UNSET and not ctl:
            raise InvalidRequest("Nothing to change: send spend_limit_cents, spend_limit_period or a control "
                                 "(allowed_models, allowed_modules, rpm_limit, tpm_limit).")
        limit, new_period = _spend_limit(row)
        if row.rotated_to is not None and (cents is not _UNSET or set(ctl) & set(key_controls.RATES)):
            # the rotation's newest key's limits apply (auth.key_of, auth's controls)
            raise KeyRetiring(f"Key {row.id} was rotated and is retiring: its charges and requests count under "
                              f"{_rotation_head(row.id).id}'s spend, rpm and tpm limits; change them there.")
        if cents is not _UNSET:
            limit, new_period = _limit(cents, period or (row.spend_limit_period if cents is not None else None))
        for name, value in ctl.items():
            setattr(row, name, value)
        # the result must be within the acting key's bounds (its own included): the limit, and
        # the controls when they change
        _check_within(creator, limit, new_period, row.expires_at, _controls(row) if ctl else None)
        if cents is not _UNSET:
            if row.spend_limit_period and new_period != row.spend_limit_period:
                # the new period starts from what was spent in the one it leaves
                spend.carry(row.id, row.spend_limit_period, row.id, new_period, utcnow())
            row.spend_limit_micros, row.spend_limit_period = limit, new_period
        from app.services.orgs import audit

        audit.record(row.account_id, None, "key.update", row.id, before=before, after=_settings(row))
        retiring = _predecessors(row.id)  # held to this key's limits: re-resolved with it
    for key in (row, *retiring):
        _drop_cached(key)
    return with_spent([row])[0]


def rotate_key(account_id: str, key_id: str, overlap_seconds: int | None, *,
               creator_scopes: frozenset[str], mode: str, actor=None,
               creator_key_id: str | None = None) -> tuple[ApiKey, str]:
    """POST /api/keys/{id}/rotate: a new key with the old one's name, scopes, mode and
    spend limit (carrying this period's count over) and expiry (a key that was to expire
    on a date still does: rotating does not extend it); the old key expires after
    ``overlap_seconds`` (default 86,400, 0–604,800). A key may rotate only keys within
    its own scopes and limits (``creator_key_id``: 403 otherwise)."""
    overlap = DEFAULT_OVERLAP_SECONDS if overlap_seconds is None else overlap_seconds
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= MAX_OVERLAP_SECONDS:
        raise InvalidRequest(f"overlap_seconds: must be an integer from 0 to {MAX_OVERLAP_SECONDS}.")
    now = utcnow()
    with unit_of_work():
        old = _own_key(account_id, key_id, mode, active=True)
        # the newest key of its rotation, whose counter holds the rotation's count (``auth.key_of``)
        head = _rotation_head(old.id)
        if head.id != old.id and _is_active(head, now):  # a repeat would mint one more key, retiring none
            raise KeyAlreadyRotated(f"Key {old.id} was already rotated to {head.id}; rotate that key instead.")
        # else a retiring key whose successor was revoked (or expired) rotates again: it is the
        # only active key of its rotation, and the new key carries the count from ``head``
        # the old key stays active through its overlap: the new one must fit under the cap
        _check_capacity(account_id, now, retiring_now=1 if overlap == 0 else 0)
        creator = _creator_key(creator_key_id)
        # the new key keeps the rotation's expiry, within the rotating key's own bound: the old
        # key's own, or for a retiring key (its expires_at is now its overlap's end) the one
        # its successor was given (never later than the first key's)
        bound = creator.expires_at if creator is not None else None
        expiry = _rotation_expiry(old, head, now)
        expiry = min((e for e in (expiry, bound) if e is not None), default=None)
        # the rotation's spend limit: the one its charges count under (``auth.key_of``), i.e. the
        # newest key's — for a retiring key whose successor was revoked, the successor's
        limit, period = _spend_limit(old)
        controls = _controls(old)
        _check_within(creator, limit, period, expiry, controls)
        row, secret = add_key(account_id, old.name, _granted(list(old.scopes or ()), creator_scopes),
                              mode=old.mode)
        row.spend_limit_micros, row.spend_limit_period = limit, period
        row.expires_at = expiry
        for name, value in controls.items():  # the successor keeps the controls (and counts for both)
            setattr(row, name, value)
        _key_audit(row, old.member_account_id, actor, "key.rotate")  # an organisation key stays its member's
        if period:
            spend.carry(head.id, period, row.id, period, now)
        cutoff = now + timedelta(seconds=overlap)
        old.expires_at = min(old.expires_at, cutoff) if old.expires_at else cutoff
        old.rotated_to = row.id
        family = _predecessors(old.id) + [old]
        if period:
            # one limit for the rotation: the new key's counter holds the count, so the
            # charges still in flight give their room back there, and the old keys (still
            # working in their overlap) charge there too (``auth.key_of``)
            ids = [k.id for k in family] + ([head.id] if head.id != old.id else [])
            db.session.execute(update(ModuleCall).where(ModuleCall.spend_key_id.in_(ids),
                                                        ModuleCall.status == "pending")
                               .values(spend_key_id=row.id).execution_options(synchronize_session=False))
            db.session.execute(update(ChatCompletion).where(ChatCompletion.spend_key_id.in_(ids),
                                                            ChatCompletion.status == "held")
                               .values(spend_key_id=row.id).execution_options(synchronize_session=False))
    for key in family:  # every worker re-resolves them (and their counter) at once
        _drop_cached(key)
    return with_spent([row])[0], secret


def _is_active(row: ApiKey, now: datetime) -> bool:
    return row.revoked_at is None and (row.expires_at is None or row.expires_at > now)


def _rotation_expiry(old: ApiKey, head: ApiKey, now: datetime) -> datetime | None:
    """The expiry a rotation of ``old`` keeps: its own, or when ``old`` is retiring (its
    ``expires_at`` was cut to its overlap's end) the one its successor ``head`` was given,
    which is the rotation's expiry, never later than ``old``'s first one — unless that has
    passed (then the old key's)."""
    if head.id == old.id or (head.expires_at is not None and head.expires_at <= now):
        return old.expires_at
    return head.expires_at


def _rotation_head(key_id: str) -> ApiKey:
    """The newest key of ``key_id``'s rotation (following ``rotated_to``), active or not."""
    row = db.session.get(ApiKey, key_id)
    for _ in range(32):  # a chain is as long as the rotations within one overlap
        if row.rotated_to is None:
            break
        row = db.session.get(ApiKey, row.rotated_to)
    return row


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


def revoke_key(account_id: str, key_id: str, mode: str, actor=None, *,
               creator_key_id: str | None = None) -> ApiKey:
    """Revoke (idempotent). Another account's key, or a key of the other mode, is 404. Broadcasts the revocation so
    every worker and node drops its cached credential (app.auth). Revoking an
    organisation key is written to the organisation's audit log (by ``actor``). Revoked by
    a key (``creator_key_id``), the target must hold no scope the acting key lacks (403
    ``beyond_own_limits``, as PATCH and rotate): a narrow key cannot lock its owner out."""
    from app import auth

    with unit_of_work():
        creator = _creator_key(creator_key_id)
        row = _own_key(account_id, key_id, mode)
        _check_scopes_within(creator, row.scopes)
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            from app.services.orgs import audit

            audit.record(row.account_id, actor or audit.current() or
                         audit.Actor(row.member_account_id or row.account_id), "key.revoke", row.id,
                         before={"member_id": row.member_account_id})
    auth.broadcast_revocation(row.key_hash)
    return row
