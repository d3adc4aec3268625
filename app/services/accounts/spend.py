"""Per-key spend limits: the counters of ``key_spend`` and the rule that no charge may push
a key past its limit (issue 16 item 3).

A key with ``spend_limit_micros`` set counts what it spends per ``spend_limit_period``:
``day`` (UTC midnight), ``week`` (ISO week, Monday 00:00 UTC), ``month`` (the 1st, 00:00
UTC) or ``total`` (one period since 1970-01-01). The counter row is keyed by
``(key_id, period_start)``.

* ``reserve(key_id, micros, now)``: ONE conditional statement
  (``INSERT … ON CONFLICT DO UPDATE … WHERE spent + micros <= limit RETURNING``) adds the
  charge to the period's counter or changes nothing; concurrent reserves serialize on the
  counter row, so 12 parallel calls on a limit of 3 calls' worth succeed exactly 3 times.
  Raises ``KeySpendLimitReached`` (402) when the charge does not fit. Returns True when
  a counter was charged (the key has a limit), False otherwise (nothing to release later).
* ``refusal(key_id, micros, now)``: that 402 for a charge refused by the same rule in
  PostgreSQL's ``gw_open_calls`` (migration 0027), which reserves in its own statement.
* ``release(key_id, micros, charged_at)``: ONE conditional UPDATE giving ``micros`` back
  to the counter of the period that contains ``charged_at`` (refunds, released holds).

Both join the caller's unit of work and never commit. Changing a key's period starts
counting in the new period's row; a release for a period whose row does not exist changes
nothing.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.errors import PaymentRequired
from app.extensions import db
from app.models import ApiKey, KeySpend

PERIODS = ("day", "week", "month", "total")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SPEND = KeySpend.__table__
_KEYS = ApiKey.__table__
_INSERT = pg_insert(_SPEND)
_RESERVE = _INSERT.on_conflict_do_update(
    index_elements=["key_id", "period_start"],
    set_={"spent_micros": _SPEND.c.spent_micros + _INSERT.excluded.spent_micros},
    where=_SPEND.c.spent_micros + _INSERT.excluded.spent_micros <= bindparam("limit"),
).returning(_SPEND.c.spent_micros)
_RELEASE = (update(_SPEND)
            .where(_SPEND.c.key_id == bindparam("k"), _SPEND.c.period_start == bindparam("ps"))
            .values(spent_micros=func.greatest(_SPEND.c.spent_micros - bindparam("m"), 0)))


class KeySpendLimitReached(PaymentRequired):
    code = "key_spend_limit_reached"
    description = ("The API key's spend limit for its period (day, week, month or total, UTC) "
                   "cannot cover this charge; nothing was charged. The body adds `limit_cents`, "
                   "`spent_cents`, `period` and `resets_at` (null for `total`).")


def period_bounds(period: str, now: datetime) -> tuple[datetime, datetime | None]:
    """[start, end) of the UTC limit period containing ``now`` (end None for ``total``)."""
    now = now.astimezone(timezone.utc)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day, day + timedelta(days=1)
    if period == "week":
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    if period == "month":
        start = day.replace(day=1)
        return start, (start + timedelta(days=32)).replace(day=1)
    if period == "total":
        return EPOCH, None
    raise ValueError(f"unknown spend limit period {period!r}")


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


def reserve(key_id: str | None, micros: int, now: datetime) -> bool:
    """Count ``micros`` against the key's limit for the period of ``now``, or raise
    ``KeySpendLimitReached`` changing nothing. False (nothing counted) for no key, a key
    without a limit, or a zero charge. Does not commit."""
    if not key_id or micros <= 0:
        return False
    limit, period = _limit_of(key_id)
    if limit is None or period is None:
        return False
    start, end = period_bounds(period, now)
    got = None
    if micros <= limit:
        got = db.session.execute(_RESERVE, {
            "key_id": key_id, "period_start": start, "spent_micros": int(micros), "limit": int(limit)},
        ).first()
    if got is None:
        raise _refusal(key_id, limit, period, micros, now, end)
    return True


def refusal(key_id: str, micros: int, now: datetime) -> KeySpendLimitReached:
    """The 402 for a charge that the key's limit refused elsewhere (``gw_open_calls`` does
    the same conditional upsert server-side); reads only."""
    limit, period = _limit_of(key_id)
    return _refusal(key_id, int(limit or 0), period or "total", micros, now,
                    period_bounds(period or "total", now)[1])


def _refusal(key_id: str, limit: int, period: str, micros: int, now: datetime,
             end: datetime | None) -> KeySpendLimitReached:
    from app.services.billing.ledger import micros_to_cents

    used = spent(key_id, period, now)
    resets = end.isoformat().replace("+00:00", "Z") if end else None
    when = f"it resets at {resets}" if resets else "it never resets (period total)"
    return KeySpendLimitReached(
        f"This key's spend limit is {micros_to_cents(limit)} cents per {period}; it has spent "
        f"{micros_to_cents(used)} cents and this charge of {micros / 10_000:g} cents does not fit; "
        f"{when}. Nothing was charged.",
        extra={"limit_cents": micros_to_cents(limit), "spent_cents": micros_to_cents(used),
               "period": period, "resets_at": resets})


def release(key_id: str | None, micros: int, charged_at: datetime) -> None:
    """Give ``micros`` back to the counter of the period containing ``charged_at`` (one
    conditional UPDATE, never below zero). Does not commit."""
    if not key_id or micros <= 0:
        return
    _, period = _limit_of(key_id)
    if period is None:
        return
    start, _ = period_bounds(period, charged_at)
    db.session.execute(_RELEASE, {"k": key_id, "ps": start, "m": int(micros)})
