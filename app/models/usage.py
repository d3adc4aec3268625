"""Usage rollups: per account, per product (module slug or ``chat:<model>``), per mode, per UTC hour."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, UTCDateTime


class UsageHourly(db.Model):
    """Hourly rollups of the call logs (``module_calls``, ``chat_completions``) for hours
    that are final, written by the ``usage-roll`` job (``billing.usage_log.roll``), so
    usage endpoints and alert metrics read a few rows per hour instead of scanning the
    call log; the hours not rolled yet are read from the call log itself."""

    __tablename__ = "usage_hourly"
    __table_args__ = (
        UniqueConstraint("account_id", "product", "mode", "hour", name="uq_usage_hourly_key"),
        # usage, daily series, alert pass: index-only on PostgreSQL (migration 0018)
        Index("ix_usage_hourly_account_mode_hour", "account_id", "mode", "hour",
              postgresql_include=["product", "calls", "errors", "spend_micros"]),
        # the hours of a few days for every account (alert pass, rolling a day): 0019
        Index("ix_usage_hourly_hour", "hour", postgresql_include=["account_id", "product", "mode", "calls",
                                                                 "errors", "spend_micros"]),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(32))
    product: Mapped[str] = mapped_column(String(96))  # module slug, or "chat:<model id>"
    mode: Mapped[str] = mapped_column(String(8), default="live")  # live | test
    hour: Mapped[datetime] = mapped_column(UTCDateTime)
    calls: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    spend_micros: Mapped[int] = mapped_column(BigInteger, default=0)


class UsageDaily(db.Model):
    """Daily rollups (UTC days) of ``usage_hourly``, for the days that are fully rolled
    (before ``usage_rollup_state.days_rolled_through``), written by the same roll job:
    long windows read one row per day instead of 24 (``usage_log.usage_rows``)."""

    __tablename__ = "usage_daily"
    __table_args__ = (
        UniqueConstraint("account_id", "product", "mode", "day", name="uq_usage_daily_key"),
        Index("ix_usage_daily_account_mode_day", "account_id", "mode", "day",
              postgresql_include=["product", "calls", "errors", "spend_micros"]),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(32))
    product: Mapped[str] = mapped_column(String(96))
    mode: Mapped[str] = mapped_column(String(8), default="live")
    day: Mapped[datetime] = mapped_column(UTCDateTime)  # 00:00 UTC of the day
    calls: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)
    spend_micros: Mapped[int] = mapped_column(BigInteger, default=0)


class UsageRollupState(db.Model):
    """One row (id 1): ``rolled_through`` is the first hour NOT yet final-rolled into
    ``usage_hourly``. ``tail_through`` (a whole minute after it, or NULL) is where the
    tail roll stopped: the calls of [rolled_through, tail_through) are added to their
    hours' rows, and usage is read from the call logs from ``tail_through`` (else
    ``rolled_through``) on. ``days_rolled_through`` is the first day (00:00 UTC) NOT yet
    rolled into ``usage_daily``: the day of ``rolled_through`` (NULL: no day rolled)."""

    __tablename__ = "usage_rollup_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rolled_through: Mapped[datetime] = mapped_column(UTCDateTime)
    days_rolled_through: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    tail_through: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
