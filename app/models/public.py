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
    """One mailbox on one list (``launch`` | ``product`` | ``weekly``).

    ``mailbox`` is the canonical mailbox of ``email`` (``app/services/accounts/mailbox.py``:
    lower-cased, ``+tag`` dropped, Gmail's dots folded), unique per list, so every spelling
    of one inbox finds (and unsubscribes) the same row; the newsletter service sets it, as
    the accounts service sets ``accounts.mailbox``. ``email`` is where list mail is delivered: the address the latest
    confirmation link was sent to (the one confirmed, once subscribed).

    status: ``pending`` (a confirmation token was mailed: a single-use token of purpose
    ``newsletter_confirm`` whose subject is this row's id), ``subscribed`` or
    ``unsubscribed``."""

    __tablename__ = "subscriptions"
    __table_args__ = (UniqueConstraint("mailbox", "list", name="uq_subscriptions_mailbox_list"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    email: Mapped[str] = mapped_column(String(320))
    # indexed by the unique constraint (mailbox first)
    mailbox: Mapped[str] = mapped_column(String(320))
    list: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    confirmed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    unsubscribed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
