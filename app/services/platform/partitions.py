"""Monthly partitions of the call log and the ledger legs (PostgreSQL only).

The baseline migration partitions ``module_calls``, ``chat_completions``
and ``ledger_entries`` by RANGE (created_at), one partition per UTC month named
``<table>_pYYYY_MM``, plus ``<table>_default`` (an insert never fails). Two jobs keep it:

* ``ensure_ahead`` (``partitions-ensure``, every 6 h; ``flask partitions ensure``) creates
  the partitions of this month and the next ``PARTITIONS_AHEAD_MONTHS`` through the SQL
  function ``gw_create_month_partition`` (``platform/sql/``; it moves rows the DEFAULT
  partition holds for that month, if any), so rows normally never reach DEFAULT;
* ``drop_expired`` (``call-log-retention``, daily; ``flask partitions prune``) drops whole
  months of the **call log** (``module_calls``, ``chat_completions``) older than
  ``CALL_LOG_RETENTION_MONTHS`` (0, the default: keep everything). The ledger is never
  touched: ``LEDGER`` is not in ``CALL_LOG`` and ``drop_expired`` refuses any table outside
  it. A month that still holds an unfinished row (a ``pending`` call, a ``held``
  completion: money not yet settled) is kept and reported instead.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timezone

from flask import current_app
from sqlalchemy import text

from app.extensions import db
from app.models.calls import PENDING_SQL
from app.services.platform.uow import unit_of_work

CALL_LOG = ("module_calls", "chat_completions")
LEDGER = ("ledger_entries",)
PARTITIONED = CALL_LOG + LEDGER
# rows whose money is not settled yet: a month holding one is never dropped
_UNFINISHED = {"module_calls": PENDING_SQL, "chat_completions": "status = 'held'"}
_NAME = re.compile(r"^(?P<table>[a-z_]+)_(?:p(?P<year>\d{4})_(?P<month>\d{2})|default)$")


def is_partition(name: str) -> bool:
    """True for a partition's table name (``module_calls_p2026_11``, ``…_default``)."""
    m = _NAME.match(name or "")
    return bool(m) and m.group("table") in PARTITIONED


def month_start(d: date, plus: int = 0) -> date:
    """The first day of ``d``'s month, ``plus`` months later (negative: earlier)."""
    y, m = divmod(d.month - 1 + plus, 12)
    return date(d.year + y, m + 1, 1)


@dataclass(frozen=True)
class Partition:
    table: str
    name: str
    month: date | None  # None: the DEFAULT partition


def partitions(table: str) -> list[Partition]:
    """The partitions of ``table``, oldest month first, DEFAULT last ([] if not partitioned)."""
    names = db.session.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(:t)"), {"t": table}).scalars().all()
    out = []
    for name in names:
        m = _NAME.match(name)
        if m and m.group("table") == table:
            month = date(int(m.group("year")), int(m.group("month")), 1) if m.group("year") else None
            out.append(Partition(table, name, month))
    return sorted(out, key=lambda p: (p.month is None, p.month or date.min))


def ensure_ahead(months: int | None = None, *, today: date | None = None) -> list[str]:
    """Create the missing monthly partitions from this month to ``months`` ahead
    (default ``PARTITIONS_AHEAD_MONTHS``) for every partitioned table. Returns the names
    created. Safe to run concurrently (the SQL function takes an advisory lock)."""
    if months is None:
        months = current_app.config["PARTITIONS_AHEAD_MONTHS"]
    first = month_start(today or datetime.now(timezone.utc).date())
    created = []
    for table in PARTITIONED:
        for n in range(months + 1):
            month = month_start(first, n)
            with unit_of_work():
                if db.session.execute(text("SELECT gw_create_month_partition(:t, :m)"),
                                      {"t": table, "m": month}).scalar():
                    created.append(f"{table}_p{month:%Y_%m}")
    return created


@dataclass(frozen=True)
class Pruned:
    dropped: list[str]
    kept_unfinished: list[str]  # old enough, but holding unsettled rows


def drop_expired(retention_months: int | None = None, *, today: date | None = None,
                 tables: tuple[str, ...] = CALL_LOG) -> Pruned:
    """Drop the call-log partitions whose whole month is older than ``retention_months``
    full months before the current one (default ``CALL_LOG_RETENTION_MONTHS``; 0 keeps
    everything). Only ``CALL_LOG`` tables: anything else (the ledger) raises ValueError."""
    refused = [t for t in tables if t not in CALL_LOG]
    if refused:
        raise ValueError(f"retention applies to the call log only, not {', '.join(refused)}")
    if retention_months is None:
        retention_months = current_app.config["CALL_LOG_RETENTION_MONTHS"]
    if retention_months <= 0:
        return Pruned([], [])
    cutoff = month_start(today or datetime.now(timezone.utc).date(), -retention_months)
    dropped, kept = [], []
    for table in tables:
        for part in partitions(table):
            if part.month is None or part.month >= cutoff:
                continue
            with unit_of_work():
                # rows only move out of "unfinished" (their created_at is long past), so
                # a month found settled here stays settled until the DROP
                if db.session.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{part.name}" '
                                           f'WHERE {_UNFINISHED[table]})')).scalar():
                    kept.append(part.name)
                    continue
                db.session.execute(text(f'DROP TABLE "{part.name}"'))
            dropped.append(part.name)
    return Pruned(dropped, kept)
