"""Usage: read back what the call logs record (SPEC endpoints 25, 26, the daily series).

Nothing on a metered path writes usage (docs/performance.md, the metered call's step 9):
readers sum the rolled days of ``usage_daily``, the other rolled hours of ``usage_hourly`` and the not-yet-rolled
tail of the call logs in one query (``usage_log.usage_rows``); the ``usage-roll`` job
rolls final hours (and fully rolled days) up. Readers: the
usage endpoints (current billing period, by module, daily), the console, agent earnings
and alert metrics (rolling windows). Billing period = calendar month, UTC.

A read of whole UTC days of one account and mode (the usage endpoints: this month, the
daily series) runs a statement built once per process (``usage_log.whole_day_rows``
with bind parameters, cached here) as ONE autocommit statement on a
connection of the pool (``uow.read``): no per-read statement building or compiling, no
``BEGIN`` or ``ROLLBACK`` round trips (bench/DIARY.md, "Usage reads").
"""
from __future__ import annotations

import functools
from datetime import datetime, timedelta, timezone

from sqlalchemy import bindparam, case, func, literal, select

from app.errors import NotFound
from app.models import Account
from app.models.base import UTCDateTime, utcnow
from app.services.billing.usage_log import (hour_of, is_whole_days, key_rows, member_rows,  # noqa: F401
                                           member_totals, usage_rows, whole_day_rows)
from app.services.platform import uow


def billing_period(now: datetime | None = None) -> tuple[datetime, datetime]:
    """[start, end) of the calendar month (UTC) containing ``now``."""
    now = (now or utcnow()).astimezone(timezone.utc)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def _rows(account_id: str, start: datetime, end: datetime, mode: str, build, *key, params=None,
          member: str | None = None, filters: dict | None = None) -> list:
    """The rows of the statement ``build(u, *key)`` makes around the usage rows ``u`` of one
    account and mode in [start, end): for whole days the cached statement over
    ``whole_day_rows`` (values bound at execution), else one built now over
    ``usage_rows``; run by ``uow.read``. ``:account`` and ``params`` are bound in both.
    ``member``: only the calls of that member's keys in the organisation ``account_id``
    (``member_rows``: the call logs by actor, the rollups have no actor). ``filters``
    (``FILTERS``; the plain read has none and keeps this fast path): see ``_filtered``; with
    ``member``, a ``key_id`` that is not one of the member's keys matches nothing."""
    bound = {"start": start, "end": end, "account": account_id, "mode": mode, **(params or {})}
    narrow = filter_params(filters)
    if narrow:
        build, key = _filtered, (build, "f_module" in narrow, "f_model" in narrow, *key)
        bound.update(narrow)
    if member is not None:
        u = member_rows(start, end, account_id, (mode,), member, key_id=narrow.get("f_key"))
        return uow.read(build(u, *key), bound)
    if "f_key" in narrow:
        return uow.read(_cached_of_key(build, *key), bound)
    if is_whole_days(start, end):
        return uow.read(_cached(build, *key), bound)
    return uow.read(build(usage_rows(start, end, account_id, (mode,)), *key), bound)


@functools.lru_cache(maxsize=256)
def _cached(build, *key):
    return build(whole_day_rows(), *key)


# The usage filters of the usage routes, the export and the console's activity page: one API
# key (``key_id``: the calls it made), one module (its slug) or one chat model; together they
# all apply (a module and a model: nothing, a call is one or the other).
FILTERS = ("key_id", "module", "model")


def filter_params(filters: dict | None) -> dict:
    """The bind values of the given ``filters`` (``f_key``, ``f_module``, ``f_model``: the
    usage product of a chat model is ``chat:<model>``); {} when none is set."""
    f = {k: v for k, v in (filters or {}).items() if k in FILTERS and v}
    out = {}
    if "key_id" in f:
        out["f_key"] = f["key_id"]
    if "module" in f:
        out["f_module"] = f["module"]
    if "model" in f:
        out["f_model"] = "chat:" + f["model"]
    return out


