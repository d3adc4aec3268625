"""Per-key spend limits and members' monthly budgets: the Python side of the rule that no
charge may push a key past its limit (issue 16 item 3) nor an organisation member's keys
together past the member's ``monthly_budget_micros`` (issue 37 item 4). The rule itself —
the periods and the counters of ``key_spend`` and ``member_spend`` — is written once, in
the money engine's SQL (``app/services/money/sql/``:
``gw_period_bounds``, ``gw_spend_reserve``, ``gw_spend_release``); these helpers only call
it, join the caller's unit of work and never commit.

A key with ``spend_limit_micros`` set counts what it spends per ``spend_limit_period``:
``day`` (UTC midnight), ``week`` (ISO week, Monday 00:00 UTC), ``month`` (the 1st, 00:00
UTC) or ``total`` (one period since 1970-01-01). The counter row is keyed by
``(key_id, period_start)``. A reservation remembers the period it was taken in
(``reserved_from``, stored on the call or completion row), and its release goes back to
that period even if the key's period changed since. An organisation key's charge is also
counted in its member's UTC month (``member_spend``; the row stores ``budget_member_id``),
given back to the month of the row's ``created_at``.

* The reserve of a charge happens only inside the engine's statements (``gw_open_calls``,
  ``gw_chat_holds`` call ``gw_spend_reserve``); money a key moves out of the balance in
  another way (an owner funding its agent) is counted by ``reserve`` in that unit of work.
* ``refusal(key_id, micros, now)`` / ``budget_refusal(key_id, micros, now)``: the 402 for a
  charge the engine refused in one of its statements (``gw_open_calls``,
  ``gw_chat_holds``) for the key's limit / the member's budget; reads only.
* ``release(key_id, micros, reserved_from, org=, member=, at=)``: gives ``micros`` back to
  the counters the reservation was counted in (never below zero).
* ``member_spent(org_id, member_ids, now)``: what members spent in the month of ``now``.
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import select, text

from app.errors import PaymentRequired
from app.extensions import db
from app.models import ApiKey, KeySpend, MemberSpend, OrgMember

PERIODS = ("day", "week", "month", "total")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SPEND = KeySpend.__table__
_KEYS = ApiKey.__table__
_BOUNDS = text("SELECT period_from, period_to FROM gw_period_bounds(:period, :at)")
_RESERVE = text("SELECT outcome FROM gw_spend_reserve(:key, :micros, :at)")
_RELEASE = text("SELECT gw_spend_release(:key, :micros, :reserved_from, :org, :member, :at)")
_MEMBER_SPEND = MemberSpend.__table__
# The count of ``src``'s period containing ``at`` into ``dst``'s period containing ``at``
# (the greater of the two stays): key rotation (the new key takes its rotation's count) and
# a key's period change (the new period starts from the count of the period it leaves).
_CARRY = text("""
    INSERT INTO key_spend AS s (key_id, period_start, spent_micros)
    SELECT :dst, (gw_period_bounds(:dst_period, :at)).period_from, f.spent_micros
      FROM key_spend f
     WHERE f.key_id = :src AND f.period_start = (gw_period_bounds(:src_period, :at)).period_from
       AND f.spent_micros > 0
       FOR UPDATE OF f
    ON CONFLICT (key_id, period_start) DO UPDATE
       SET spent_micros = greatest(s.spent_micros, EXCLUDED.spent_micros)""")


class KeySpendLimitReached(PaymentRequired):
    code = "key_spend_limit_reached"
    description = ("The API key's spend limit for its period (day, week, month or total, UTC) "
                   "cannot cover this charge; nothing was charged. The body adds `limit_cents`, "
                   "`spent_cents`, `period` and `resets_at` (null for `total`).")


def period_bounds(period: str, now: datetime) -> tuple[datetime, datetime | None]:
    """[start, end) of the UTC limit period containing ``now`` (end None for ``total``),
    as the engine computes it (``gw_period_bounds``)."""
    if period not in PERIODS:
        raise ValueError(f"unknown spend limit period {period!r}")
    start, end = db.session.execute(_BOUNDS, {"period": period, "at": now}).one()
    return start, end


def _limit_of(key_id: str) -> tuple[int | None, str | None]:
    row = db.session.execute(select(_KEYS.c.spend_limit_micros, _KEYS.c.spend_limit_period)
                             .where(_KEYS.c.id == key_id)).first()
    return (row[0], row[1]) if row is not None else (None, None)


def spent(key_id: str, period: str, now: datetime) -> int:
    """Micros the key spent in the period containing ``now``."""
    start, _ = period_bounds(period, now)
    value = db.session.execute(select(_SPEND.c.spent_micros).where(
        _SPEND.c.key_id == key_id, _SPEND.c.period_start == start)).scalar()
    return int(value or 0)


def carry(src_key: str, src_period: str, dst_key: str, dst_period: str, now: datetime) -> None:
    """Carry what ``src_key`` spent in its ``src_period`` containing ``now`` into
    ``dst_key``'s ``dst_period`` containing ``now`` (never lowering that count): the
    rotation's new key takes the count of its rotation, and a key whose period changes
    keeps, in the new period, what it spent in the one it leaves (so a switch frees no
    room: a key at its 3 cents a day that moved to ``week`` had a fresh 3 cents). The
    source row is locked, so a charge counted on it before is carried. Does not commit."""
    db.session.execute(_CARRY, {"src": src_key, "src_period": src_period, "dst": dst_key,
                                "dst_period": dst_period, "at": now})


def reserve(key_id: str, micros: int, now: datetime) -> None:
    """Count ``micros`` that ``key_id`` moves out of the balance other than by a charge (an
    owner funding its agent) against the key's limit and its member's monthly budget, as the
    engine counts a charge (``gw_spend_reserve``), in the caller's unit of work; past them
    402 as for a refused charge, nothing counted. Never given back: the money left the
    balance (until 2026-11-29 a key limited to 5 cents a day funded its agent with 300)."""
    outcome = db.session.execute(_RESERVE, {"key": key_id, "micros": int(micros), "at": now}).scalar()
    if outcome == "refused":
        raise refusal(key_id, micros, now)
    if outcome == "budget_refused":
        raise budget_refusal(key_id, micros, now)


def refusal(key_id: str, micros: int, now: datetime) -> KeySpendLimitReached:
    """The 402 for a charge that the key's limit refused (reads only)."""
    from app.services.money.ledger import micros_to_cents

    limit, period = _limit_of(key_id)
    limit, period = int(limit or 0), period or "total"
    _, end = period_bounds(period, now)
    used = spent(key_id, period, now)
    resets = end.isoformat().replace("+00:00", "Z") if end else None
    when = f"it resets at {resets}" if resets else "it never resets (period total)"
    return KeySpendLimitReached(
        f"This key's spend limit is {micros_to_cents(limit)} cents per {period}; it has spent "
        f"{micros_to_cents(used)} cents and this charge of {micros / 10_000:g} cents does not fit; "
        f"{when}. Nothing was charged.",
        extra={"limit_cents": micros_to_cents(limit), "spent_cents": micros_to_cents(used),
               "period": period, "resets_at": resets})


