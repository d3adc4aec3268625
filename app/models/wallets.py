"""Wallets: connected on-chain wallets, chain-watcher cursors and x402
authorizations (DESIGN §8). Money itself lives only in the ledger; these rows record what
the chains and payers told us, each under a unique id."""
from __future__ import annotations


from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import JSONType, UTCDateTime, utcnow


class Wallet(db.Model):
    """The on-chain wallet connected to an account (one per account; one account per
    address: ``address_key`` is the lower-cased EVM address or the Solana base58 key)."""

    __tablename__ = "wallets"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), unique=True)
    chain: Mapped[str] = mapped_column(String(16))
    address: Mapped[str] = mapped_column(String(64))
    address_key: Mapped[str] = mapped_column(String(64), unique=True)
    connected_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ChainCursor(db.Model):
    """The last block the USDC deposit watcher has fully scanned on a chain."""

    __tablename__ = "chain_cursors"

    chain: Mapped[str] = mapped_column(String(16), primary_key=True)
    last_block: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class X402Authorization(db.Model):
    """An EIP-3009 authorization presented with X-Payment. ``auth_key`` =
    ``<network>:<asset>:<from>:<nonce>`` (lower-case) is unique: inserting it reserves the
    authorization atomically before the call runs, so it can never be used twice."""

    __tablename__ = "x402_authorizations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    auth_key: Mapped[str] = mapped_column(String(200), unique=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    network: Mapped[str] = mapped_column(String(32))
    payer: Mapped[str] = mapped_column(String(64))
    value_atomic: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16), default="reserved")  # reserved | settled | failed | released
    transaction: Mapped[str | None] = mapped_column(String(100))
    error: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # What reconciliation needs to settle or release it later (``x402.reconcile``): the
    # payload as presented, the price it paid for, and its ``validBefore`` (unix seconds).
    payload: Mapped[dict | None] = mapped_column(JSONType)
    price_micros: Mapped[int | None] = mapped_column(BigInteger)
    valid_before: Mapped[int | None] = mapped_column(BigInteger)
    # The resource the payment was presented for (x402 v1 requirements carry it; a
    # settlement retried for another resource is another request). NULL before 0024.
    resource_url: Mapped[str | None] = mapped_column(String(2000))
    # ... and its description as the 402 offered it (v1 requirements carry it too); NULL
    # before 0014: "Module call", what was sent then.
    description: Mapped[str | None] = mapped_column(String(300))
