"""Agents: identities (ed25519), sessions, module submissions and
monthly settlement statements (DESIGN §6)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import JSONType, UTCDateTime, utcnow


class Agent(db.Model):
    """A non-human caller. ``pubkey`` is the canonical ``ed25519:<base58 of 32 bytes>``;
    ``account_id`` is the agent's own account (``Account.agent_id`` points back);
    ``owner_account_id`` the account that owns it (the registering credential's account, or
    the organisation it was registered for). ``webhook_secret`` (``whsec_…``)
    signs the events sent to ``webhook`` (Standard Webhooks); it has to be stored
    retrievably to sign, like any webhook signing secret."""

    __tablename__ = "agents"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    pubkey: Mapped[str] = mapped_column(String(64), unique=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), unique=True)
    owner_account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    # The mode of the key that registered it; its sessions act in this mode.
    mode: Mapped[str] = mapped_column(String(8), default="live", server_default="live")
    webhook: Mapped[str | None] = mapped_column(String(2000))
    webhook_secret: Mapped[str] = mapped_column(String(64))
    # The person whose credential registered it (an organisation's agent: the member; NULL
    # for agents registered before this was recorded). Removing that member disables it.
    registered_by: Mapped[str | None] = mapped_column(String(32))
    # Set once by ``agents.disable``: sign-in refused, sessions revoked, balance returned.
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    __table_args__ = (
        Index("ix_agents_registered_by", "owner_account_id", "registered_by",
              postgresql_where=text("registered_by IS NOT NULL AND disabled_at IS NULL")),
        Index("ix_agents_disabled", "disabled_at", postgresql_where=text("disabled_at IS NOT NULL")),
    )


class AgentSession(db.Model):
    """A ``svc_sess_`` session of an agent; only the SHA-256 of the token is stored."""

    __tablename__ = "agent_sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class ModuleSubmission(db.Model):
    """An agent-built module submitted for review. ``pending_slug`` equals ``slug`` while
    the submission is ``pending_review`` and is NULL afterwards: its unique constraint
    makes "at most one pending submission per slug" hold under concurrency.
    ``webhook_secret`` is the Standard Webhooks secret the gateway signs forwarded calls
    with once approved (shown to the owning agent and its owner account only)."""

    __tablename__ = "module_submissions"
    __table_args__ = (Index("ix_module_submissions_agent_created", "agent_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"))
    slug: Mapped[str] = mapped_column(String(64), index=True)
    pending_slug: Mapped[str | None] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    price_cents: Mapped[int] = mapped_column(Integer)
    actions: Mapped[list] = mapped_column(JSONType)
    webhook: Mapped[str] = mapped_column(String(2000))
    webhook_secret: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="pending_review")  # | approved | rejected
    review_notes: Mapped[str | None] = mapped_column(Text)
    reviewed_by: Mapped[str | None] = mapped_column(String(120))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    reviewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AgentSettlement(db.Model):
    """A monthly settlement statement: ``amount_micros`` moved from ``earnings:<agent>``
    by ledger transaction ``ledger_txn_id`` (ref ``settle:<agent>:<YYYY-MM>``), written in
    that same database transaction: to the agent account's balance, less what repaid the
    carry-over (that transaction's leg on ``carry:<agent>``; ``earnings._statements``)."""

    __tablename__ = "agent_settlements"
    __table_args__ = (UniqueConstraint("agent_id", "month", name="uq_agent_settlements_agent_month"),
                      UniqueConstraint("owner_account_id", "month", name="uq_agent_settlements_owner_month"),
                      CheckConstraint("(agent_id IS NULL) <> (owner_account_id IS NULL)",
                                      name="ck_agent_settlements_one_owner"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # the earner: an agent, or an account (or organisation) owning a catalog module
    agent_id: Mapped[str | None] = mapped_column(ForeignKey("agents.id"), index=True)
    owner_account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"))
    month: Mapped[str] = mapped_column(String(7))  # YYYY-MM
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    ledger_txn_id: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
