"""Payouts (app/services/billing/payouts.py): where an owner's settled module earnings go,
and each payout of them as money."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, UTCDateTime, utcnow


class PayoutDestination(db.Model):
    """An account's payout destination: ``kind`` ``stripe_connect`` (``target`` = the
    Connect account id) or ``usdc`` (``target`` = the address on ``chain``). Without one,
    settled earnings stay as balance."""

    __tablename__ = "payout_destinations"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), unique=True)
    kind: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(120))
    chain: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Payout(db.Model):
    """One payout of ``amount_micros`` from ``payable:<account>`` to the destination it was
    sent to. ``status``: ``pending`` → ``sending`` (attempt ``attempts`` asked of the
    processor, with the idempotency key ``payout:<id>:<attempts>``) → ``paid`` (one ledger
    posting, ref ``payout:<id>``) | ``failed`` (owed; retried from ``next_attempt_at``) |
    ``canceled`` (the owner removed the destination; still owed as balance). At most one
    open (pending, sending, failed) per account. A USDC payout's attempt is one signed
    transaction (``tx_*``: the payout wallet, its nonce, the hash, the raw bytes), stored
    with the ``sending`` claim before the chain is asked."""

    __tablename__ = "payouts"
    __table_args__ = (
        Index("uq_payouts_open", "account_id", unique=True,
              postgresql_where=text("status IN ('pending', 'sending', 'failed')")),
        Index("ix_payouts_account", "account_id", "created_at"),
        Index("ix_payouts_due", "next_attempt_at", postgresql_where=text("status IN ('pending', 'sending', 'failed')")),
        Index("uq_payouts_tx_hash", "tx_hash", unique=True, postgresql_where=text("tx_hash IS NOT NULL")),
        Index("uq_payouts_tx_nonce", "chain", "tx_from", "tx_nonce", unique=True,
              postgresql_where=text("tx_nonce IS NOT NULL")),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(120))
    chain: Mapped[str | None] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    processor_ref: Mapped[str | None] = mapped_column(String(200), unique=True)
    failure_code: Mapped[str | None] = mapped_column(String(64))
    failure_message: Mapped[str | None] = mapped_column(String(300))
    ledger_txn_id: Mapped[int | None] = mapped_column(BigInteger)
    tx_from: Mapped[str | None] = mapped_column(String(42))
    tx_nonce: Mapped[int | None] = mapped_column(BigInteger)
    tx_hash: Mapped[str | None] = mapped_column(String(66))
    tx_raw: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    paid_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
