"""Housekeeping jobs."""
from __future__ import annotations


def flush_last_used() -> int:
    """Flush this process's buffered key ``last_used_at`` values."""
    from app import auth

    return auth.flush_last_used()


def ping(value: str = "pong") -> str:
    """A trivial job used to check that the queue and a worker are alive."""
    return value
