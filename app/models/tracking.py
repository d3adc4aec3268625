"""Product-analytics events posted to ``/api/track`` (SPEC endpoints 27–30)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.extensions import db
from app.models.base import BigIntPK, JSONType, UTCDateTime, utcnow


class TrackEvent(db.Model):
    """One analytics event. ``account_id`` is set when the event was posted with a valid
    bearer credential. Written with a single INSERT (no ORM round trips) on ingestion."""

    __tablename__ = "track_events"
    __table_args__ = (
        Index("ix_track_events_created_at", "created_at"),
        Index("ix_track_events_event_created", "event", "created_at"),
        Index("ix_track_events_session_created", "session_id", "created_at"),
        Index("ix_track_events_account_created", "account_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    event: Mapped[str] = mapped_column(String(64))
    session_id: Mapped[str | None] = mapped_column(String(128))
    account_id: Mapped[str | None] = mapped_column(String(32))
    props: Mapped[dict | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
