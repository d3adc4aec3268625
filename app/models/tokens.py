"""Single-use tokens of every purpose (agent sign-in nonces, wallet-connect nonces,
sign-up links, newsletter confirmations): one table, one consumption rule
(app/services/platform/tokens.py)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, JSONType, UTCDateTime, utcnow


class SingleUseToken(db.Model):
    """One issued token. Only ``token_hash`` (SHA-256 of the token text) is stored, never
    the token. ``subject`` names what the token is for (an e-mail address, a subscription
    id, ``<account>:<chain>:<address>``); ``data`` holds the purpose's extra facts. Used
    once: ``used_at`` is set by one conditional UPDATE, and only while ``expires_at`` is
    in the future."""

    __tablename__ = "single_use_tokens"
    __table_args__ = (Index("ix_single_use_tokens_purpose_subject", "purpose", "subject"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    purpose: Mapped[str] = mapped_column(String(32))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    subject: Mapped[str | None] = mapped_column(String(200))
    data: Mapped[dict | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
