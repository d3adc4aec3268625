"""Module calls: the call log (one row per charged call) and Idempotency-Key records."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Index, Integer, String, Text, UniqueConstraint, literal_column, text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, JSONType, UTCDateTime, utcnow

# The calls in flight: the predicate of the partial indexes (migration 0023). Queries use
# ``IS_PENDING`` (below), with the status as a SQL literal — a prepared (generic) plan on
# PostgreSQL can prove the indexes' predicate from a literal, not from a bound parameter.
PENDING_SQL = "status = 'pending'"


class ModuleCall(db.Model):
    """One metered call. Written ``pending`` in the charging transaction, then finalized
    ``succeeded`` (provider answered 2xx/4xx) or ``refunded`` (provider failed, or the
    sweep found it still pending after ``deadline_at``). The call stores its own price,
    so catalog price changes never rewrite history. Call-log retention
    (``CALL_LOG_RETENTION_MONTHS``) drops whole old months.

    Partitioned by month on ``created_at`` (migration 0018; ``platform.partitions``),
    so the database's primary key is ``(id, created_at)``; the mapper keeps ``id`` as the
    identity (ids are unique: 119 random bits; ``call:<id>`` is unique in ``ledger_transactions``)."""

    __tablename__ = "module_calls"
    __table_args__ = (
        # only the calls in flight (migration 0023): the usage roll's oldest open call, the sweep
        Index("ix_module_calls_pending_created", "created_at", postgresql_where=text(PENDING_SQL)),
        Index("ix_module_calls_pending_deadline", "deadline_at", postgresql_where=text(PENDING_SQL)),
        Index("ix_module_calls_account_created", "account_id", "created_at"),
        Index("ix_module_calls_created_at", "created_at"),  # the usage rollup job
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # call_…
    account_id: Mapped[str] = mapped_column(String(32))
    module_id: Mapped[int] = mapped_column(Integer)
    module_slug: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    mode: Mapped[str] = mapped_column(String(8), default="live")  # live | test
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | succeeded | refunded
    price_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    charged: Mapped[bool] = mapped_column(Boolean, default=False)  # a ledger debit was posted
    owner_agent_id: Mapped[str | None] = mapped_column(String(32))  # not looked up: no index
    idempotency_key: Mapped[str | None] = mapped_column(String(128))
    # The key whose spend limit this call was reserved against (``spend.release`` on refund).
    spend_key_id: Mapped[str | None] = mapped_column(String(32))
    # The start of the limit period the reservation was counted in: the refund gives it
    # back THERE, even if the key's period changed since (money engine, gw_spend_release).
    spend_reserved_from: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The member whose monthly budget counter (``member_spend``) this charge was counted in
    # (an organisation key's member; NULL: none): given back to the month of ``created_at``.
    budget_member_id: Mapped[str | None] = mapped_column(String(32))
    # Who acted (the API key or session id); ``account_id`` is the account that pays.
    actor: Mapped[str | None] = mapped_column(String(64))
    ok: Mapped[bool | None] = mapped_column(Boolean)
    provider_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(32))  # provider_error | provider_timeout | swept
    receipt: Mapped[dict | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deadline_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


IS_PENDING = ModuleCall.__table__.c.status == literal_column("'pending'")


class IdempotencyRecord(db.Model):
    """``Idempotency-Key`` of one account: inserted (``in_flight``) in the charging
    transaction — the unique constraint, not a prior read, decides who owns the key —
    then ``done`` with the exact response body, kept until ``expires_at`` (24 h)."""

    __tablename__ = "idempotency_records"
    # fillfactor 40 (PostgreSQL, migration 0026): room on each page for the finalize's
    # rewrite with the stored response, so it is a HOT update (no new index entries)
    __table_args__ = (UniqueConstraint("account_id", "key", name="uq_idempotency_records_account_key"),
                      {"postgresql_with": {"fillfactor": 40}})

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(32))
    key: Mapped[str] = mapped_column(String(128))
    request_hash: Mapped[str] = mapped_column(String(64))
    call_id: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="in_flight")  # in_flight | done
    response_body: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
