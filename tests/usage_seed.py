"""Seed usage for tests: add to an hour's ``usage_hourly`` row, as a rolled hour (readers
sum every ``usage_hourly`` row plus the call log after the rollup mark), and to its day's
``usage_daily`` row when that day is rolled (before ``days_rolled_through``: readers take
such whole days from ``usage_daily``), as the roll job would. Does not commit."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from app.extensions import db
from app.models import UsageDaily, UsageHourly, UsageRollupState
from app.models.base import utcnow
from app.services.billing.usage_log import day_of, hour_of


def record(account_id: str, product: str, *, spend_micros: int, error: bool = False,
           mode: str = "live", calls: int = 1, at: datetime | None = None) -> None:
    """Add ``calls`` calls (one error if ``error``) and ``spend_micros`` to the hour of ``at``."""
    hour = hour_of(at or utcnow())
    values = {"account_id": account_id, "product": product, "mode": mode, "calls": calls,
              "errors": 1 if error else 0, "spend_micros": int(spend_micros)}
    _add(UsageHourly.__table__, "hour", {**values, "hour": hour})
    days_mark = db.session.execute(select(UsageRollupState.days_rolled_through)).scalar()
    if days_mark is not None and day_of(hour) < days_mark:
        _add(UsageDaily.__table__, "day", {**values, "day": day_of(hour)})


def _add(table, ts_column: str, values: dict) -> None:
    ins = pg_insert(table)
    stmt = ins.on_conflict_do_update(
        index_elements=["account_id", "product", "mode", ts_column],
        set_={"calls": table.c.calls + ins.excluded.calls, "errors": table.c.errors + ins.excluded.errors,
              "spend_micros": table.c.spend_micros + ins.excluded.spend_micros})
    db.session.execute(stmt, values)
