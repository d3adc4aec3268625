"""Account and API key models."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, CheckConstraint, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import JSONType, UTCDateTime, utcnow


class Account(db.Model):
    """A customer account (human or agent). ``balance_micros`` caches the live ledger
    balance ``acct:<id>``, ``test_balance_micros`` the test-mode one ``acct_test:<id>``; both
    are only ever changed by ``app.services.money.ledger`` in the same transaction as the
    entries; the CHECK constraints are the last line against overdraft. ``mailbox`` is the
    canonical mailbox of ``email`` (one promotional grant per mailbox)."""

    __tablename__ = "accounts"
    __table_args__ = (CheckConstraint("balance_micros >= 0", name="balance_nonnegative"),
                      CheckConstraint("test_balance_micros >= 0", name="test_balance_nonnegative"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # Stored lower-cased, so uniqueness is case-insensitive. Null for agent accounts.
    email: Mapped[str | None] = mapped_column(String(320), unique=True)
    plan: Mapped[str] = mapped_column(String(16), default="starter")
    kind: Mapped[str] = mapped_column(String(8), default="human")  # human | agent | org
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    agent_id: Mapped[str | None] = mapped_column(String(32), index=True)
    owner_account_id: Mapped[str | None] = mapped_column(String(32), index=True)
    balance_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    test_balance_micros: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    mailbox: Mapped[str | None] = mapped_column(String(320), index=True)
    name: Mapped[str | None] = mapped_column(String(100))  # an organisation's name (kind ``org``)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Bring your own key (docs/chat.md "Bring your own key"): route only to the account's own
    # provider keys; may a failing own key fall back to the platform's keys (model price).
    byok_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    byok_fallback: Mapped[bool] = mapped_column(Boolean, default=False, server_default="false")
    # Auto top-up thresholds cached on the balance row (live / test; NULL: off), so the
    # database notices a balance crossing under one in the charge's own UPDATE
    # (trigger gw_accounts_autotopup, app/services/billing/autotopup.py).
    topup_below_micros: Mapped[int | None] = mapped_column(BigInteger)
    test_topup_below_micros: Mapped[int | None] = mapped_column(BigInteger)


class ApiKey(db.Model):
    """An API key. Only the SHA-256 of the secret is stored; ``prefix`` is for display.
    ``spend_limit_micros``/``spend_limit_period`` (day|week|month|total, UTC) cap what the
    key may spend (counted in ``key_spend``); ``expires_at`` ends it like a revocation
    (rotation sets it on the old key)."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(24))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    mode: Mapped[str] = mapped_column(String(8), default="live")  # live | test
    scopes: Mapped[list] = mapped_column(JSONType, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    spend_limit_micros: Mapped[int | None] = mapped_column(BigInteger)
    spend_limit_period: Mapped[str | None] = mapped_column(String(8))  # day | week | month | total
    rotated_to: Mapped[str | None] = mapped_column(String(32))  # the key that replaced this one
    # An organisation key: ``account_id`` is the organisation (it pays), this is the member
    # who owns the key (their role there decides what it may do). Null: a personal key.
    member_account_id: Mapped[str | None] = mapped_column(String(32), index=True)
    # Per-key controls (docs/keys.md "Per-key controls"): allow-lists (null: any) and
    # requests / tokens per minute (null: no limit beyond the plan's).
    allowed_models: Mapped[list | None] = mapped_column(JSONType)
    allowed_modules: Mapped[list | None] = mapped_column(JSONType)
    rpm_limit: Mapped[int | None] = mapped_column(Integer)
    tpm_limit: Mapped[int | None] = mapped_column(Integer)


class KeySpend(db.Model):
    """What one key spent in one limit period (``period_start``: UTC start of the day, ISO
    week, month, or 1970-01-01 for ``total``). Changed only by ``app.services.money.spend``
    with one conditional statement per reserve/release (no overshoot under concurrency)."""

    __tablename__ = "key_spend"
    __table_args__ = (CheckConstraint("spent_micros >= 0", name="spent_nonnegative"),)

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    spent_micros: Mapped[int] = mapped_column(BigInteger, default=0)
