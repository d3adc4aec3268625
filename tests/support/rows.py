"""Test-side edits of stored rows that no API makes (ageing what a test needs expired)."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app.extensions import db
from app.models.base import utcnow


def expire(app, model, *where, ago: timedelta = timedelta(seconds=1)) -> None:
    """Move ``expires_at`` of the rows of ``model`` (those matching ``where``, else all)
    ``ago`` into the past, committed."""
    with app.app_context():
        db.session.execute(update(model).where(*where).values(expires_at=utcnow() - ago))
        db.session.commit()
        db.session.remove()
