"""Usage: read back what the call logs record (SPEC endpoints 25, 26, the daily series).

Nothing on a metered path writes usage (docs/performance.md): readers sum the rolled
days of ``usage_daily``, the other rolled hours of ``usage_hourly`` and the not-yet-rolled
tail of the call logs in one query (``usage_log.usage_rows``); the ``usage-roll`` job
rolls final hours (and fully rolled days) up. Readers: the
usage endpoints (current billing period, by module, daily), the console, agent earnings
and alert metrics (rolling windows). Billing period = calendar month, UTC.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import case, func, literal, select

from app.extensions import db
from app.models.base import utcnow
from app.services.billing.usage_log import hour_of, usage_rows  # noqa: F401 (hour_of: re-exported)


def billing_period(now: datetime | None = None) -> tuple[datetime, datetime]:
    """[start, end) of the calendar month (UTC) containing ``now``."""
    now = (now or utcnow()).astimezone(timezone.utc)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def totals(account_id: str, start: datetime, end: datetime, *, mode: str = "live",
           product_prefix: str | None = None) -> dict:
    """calls, errors, spend_micros of one account over [start, end) (hour granularity)."""
    u = usage_rows(start, end, account_id, (mode,))
    q = select(func.coalesce(func.sum(u.c.calls), 0), func.coalesce(func.sum(u.c.errors), 0),
               func.coalesce(func.sum(u.c.spend_micros), 0))
    if product_prefix:
        q = q.where(u.c.product.startswith(product_prefix))
    calls, errors, spend = db.session.execute(q).one()
    return {"calls": int(calls), "errors": int(errors), "spend_micros": int(spend)}


def by_product(account_id: str, start: datetime, end: datetime, *, mode: str = "live") -> list[dict]:
    u = usage_rows(start, end, account_id, (mode,))
    rows = db.session.execute(
        select(u.c.product, func.sum(u.c.calls), func.sum(u.c.errors), func.sum(u.c.spend_micros))
        .group_by(u.c.product).order_by(func.sum(u.c.spend_micros).desc(), u.c.product)).all()
    return [{"product": p, "calls": int(c), "errors": int(e), "spend_micros": int(s)}
            for p, c, e, s in rows]


def current_usage(account_id: str, plan_cents: int) -> dict:
    """UsageCurrent (SPEC endpoint 25): live calls and spend of the current calendar month
    (UTC). Failed (refunded) calls count as calls; their refunded money is not spend."""
    from app.services.billing.ledger import micros_to_cents

    start, end = billing_period()
    t = totals(account_id, start, end, mode="live")
    return {"period_start": start, "period_end": end, "calls": t["calls"],
            "spend_cents": micros_to_cents(t["spend_micros"]), "plan_cents": int(plan_cents)}


def usage_by_module(account_id: str) -> dict:
    """UsageByModule (SPEC endpoint 26): this month's live calls and spend per module slug,
    by spend descending (chat products ``chat:<model>`` are not modules and are left out)."""
    from app.services.billing.ledger import micros_to_cents

    start, end = billing_period()
    return {"by_module": [
        {"slug": r["product"], "calls": r["calls"], "spend_cents": micros_to_cents(r["spend_micros"])}
        for r in by_product(account_id, start, end, mode="live") if not r["product"].startswith("chat:")
    ]}


MAX_DAILY_DAYS = 90


def daily_rows(account_id: str, days: int, *, mode: str = "live", now: datetime | None = None) -> list[dict]:
    """The last ``days`` UTC calendar days (today included, oldest first) of one account:
    ``{"date", "calls", "errors", "spend_micros"}`` per day, zero-filled, from the usage
    rows (module calls and chat alike), summed per day in SQL (one query)."""
    today = (now or utcnow()).astimezone(timezone.utc).date()
    first = today - timedelta(days=days - 1)
    start = datetime(first.year, first.month, first.day, tzinfo=timezone.utc)
    u = usage_rows(start, start + timedelta(days=days), account_id, (mode,))
    # the day of a row, newest first (portable: no date functions; recent rows match early)
    day = case(*[(u.c.ts >= start + timedelta(days=i), i) for i in range(days - 1, 0, -1)],
               else_=0) if days > 1 else literal(0)
    rows = db.session.execute(select(day, func.sum(u.c.calls), func.sum(u.c.errors),
                                     func.sum(u.c.spend_micros)).group_by(day)).all()
    out = {first + timedelta(days=i): {"calls": 0, "errors": 0, "spend_micros": 0} for i in range(days)}
    for index, calls, errors, spend in rows:
        out[first + timedelta(days=int(index))] = {"calls": int(calls), "errors": int(errors),
                                                   "spend_micros": int(spend)}
    return [{"date": d, **v} for d, v in out.items()]


def daily(account_id: str, days: int, *, mode: str = "live", now: datetime | None = None) -> dict:
    """UsageDaily (``GET /api/usage/daily``): the last ``days`` UTC dates (today last), each
    with calls, spend_cents and errors summed from the usage rows (module calls and chat
    completions)."""
    from app.services.billing.ledger import micros_to_cents

    return {"days": [{"date": r["date"].isoformat(), "calls": r["calls"], "errors": r["errors"],
                      "spend_cents": micros_to_cents(r["spend_micros"])}
                     for r in daily_rows(account_id, days, mode=mode, now=now)]}
