"""Seed usage for tests: add to an hour's ``usage_hourly`` row, as a rolled hour (readers
sum every ``usage_hourly`` row plus the call log after the rollup mark). Does not commit."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.extensions import db
from app.models import UsageHourly
from app.models.base import utcnow
from app.services.billing.usage_log import hour_of


def record(account_id: str, product: str, *, spend_micros: int, error: bool = False,
           mode: str = "live", calls: int = 1, at: datetime | None = None) -> None:
    """Add ``calls`` calls (one error if ``error``) and ``spend_micros`` to the hour of ``at``."""
    table = UsageHourly.__table__
    ins = (pg_insert if db.session.get_bind().dialect.name == "postgresql" else sqlite_insert)(table)
    stmt = ins.on_conflict_do_update(
        index_elements=["account_id", "product", "mode", "hour"],
        set_={"calls": table.c.calls + ins.excluded.calls, "errors": table.c.errors + ins.excluded.errors,
              "spend_micros": table.c.spend_micros + ins.excluded.spend_micros})
    db.session.execute(stmt, {"account_id": account_id, "product": product, "mode": mode,
                              "hour": hour_of(at or utcnow()), "calls": calls,
                              "errors": 1 if error else 0, "spend_micros": int(spend_micros)})
