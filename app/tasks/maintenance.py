"""Housekeeping jobs."""
from __future__ import annotations


def flush_last_used() -> int:
    """Flush this process's buffered key ``last_used_at`` values."""
    from app import auth

    return auth.flush_last_used()


def ping(value: str = "pong") -> str:
    """A trivial job used to check that the queue and a worker are alive."""
    return value


HEARTBEAT_TTL = 24 * 3600


def _heartbeat_key() -> str:
    from app.extensions import redis_key

    return redis_key("worker-heartbeat")


def heartbeat() -> float | None:
    """Record in Redis that a worker ran a scheduled job now (Unix time; read by
    ``/metrics`` as ``gateway_worker_heartbeat_timestamp_seconds``). No-op without Redis."""
    import time

    from app.extensions import get_redis

    redis = get_redis()
    if redis is None:
        return None
    now = time.time()
    redis.set(_heartbeat_key(), repr(now), ex=HEARTBEAT_TTL)
    return now


def last_heartbeat() -> float | None:
    """Unix time of the last ``heartbeat`` job, or None (never ran, or no Redis)."""
    from app.extensions import get_redis

    redis = get_redis()
    if redis is None:
        return None
    raw = redis.get(_heartbeat_key())
    return float(raw) if raw else None


def ensure_partitions() -> list[str]:
    """Create the coming months' partitions of the call log and ledger legs (PostgreSQL)."""
    from app.services.platform import partitions

    return partitions.ensure_ahead()


def call_log_retention() -> list[str]:
    """Drop call-log months older than ``CALL_LOG_RETENTION_MONTHS`` (never the ledger)."""
    from app.services.platform import partitions

    return partitions.drop_expired().dropped


def rate_windows_purge() -> int:
    """Delete the PostgreSQL rate counters whose windows have all ended (the embedded
    default's store: app/services/platform/ratecount.py); returns how many."""
    from app.services.platform import ratecount

    return ratecount.purge()
