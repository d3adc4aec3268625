"""Per-key spend limits: the Python side of the rule that no charge may push a key past its
limit (issue 16 item 3). The rule itself — the periods and the counters of ``key_spend`` —
is written once, in the money engine's SQL (``app/services/money/sql/``:
``gw_period_bounds``, ``gw_spend_reserve``, ``gw_spend_release``); these helpers only call
it, join the caller's unit of work and never commit.

A key with ``spend_limit_micros`` set counts what it spends per ``spend_limit_period``:
``day`` (UTC midnight), ``week`` (ISO week, Monday 00:00 UTC), ``month`` (the 1st, 00:00
UTC) or ``total`` (one period since 1970-01-01). The counter row is keyed by
``(key_id, period_start)``. A reservation remembers the period it was taken in
(``reserved_from``, stored on the call or completion row), and its release goes back to
that period even if the key's period changed since.

* The reserve itself happens only inside the engine's statements (``gw_open_calls``,
  ``gw_chat_hold`` call ``gw_spend_reserve``).
* ``refusal(key_id, micros, now)``: that 402 for a charge the engine refused in one of its
  statements (``gw_open_calls``, ``gw_chat_hold``); reads only.
* ``release(key_id, micros, reserved_from)``: gives ``micros`` back to that period's
  counter (never below zero).
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import select, text

from app.errors import PaymentRequired
from app.extensions import db
from app.models import ApiKey, KeySpend

PERIODS = ("day", "week", "month", "total")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SPEND = KeySpend.__table__
_KEYS = ApiKey.__table__
_BOUNDS = text("SELECT period_from, period_to FROM gw_period_bounds(:period, :at)")
_RELEASE = text("SELECT gw_spend_release(:key, :micros, :reserved_from)")


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


def release(key_id: str | None, micros: int, reserved_from: datetime | None) -> None:
    """Give ``micros`` back to the counter of the period the reservation was taken in
    (``reserve``'s answer; never below zero). Nothing for no reservation. Does not commit."""
    if not key_id or micros <= 0 or reserved_from is None:
        return
    db.session.execute(_RELEASE, {"key": key_id, "micros": int(micros), "reserved_from": reserved_from})
