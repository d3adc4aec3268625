"""Invoices (docs/payments.md "Invoices"): one numbered, immutable document per payment and per
account's month of usage, numbered gap-free per seller and series by ``invoice_counters``;
the buyer's billing details that invoices copy when they are issued."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import JSONType, UTCDateTime, utcnow


class Invoice(db.Model):
    """An issued invoice. Never updated nor deleted (trigger ``gw_invoices_append_only``,
    the ledger's ``gw_ledger_append_only``). ``document`` is the whole content (seller,
    buyer, lines, totals) as issued; the PDF is rendered from it. ``kind``: ``payment``
    (``payment_id`` set, unique) or ``usage`` (``period`` ``YYYY-MM``, unique per account
    and mode) or ``credit_note`` (a refund of an invoiced payment: ``credits_invoice_id`` names the
    invoice, ``payment_id`` the payment). ``series``: ``live`` or ``test`` (test-mode play money
    has its own numbers), ``cn_live`` or ``cn_test`` for credit notes."""

    __tablename__ = "invoices"
    __table_args__ = (
        UniqueConstraint("seller", "series", "seq", name="uq_invoices_number"),
        Index("uq_invoices_payment", "payment_id", unique=True,
              postgresql_where=text("payment_id IS NOT NULL AND kind = 'payment'")),
        Index("ix_invoices_credits", "credits_invoice_id", postgresql_where=text("credits_invoice_id IS NOT NULL")),
        Index("uq_invoices_usage_period", "account_id", "mode", "period", unique=True,
              postgresql_where=text("kind = 'usage'")),
        Index("ix_invoices_account", "account_id", "mode", "seq"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seller: Mapped[str] = mapped_column(String(32))
    series: Mapped[str] = mapped_column(String(8))
    seq: Mapped[int] = mapped_column(BigInteger)
    number: Mapped[str] = mapped_column(String(40))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    mode: Mapped[str] = mapped_column(String(8))
    kind: Mapped[str] = mapped_column(String(16))
    payment_id: Mapped[str | None] = mapped_column(String(32))
    period: Mapped[str | None] = mapped_column(String(7))
    credits_invoice_id: Mapped[str | None] = mapped_column(ForeignKey("invoices.id"))
    currency: Mapped[str] = mapped_column(String(3))
    total_micros: Mapped[int] = mapped_column(BigInteger)
    document: Mapped[dict] = mapped_column(JSONType)
    issued_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class InvoiceCounter(db.Model):
    """The last number issued per seller and series. Incremented by an upsert in the unit of
    work that inserts the invoice: the row stays locked until it commits, and a rollback
    takes the number back — no gaps (a sequence would leave one)."""

    __tablename__ = "invoice_counters"

    seller: Mapped[str] = mapped_column(String(32), primary_key=True)
    series: Mapped[str] = mapped_column(String(8), primary_key=True)
    last_number: Mapped[int] = mapped_column(BigInteger)


class BillingDetails(db.Model):
    """What an account wants on its invoices (``/api/account/billing-details``); copied into
    each invoice when it is issued, so a later change never alters an issued one."""

    __tablename__ = "billing_details"

    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    address: Mapped[str | None] = mapped_column(String(1000))
    country: Mapped[str | None] = mapped_column(String(2))
    tax_id: Mapped[str | None] = mapped_column(String(64))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
