"""Payments, incoming processor events and billing profiles (DESIGN §3, §8). Money itself lives only in the ledger; these rows
record what the processors and chains told us, each under a unique provider id."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, JSONType, UTCDateTime, utcnow


class Payment(db.Model):
    """One attempt to bring money in: a checkout, an off-session card or ACH charge, a
    USDC deposit or an x402 payment. ``provider_id`` is the processor's id (``cs_…``,
    ``pi_…``), ``<chain>:<tx>:<log_index>`` for a USDC transfer, or ``x402:<nonce>``;
    unique, so one provider object is recorded once.

    status: ``pending`` → ``succeeded`` | ``failed`` | ``canceled`` | ``expired``;
    ``succeeded`` → ``refunded`` / ``partially_refunded``."""

    __tablename__ = "payments"
    __table_args__ = (Index("ix_payments_account_created", "account_id", "created_at"),
                      # the invoice sweep reads the last weeks' payments (billing.invoices.issue_missing)
                      Index("ix_payments_created", "created_at"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    method: Mapped[str] = mapped_column(String(16))  # card | ach | usdc | x402
    kind: Mapped[str] = mapped_column(String(16))  # checkout | charge | deposit | x402
    processor: Mapped[str] = mapped_column(String(16))  # sandbox | stripe | chain | x402
    mode: Mapped[str] = mapped_column(String(8), default="live")
    provider_id: Mapped[str | None] = mapped_column(String(160), unique=True)
    # Stripe PaymentIntent behind a checkout or charge (refund events name it).
    payment_intent: Mapped[str | None] = mapped_column(String(120), index=True)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    refunded_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    status: Mapped[str] = mapped_column(String(24), default="pending", index=True)
    failure_code: Mapped[str | None] = mapped_column(String(64))
    failure_message: Mapped[str | None] = mapped_column(String(300))
    product: Mapped[str | None] = mapped_column(String(200))
    return_url: Mapped[str | None] = mapped_column(String(2000))
    meta: Mapped[dict | None] = mapped_column(JSONType)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class PaymentEvent(db.Model):
    """An incoming, signature-verified processor event, stored under its unique event id
    in the same transaction as its ledger effect (a replay finds the row and does nothing)."""

    __tablename__ = "payment_events"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    processor: Mapped[str] = mapped_column(String(16))
    event_id: Mapped[str] = mapped_column(String(120), unique=True)
    type: Mapped[str] = mapped_column(String(80))
    payment_id: Mapped[str | None] = mapped_column(String(32), index=True)
    outcome: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict | None] = mapped_column(JSONType)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class BillingProfile(db.Model):
    """The account's customer at a processor and its saved default payment method."""

    __tablename__ = "billing_profiles"
    __table_args__ = (UniqueConstraint("account_id", "processor", name="uq_billing_profiles_account_processor"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    processor: Mapped[str] = mapped_column(String(16))
    customer_id: Mapped[str | None] = mapped_column(String(120))
    payment_method_id: Mapped[str | None] = mapped_column(String(120))
    payment_method_type: Mapped[str | None] = mapped_column(String(32))  # card | us_bank_account
    brand: Mapped[str | None] = mapped_column(String(40))
    last4: Mapped[str | None] = mapped_column(String(4))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)










class SavedMethod(db.Model):
    """A payment method the account saved with a processor (``POST /api/pay/method``); the
    billing profile names the default one."""

    __tablename__ = "saved_methods"
    __table_args__ = (UniqueConstraint("account_id", "processor", "payment_method_id", name="uq_saved_methods"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    processor: Mapped[str] = mapped_column(String(16))
    payment_method_id: Mapped[str] = mapped_column(String(120))
    payment_method_type: Mapped[str] = mapped_column(String(32))
    brand: Mapped[str | None] = mapped_column(String(40))
    last4: Mapped[str | None] = mapped_column(String(4))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ExternalCredit(db.Model):
    """The one book of outside money: every credit that came from outside (a Stripe payment
    intent or checkout, an on-chain USDC transfer, an x402 authorization, an ACH debit) is
    recorded once under ``ref``, a reference shared by all rails (``stripe:pi_…``,
    ``chain:<chain>:<tx>:<log index>``, ``x402:<chain>:<payer>:<nonce>``), in the same
    transaction as its ledger posting (``ledger_ref``). The unique ``ref`` is what makes a
    second credit of the same money impossible, whichever rail sees it second."""

    __tablename__ = "external_credits"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    ref: Mapped[str] = mapped_column(String(200), unique=True)
    rail: Mapped[str] = mapped_column(String(16))  # stripe | sandbox | chain | x402
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    mode: Mapped[str] = mapped_column(String(8), default="live")
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    ledger_ref: Mapped[str] = mapped_column(String(200))
    payment_id: Mapped[str | None] = mapped_column(String(32))
    meta: Mapped[dict | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
