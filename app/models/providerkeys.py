"""Provider keys (bring your own key): an owner's own API key for a chat provider."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import UTCDateTime, utcnow


class ProviderKey(db.Model):
    """An owner's key for one provider of the chat catalog, encrypted at rest
    (``ciphertext``: PyNaCl SecretBox under ``BYOK_ENCRYPTION_KEY``, nonce included); only
    ``prefix`` is ever shown. ``owner_kind`` / ``owner_id``: the payer whose completions use
    it — ``account`` today; an organisation (issue 37) is another kind of the same payer.
    One key per owner and provider."""

    __tablename__ = "provider_keys"
    __table_args__ = (UniqueConstraint("owner_kind", "owner_id", "provider", name="uq_provider_keys_owner"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # pkey_…
    owner_kind: Mapped[str] = mapped_column(String(8), default="account")
    owner_id: Mapped[str] = mapped_column(String(32), index=True)
    provider: Mapped[str] = mapped_column(String(64))
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
