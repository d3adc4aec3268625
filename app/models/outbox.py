"""Outbox: every e-mail and outgoing webhook, written before any delivery attempt."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import JSONType, UTCDateTime, utcnow


class OutboxMessage(db.Model):
    """One message to deliver: ``channel`` is ``email``, ``webhook`` (Standard Webhooks
    signed JSON POST) or ``chat`` (team-chat incoming webhook ``{"text": …}``).

    status: ``pending`` (to deliver at ``next_attempt_at``; a claimed attempt pushes it
    forward by a lease, so a crashed worker's message is retried), ``delivered``, or
    ``failed`` (gave up after ``max_attempts``; ``flask outbox redeliver`` re-arms it), or
    ``cancelled`` (never to be sent: a disabled agent's webhook events, ``outbox.cancel``).
    ``source`` links the message to what caused it (e.g. ``alert_event:42``)."""

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_status_next", "status", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    channel: Mapped[str] = mapped_column(String(16))
    destination: Mapped[str] = mapped_column(String(2000))
    payload: Mapped[dict] = mapped_column(JSONType)
    source: Mapped[str | None] = mapped_column(String(120), index=True)
    account_id: Mapped[str | None] = mapped_column(String(32), index=True)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=8)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