class MemberBudgetExceeded(PaymentRequired):
    code = "member_budget_exceeded"
    description = ("The organisation member's monthly budget (`monthly_budget_cents`, over all their "
                   "organisation keys, UTC month) cannot cover this charge; nothing was charged. The body "
                   "adds `budget_cents`, `spent_cents`, `member_id`, `org_id` and `resets_at`.")


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def member_spent(org_id: str, member_ids: list[str], now: datetime) -> dict[str, int]:
    """Micros each of ``member_ids`` spent with their organisation keys of ``org_id`` in the
    UTC month containing ``now`` (absent: 0)."""
    start, _ = period_bounds("month", now)
    rows = db.session.execute(select(_MEMBER_SPEND.c.member_id, _MEMBER_SPEND.c.spent_micros).where(
        _MEMBER_SPEND.c.org_id == org_id, _MEMBER_SPEND.c.member_id.in_(member_ids),
        _MEMBER_SPEND.c.period_start == start)).all()
    return {member: int(value) for member, value in rows}


def key_member_budget(key_id: str) -> tuple[str | None, str | None, int | None]:
    """(organisation, member, that member's monthly budget in micros) of an organisation key,
    as ``gw_spend_reserve`` reads them; (account, None, None) for a personal key, all None for
    no such key. Reads only."""
    row = db.session.execute(select(ApiKey.account_id, ApiKey.member_account_id, OrgMember.monthly_budget_micros)
                             .outerjoin(OrgMember, (OrgMember.org_id == ApiKey.account_id)
                                        & (OrgMember.account_id == ApiKey.member_account_id))
                             .where(ApiKey.id == key_id)).first()
    return tuple(row) if row is not None else (None, None, None)


def budget_refusal(key_id: str, micros: int, now: datetime) -> MemberBudgetExceeded:
    """The 402 for a charge that the key's member's monthly budget refused (reads only)."""
    from app.services.money.ledger import micros_to_cents

    org_id, member_id, budget = key_member_budget(key_id)
    used = member_spent(org_id, [member_id], now).get(member_id, 0) if member_id else 0
    _, end = period_bounds("month", now)
    budget_cents = micros_to_cents(int(budget or 0))
    return MemberBudgetExceeded(
        f"Member {member_id}'s monthly budget in organisation {org_id} is {budget_cents} cents; their "
        f"organisation keys have spent {micros_to_cents(used)} cents this month and this charge of "
        f"{micros / 10_000:g} cents does not fit; it resets at {_iso(end)}. Nothing was charged.",
        extra={"budget_cents": budget_cents, "spent_cents": micros_to_cents(used), "member_id": member_id,
               "org_id": org_id, "resets_at": _iso(end)})


def release(key_id: str | None, micros: int, reserved_from: datetime | None, *, org: str | None = None,
            member: str | None = None, at: datetime | None = None) -> None:
    """Give ``micros`` back to what the reservation was counted in (never below zero): the
    key's counter of the period it was taken in (``reserved_from``, stored on the row; None:
    not counted) and the counter of ``member`` in ``org`` for the month of ``at`` (the
    row's ``created_at``; ``member`` None: not counted). Does not commit."""
    if micros <= 0 or ((not key_id or reserved_from is None) and not member):
        return
    db.session.execute(_RELEASE, {"key": key_id if reserved_from is not None else None, "micros": int(micros),
                                  "reserved_from": reserved_from, "org": org if member else None,
                                  "member": member, "at": at})