def _filtered(u, build, by_module: bool, by_model: bool, *key):
    """``build(u, *key)`` narrowed to one module's or one model's usage rows (bound
    ``:f_module``, ``:f_model``). The rollups keep the product, so these stay on the rollups;
    a key filter reads the key's calls from the call logs (``_cached_of_key``)."""
    stmt = build(u, *key)
    if by_module:
        stmt = stmt.where(u.c.product == bindparam("f_module"))
    if by_model:
        stmt = stmt.where(u.c.product == bindparam("f_model"))
    return stmt


@functools.lru_cache(maxsize=256)
def _cached_of_key(build, *key):
    start, end = bindparam("start", type_=UTCDateTime()), bindparam("end", type_=UTCDateTime())
    return build(key_rows(start, end, bindparam("account"), (bindparam("mode"),), bindparam("f_key")), *key)


def _totals_stmt(u, product_prefix, with_plan):
    cols = [func.coalesce(func.sum(u.c.calls), 0), func.coalesce(func.sum(u.c.errors), 0),
            func.coalesce(func.sum(u.c.spend_micros), 0)]
    if with_plan:  # the account's plan in the same statement (usage-current: one statement)
        cols.append(select(Account.__table__.c.plan).where(Account.__table__.c.id == bindparam("account"))
                    .scalar_subquery())
    q = select(*cols)
    if product_prefix:
        q = q.where(u.c.product.startswith(product_prefix))
    return q


def totals(account_id: str, start: datetime, end: datetime, *, mode: str = "live",
           product_prefix: str | None = None, filters: dict | None = None) -> dict:
    """calls, errors, spend_micros of one account over [start, end) (hour granularity)."""
    (calls, errors, spend), = _rows(account_id, start, end, mode, _totals_stmt, product_prefix, False,
                                    filters=filters)
    return {"calls": int(calls), "errors": int(errors), "spend_micros": int(spend)}


def by_member(org_id: str, start: datetime, end: datetime, *, mode: str = "live") -> list[dict]:
    """calls, errors, spend_micros of each member's organisation keys in [start, end), most
    spent first: what ``member_id`` on the usage routes answers one member at a time, for
    every member in one statement (``usage_log.member_totals``; the console's members page)."""
    rows = uow.read(member_totals(start, end, org_id, (mode,)), {})
    return [{"member_id": m, "calls": int(c), "errors": int(e), "spend_micros": int(s)} for m, c, e, s in rows]


def _by_product_stmt(u):
    return (select(u.c.product, func.sum(u.c.calls), func.sum(u.c.errors), func.sum(u.c.spend_micros))
            .group_by(u.c.product).order_by(func.sum(u.c.spend_micros).desc(), u.c.product))


def by_product(account_id: str, start: datetime, end: datetime, *, mode: str = "live",
               member: str | None = None, filters: dict | None = None) -> list[dict]:
    rows = _rows(account_id, start, end, mode, _by_product_stmt, member=member, filters=filters)
    return [{"product": p, "calls": int(c), "errors": int(e), "spend_micros": int(s)}
            for p, c, e, s in rows]


def current_usage(account_id: str, plan_cents: int | None = None, *, member: str | None = None,
                  filters: dict | None = None) -> dict:
    """UsageCurrent (SPEC endpoint 25): live calls and spend of the current calendar month
    (UTC). Failed (refunded) calls count as calls; their refunded money is not spend.
    ``plan_cents`` None: the account's plan is read in the same statement (404 when the
    account does not exist). ``member``: that member's calls in the organisation
    ``account_id`` (``plan_cents`` stays the organisation's)."""
    from app.services.accounts.accounts import plan_cents as cents_of_plan
    from app.services.money.ledger import micros_to_cents

    start, end = billing_period()
    (calls, _errors, spend, *plan), = _rows(account_id, start, end, "live", _totals_stmt, None,
                                            plan_cents is None, member=member, filters=filters)
    if plan_cents is None:
        if plan[0] is None:
            raise NotFound("No such account.")
        plan_cents = cents_of_plan(plan[0])
    return {"period_start": start, "period_end": end, "calls": int(calls),
            "spend_cents": micros_to_cents(int(spend)), "plan_cents": int(plan_cents)}


