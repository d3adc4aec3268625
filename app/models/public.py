"""Public-form records: contact messages and newsletter subscriptions (sign-up and
confirmation tokens are single-use tokens, app/models/tokens.py)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import UTCDateTime, utcnow


class ContactMessage(db.Model):
    """A contact-form message (SPEC endpoint 31), forwarded to ``SALES_EMAIL`` through the
    outbox message ``outbox_id`` written in the same transaction."""

    __tablename__ = "contact_messages"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    email: Mapped[str] = mapped_column(String(320), index=True)
    name: Mapped[str | None] = mapped_column(String(100))
    message: Mapped[str] = mapped_column(Text)
    client_ip: Mapped[str | None] = mapped_column(String(64))
    outbox_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Subscription(db.Model):
    """One address on one list (``launch`` | ``product`` | ``weekly``).

    status: ``pending`` (a confirmation token was mailed: a single-use token of purpose
    ``newsletter_confirm`` whose subject is this row's id), ``subscribed`` or
    ``unsubscribed``."""

    __tablename__ = "subscriptions"
    __table_args__ = (UniqueConstraint("email", "list", name="uq_subscriptions_email_list"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    email: Mapped[str] = mapped_column(String(320), index=True)
    list: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    confirmed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    unsubscribed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
