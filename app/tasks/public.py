"""Housekeeping of the public endpoints: analytics retention (sign-up and newsletter
tokens are purged with every single-use token by ``app.tasks.tokens.purge``)."""
from __future__ import annotations


def prune() -> dict:
    """Delete events older than TRACK_RETENTION_DAYS."""
    from app.services.public import tracking

    return {"track_events": tracking.prune()}