def usage_by_module(account_id: str, *, member: str | None = None, filters: dict | None = None) -> dict:
    """UsageByModule (SPEC endpoint 26): this month's live calls and spend per module slug,
    by spend descending (``by_module``, as the SPEC has it), and the chat completions per
    model the same way (``by_model``: chat products ``chat:<model>`` are not modules), with
    the spend also in micros (a chat completion often costs less than a cent)."""
    start, end = billing_period()
    return modules_and_models(by_product(account_id, start, end, mode="live", member=member, filters=filters))


def modules_and_models(rows: list[dict]) -> dict:
    """``by_product`` rows as ``by_module`` (module slugs) and ``by_model`` (chat products
    ``chat:<model>``, which are not modules), each in the rows' order."""
    from app.services.money.ledger import micros_to_cents

    return {
        "by_module": [{"slug": r["product"], "calls": r["calls"], "spend_cents": micros_to_cents(r["spend_micros"])}
                      for r in rows if not r["product"].startswith("chat:")],
        "by_model": [{"model": r["product"].removeprefix("chat:"), "calls": r["calls"],
                      "spend_cents": micros_to_cents(r["spend_micros"]), "spend_micros": r["spend_micros"]}
                     for r in rows if r["product"].startswith("chat:")],
    }


MAX_DAILY_DAYS = 90


def daily_rows(account_id: str, days: int, *, mode: str = "live", now: datetime | None = None,
               member: str | None = None, filters: dict | None = None) -> list[dict]:
    """The last ``days`` UTC calendar days (today included, oldest first) of one account:
    ``{"date", "calls", "errors", "spend_micros"}`` per day, zero-filled, from the usage
    rows (module calls and chat alike), summed per day in SQL (one query)."""
    today = (now or utcnow()).astimezone(timezone.utc).date()
    first = today - timedelta(days=days - 1)
    start = datetime(first.year, first.month, first.day, tzinfo=timezone.utc)
    rows = _rows(account_id, start, start + timedelta(days=days), mode, _daily_stmt, days,
                 params={f"day_{i}": start + timedelta(days=i) for i in range(1, days)}, member=member, filters=filters)
    out = {first + timedelta(days=i): {"calls": 0, "errors": 0, "spend_micros": 0} for i in range(days)}
    for index, calls, errors, spend in rows:
        out[first + timedelta(days=int(index))] = {"calls": int(calls), "errors": int(errors),
                                                   "spend_micros": int(spend)}
    return [{"date": d, **v} for d, v in out.items()]


def _daily_stmt(u, days: int):
    # the day of a row, newest first (portable: no date functions; recent rows match early);
    # day i starts at :day_i (bound values: the statement is the same every day)
    day = case(*[(u.c.ts >= bindparam(f"day_{i}", type_=UTCDateTime()), i) for i in range(days - 1, 0, -1)],
               else_=0) if days > 1 else literal(0)
    return select(day, func.sum(u.c.calls), func.sum(u.c.errors), func.sum(u.c.spend_micros)).group_by(day)


def daily(account_id: str, days: int, *, mode: str = "live", now: datetime | None = None,
          member: str | None = None, filters: dict | None = None) -> dict:
    """UsageDaily (``GET /api/usage/daily``): the last ``days`` UTC dates (today last), each
    with calls, spend_cents and errors summed from the usage rows (module calls and chat
    completions)."""
    from app.services.money.ledger import micros_to_cents

    return {"days": [{"date": r["date"].isoformat(), "calls": r["calls"], "errors": r["errors"],
                      "spend_cents": micros_to_cents(r["spend_micros"])}
                     for r in daily_rows(account_id, days, mode=mode, now=now, member=member, filters=filters)]}
