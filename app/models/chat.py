"""Chat completions: one row per billed (or sandbox) completion, from hold to settlement."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import UTCDateTime, utcnow


class ChatCompletion(db.Model):
    """``status``: ``held`` (estimated maximum held, upstream call in progress — a row left
    in this state by a crash is released by the stale-hold sweep), ``settled`` (charged
    ``cost_micros``, rest of the hold returned), ``released`` (nothing charged: every
    candidate failed, the upstream rejected the request, or the sweep released it),
    ``sandbox`` (test-mode key: nothing charged). Ledger refs: ``chat_hold:<id>`` and
    ``chat_settle:<id>`` (settle and release share the ref, so only one can ever post). Call-log
    retention (``CALL_LOG_RETENTION_MONTHS``) drops whole old months.

    Partitioned by month on ``created_at`` (migration 0018; ``platform.partitions``),
    so the database's primary key is ``(id, created_at)``; the mapper keeps ``id`` as the
    identity (ids are unique: random; the refs above are unique in ``ledger_transactions``)."""

    __tablename__ = "chat_completions"
    __table_args__ = (
        Index("ix_chat_completions_status_created", "status", "created_at"),
        Index("ix_chat_completions_account_created", "account_id", "created_at"),
        Index("ix_chat_completions_settled_at", "settled_at"),  # usage rollups
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # chatcmpl-…
    account_id: Mapped[str] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(8), default="live")
    requested_model: Mapped[str] = mapped_column(String(96))
    model: Mapped[str | None] = mapped_column(String(96))  # the model actually used
    provider: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="held")
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    hold_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    # The key whose spend limit the hold was reserved against (settle/release give room back).
    spend_key_id: Mapped[str | None] = mapped_column(String(32))
    # The start of the limit period the hold was counted in (settle/release give back there).
    spend_reserved_from: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The member whose monthly budget counter (``member_spend``) this charge was counted in
    # (an organisation key's member; NULL: none): given back to the month of ``created_at``.
    budget_member_id: Mapped[str | None] = mapped_column(String(32))
    # Who acted (the API key or session id); ``account_id`` is the account that pays.
    actor: Mapped[str | None] = mapped_column(String(64))
    cost_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    usage_estimated: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(String(300))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Last sign of life of the request holding the money (a stream extends it while it
    # runs); the stale-hold sweep only releases holds whose request stopped beating.
    alive_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Bring your own key: the provider key that served the completion (null: the platform's);
    # then ``cost_micros`` is the platform fee and ``list_cost_micros`` the cost at the model's
    # price, which the customer's provider bills the customer directly. Written before the
    # settle (``app.services.chat.byok.mark``), so a settled BYOK row always carries them.
    byok_key_id: Mapped[str | None] = mapped_column(String(32))
    list_cost_micros: Mapped[int | None] = mapped_column(BigInteger)
