"""Spend alerts: rules (per account) and their firings (alert events)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Float, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import UTCDateTime, utcnow


class Alert(db.Model):
    """A rule: ``metric op threshold`` over ``window``, delivered through ``channel`` to
    ``target``. Deleting sets ``deleted_at`` (the rule stops being evaluated and listed;
    its past events stay listed). ``secret`` is the Standard Webhooks signing secret
    (``whsec_…``) of webhook alerts, shown to the user once at creation."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_account_active", "account_id", "deleted_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(8), default="live", server_default="live")  # live | test
    name: Mapped[str] = mapped_column(String(100))
    metric: Mapped[str] = mapped_column(String(16))
    op: Mapped[str] = mapped_column(String(2))
    threshold: Mapped[float] = mapped_column(Float)
    window: Mapped[str] = mapped_column(String(8))
    channel: Mapped[str] = mapped_column(String(8))
    target: Mapped[str] = mapped_column(String(2000))
    secret: Mapped[str | None] = mapped_column(String(80))
    # ``active`` or ``pending_verification`` (an e-mail target other than the account's own
    # address, until its owner confirms: app/services/billing/alert_targets.py).
    status: Mapped[str] = mapped_column(String(24), default="active", server_default="active")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AlertEvent(db.Model):
    """One firing, written in the same transaction as its outbox message
    (``outbox.source = "alert_event:<id>"``). The unique (alert_id, period_key) makes a
    second firing in the same window period impossible, even with two schedulers."""

    __tablename__ = "alert_events"
    __table_args__ = (
        UniqueConstraint("alert_id", "period_key", name="uq_alert_events_alert_period"),
        Index("ix_alert_events_account_fired", "account_id", "fired_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    alert_id: Mapped[str] = mapped_column(String(32))
    account_id: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(100))  # snapshot of the rule at firing time
    metric: Mapped[str] = mapped_column(String(16))
    op: Mapped[str] = mapped_column(String(2))
    threshold: Mapped[float] = mapped_column(Float)
    value: Mapped[float] = mapped_column(Float)
    window: Mapped[str] = mapped_column(String(8))
    channel: Mapped[str] = mapped_column(String(8))
    period_key: Mapped[str] = mapped_column(String(16))
    fired_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
