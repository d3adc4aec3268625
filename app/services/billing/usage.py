"""Usage rollups: record a call into the hourly counters and read them back.

``record()`` is called by every metered path (module calls, chat completions) in the
same transaction as the charge. Readers: the usage endpoints (current billing period,
by module) and alert metrics (rolling windows). Billing period = calendar month, UTC.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.extensions import db
from app.models.usage import UsageHourly
from app.models.base import utcnow


_USAGE = UsageHourly.__table__  # Core statements in the hot path: cached compiled SQL
_UPSERTS: dict = {}


def hour_of(ts: datetime) -> datetime:
    return ts.astimezone(timezone.utc).replace(minute=0, second=0, microsecond=0)


def record(account_id: str, product: str, *, spend_micros: int, error: bool = False,
           mode: str = "live", calls: int = 1, at: datetime | None = None) -> None:
    """Add one call (or ``calls``) to the account's hourly rollup. Does not commit.

    ``spend_micros`` may be negative to reverse an earlier charge (refunds)."""
    at = at or utcnow()
    values = {"account_id": account_id, "product": product, "mode": mode, "hour": hour_of(at),
              "calls": calls, "errors": 1 if error else 0, "spend_micros": int(spend_micros)}
    db.session.execute(_upsert(db.session.get_bind().dialect.name), values)


def _upsert(dialect: str):
    """INSERT … ON CONFLICT DO UPDATE adding to the hour's counters (built once per
    dialect; the values are given at execution)."""
    stmt = _UPSERTS.get(dialect)
    if stmt is None:
        ins = (pg_insert if dialect == "postgresql" else sqlite_insert)(_USAGE)
        stmt = _UPSERTS[dialect] = ins.on_conflict_do_update(
            index_elements=["account_id", "product", "mode", "hour"],
            set_={"calls": _USAGE.c.calls + ins.excluded.calls,
                  "errors": _USAGE.c.errors + ins.excluded.errors,
                  "spend_micros": _USAGE.c.spend_micros + ins.excluded.spend_micros})
    return stmt


def billing_period(now: datetime | None = None) -> tuple[datetime, datetime]:
    """[start, end) of the calendar month (UTC) containing ``now``."""
    now = (now or utcnow()).astimezone(timezone.utc)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def totals(account_id: str, start: datetime, end: datetime, *, mode: str = "live",
           product_prefix: str | None = None) -> dict:
    """calls, errors, spend_micros of one account over [start, end) (hour granularity)."""
    q = select(func.coalesce(func.sum(UsageHourly.calls), 0),
               func.coalesce(func.sum(UsageHourly.errors), 0),
               func.coalesce(func.sum(UsageHourly.spend_micros), 0)).where(
        UsageHourly.account_id == account_id, UsageHourly.mode == mode,
        UsageHourly.hour >= hour_of(start), UsageHourly.hour < end)
    if product_prefix:
        q = q.where(UsageHourly.product.startswith(product_prefix))
    calls, errors, spend = db.session.execute(q).one()
    return {"calls": int(calls), "errors": int(errors), "spend_micros": int(spend)}


def by_product(account_id: str, start: datetime, end: datetime, *, mode: str = "live") -> list[dict]:
    rows = db.session.execute(
        select(UsageHourly.product, func.sum(UsageHourly.calls), func.sum(UsageHourly.errors),
               func.sum(UsageHourly.spend_micros))
        .where(UsageHourly.account_id == account_id, UsageHourly.mode == mode,
               UsageHourly.hour >= hour_of(start), UsageHourly.hour < end)
        .group_by(UsageHourly.product).order_by(func.sum(UsageHourly.spend_micros).desc(),
                                                UsageHourly.product)
    ).all()
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
    ``{"date", "calls", "errors", "spend_micros"}`` per day, zero-filled, from the hourly
    rollups (module calls and chat alike)."""
    today = (now or utcnow()).astimezone(timezone.utc).date()
    first = today - timedelta(days=days - 1)
    start = datetime(first.year, first.month, first.day, tzinfo=timezone.utc)
    # summed over products in SQL: at most 24 × days rows reach Python, however many
    # products the account used (index-only scan of ix_usage_hourly_account_mode_hour)
    rows = db.session.execute(
        select(UsageHourly.hour, func.sum(UsageHourly.calls), func.sum(UsageHourly.errors),
               func.sum(UsageHourly.spend_micros))
        .where(UsageHourly.account_id == account_id, UsageHourly.mode == mode,
               UsageHourly.hour >= start, UsageHourly.hour < start + timedelta(days=days))
        .group_by(UsageHourly.hour)
    ).all()
    out = {first + timedelta(days=i): {"calls": 0, "errors": 0, "spend_micros": 0} for i in range(days)}
    for hour, calls, errors, spend in rows:
        day = out.get(hour.astimezone(timezone.utc).date())
        if day is not None:
            day["calls"] += int(calls)
            day["errors"] += int(errors)
            day["spend_micros"] += int(spend)
    return [{"date": d, **v} for d, v in out.items()]


def daily(account_id: str, days: int, *, mode: str = "live", now: datetime | None = None) -> dict:
    """UsageDaily (``GET /api/usage/daily``): the last ``days`` UTC dates (today last), each
    with calls, spend_cents and errors summed from the hourly rollups (module calls and
    chat completions)."""
    from app.services.billing.ledger import micros_to_cents

    return {"days": [{"date": r["date"].isoformat(), "calls": r["calls"], "errors": r["errors"],
                      "spend_cents": micros_to_cents(r["spend_micros"])}
                     for r in daily_rows(account_id, days, mode=mode, now=now)]}
