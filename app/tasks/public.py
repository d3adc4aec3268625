"""Housekeeping of the public endpoints: analytics retention, stale sign-up requests."""
from __future__ import annotations


def prune() -> dict:
    """Delete events older than TRACK_RETENTION_DAYS and long-expired sign-up requests."""
    from app.services.accounts import signup
    from app.services.public import tracking

    return {"track_events": tracking.prune(), "signup_requests": signup.prune()}
