"""Auto top-up: an account's rule (per mode) and its runs (app/services/billing/autotopup.py).
A run is one threshold crossing's top-up: queued by the database when a charge takes the
balance under the threshold, charged through the processor by a job, booked like any
payment (its ``payment_id``)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, UTCDateTime, utcnow


class AutoTopup(db.Model):
    """The account's auto top-up rule in ``mode``: when the balance goes under
    ``threshold_micros``, charge ``amount_micros`` to the saved card, at most
    ``monthly_cap_micros`` per calendar month (UTC). ``failures`` counts consecutive failed
    attempts; at the configured maximum the rule is disabled (``enabled`` false,
    ``disabled_reason``) and the owner is told."""

    __tablename__ = "auto_topups"
    __table_args__ = (UniqueConstraint("account_id", "mode", name="uq_auto_topups_account_mode"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    mode: Mapped[str] = mapped_column(String(8))
    threshold_micros: Mapped[int] = mapped_column(BigInteger)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    monthly_cap_micros: Mapped[int] = mapped_column(BigInteger)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    disabled_reason: Mapped[str | None] = mapped_column(String(300))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class AutoTopupRun(db.Model):
    """One top-up attempt. ``status``: ``queued`` → ``processing`` → ``succeeded`` |
    ``pending`` (the processor is still working; its webhook completes the payment and closes the run) |
    ``failed`` | ``requires_action`` (3-D Secure) | ``skipped`` (``reason``: disabled,
    above_threshold, cap_reached, no_method). At most one run of an account and mode is
    open (queued or processing): a partial unique index. ``lease_until``: a processing run
    whose worker died is taken again after it."""

    __tablename__ = "auto_topup_runs"
    __table_args__ = (
        Index("uq_auto_topup_runs_open", "account_id", "mode", unique=True,
              postgresql_where=text("status IN ('queued', 'processing')")),
        Index("ix_auto_topup_runs_due", "due_at", postgresql_where=text("status IN ('queued', 'processing')")),
        Index("ix_auto_topup_runs_account", "account_id", "mode", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    mode: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16), default="queued")
    reason: Mapped[str | None] = mapped_column(String(300))
    balance_micros: Mapped[int | None] = mapped_column(BigInteger)  # the balance that crossed
    amount_micros: Mapped[int | None] = mapped_column(BigInteger)
    payment_id: Mapped[str | None] = mapped_column(String(32))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    due_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
