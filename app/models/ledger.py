"""Double-entry ledger: append-only transactions and their entries (DESIGN §3)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, JSONType, UTCDateTime, utcnow


class LedgerTransaction(db.Model):
    """One balanced posting. ``ref`` (unique when set) makes a posting idempotent:
    e.g. ``stripe:evt_…``, ``settle:<agent>:2026-10``, ``call:<call_id>``."""

    __tablename__ = "ledger_transactions"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))  # a filter on headers reached by id (no index)
    ref: Mapped[str | None] = mapped_column(String(160), unique=True)
    account_id: Mapped[str | None] = mapped_column(String(32))  # the payer: a record, not a lookup
    actor: Mapped[str | None] = mapped_column(String(64))  # who acted (key / session id), when known
    meta: Mapped[dict | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class LedgerEntry(db.Model):
    """One leg of a transaction. ``ledger_account`` is a named ledger account code:
    ``acct:<account_id>`` (customer balance, cached on accounts.balance_micros),
    ``revenue:platform``, ``earnings:<agent_id>`` (owner earnings payable),
    ``promo:grants``, ``external:<source>`` (card, ach, usdc, sandbox …).

    PostgreSQL: partitioned by month on ``created_at`` (migration 0018), primary key
    ``(id, created_at)`` in the database, ``id`` from one sequence. The exactly-once
    guarantee (unique ``ref``) lives on the unpartitioned ``ledger_transactions``. Never
    dropped by retention."""

    __tablename__ = "ledger_entries"
    __table_args__ = (Index("ix_ledger_entries_account_created", "ledger_account", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    txn_id: Mapped[int] = mapped_column(ForeignKey("ledger_transactions.id"), index=True)
    ledger_account: Mapped[str] = mapped_column(String(64))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
