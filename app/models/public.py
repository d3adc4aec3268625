"""Public-form records: contact messages, newsletter subscriptions, sign-up requests."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String, Text, UniqueConstraint
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

    status: ``pending`` (confirmation sent; ``token_hash`` is the SHA-256 of the single-use
    confirmation token, valid until ``token_expires_at``), ``subscribed`` or
    ``unsubscribed``. A confirmed token is cleared, so it cannot be used twice."""

    __tablename__ = "subscriptions"
    __table_args__ = (UniqueConstraint("email", "list", name="uq_subscriptions_email_list"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    email: Mapped[str] = mapped_column(String(320), index=True)
    list: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    token_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    confirmed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    unsubscribed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class SignupRequest(db.Model):
    """A self-serve sign-up awaiting e-mail verification. ``token_hash`` is the SHA-256 of
    the single-use token mailed to ``email``; ``used_at`` is set (atomically) when it is
    redeemed, and ``account_id`` then names the account it created."""

    __tablename__ = "signup_requests"
    __table_args__ = (Index("ix_signup_requests_email", "email"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    email: Mapped[str] = mapped_column(String(320))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    account_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
