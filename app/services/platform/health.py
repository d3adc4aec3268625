"""Health: liveness (the process answers) and readiness (database and Redis reachable)."""
from __future__ import annotations

import logging
import time

from sqlalchemy import text

from app.errors import ServiceUnavailable
from app.extensions import db, get_redis

log = logging.getLogger(__name__)


def liveness() -> dict:
    """The process is alive and serving; touches no dependency."""
    return {"status": "ok"}


def _check(name: str, probe) -> dict:
    t0 = time.perf_counter()
    try:
        probe()
        return {"status": "ok", "latency_ms": round((time.perf_counter() - t0) * 1000, 2)}
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        log.warning("readiness: %s unreachable (%s)", name, type(exc).__name__)
        return {"status": "unavailable", "latency_ms": round((time.perf_counter() - t0) * 1000, 2)}


def _database() -> None:
    db.session.execute(text("SELECT 1"))


def readiness() -> dict:
    """Check the database and (when configured) Redis; raise 503 ``service_unavailable``
    naming what is unreachable. The checks are listed in the body either way."""
    checks = {"database": _check("database", _database)}
    redis = get_redis()
    if redis is not None:
        checks["redis"] = _check("redis", redis.ping)
    down = sorted(name for name, c in checks.items() if c["status"] != "ok")
    if down:
        raise ServiceUnavailable(f"Not ready: {', '.join(down)} unreachable.",
                                 headers={"Retry-After": "5"}, extra={"checks": checks})
    return {"status": "ok", "checks": checks}
