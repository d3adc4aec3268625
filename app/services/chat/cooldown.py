"""Provider cool-down for chat failover: shared through Redis when configured, else in-process.

A provider that fails ``CHAT_COOLDOWN_FAILURES`` times within ``CHAT_COOLDOWN_WINDOW``
seconds (connection error, timeout, 429, 5xx) is skipped for ``CHAT_COOLDOWN_SECONDS``.
A 429 or 503 with ``Retry-After`` cools the provider down at once for that many seconds
(capped at ``CHAT_COOLDOWN_SECONDS``). Success does not touch the store (no write on the
hot path); the failure counter simply expires with its window.
"""
from __future__ import annotations

import logging
import threading
import time

from flask import current_app

from app.extensions import get_redis

log = logging.getLogger(__name__)

_lock = threading.Lock()
_local_until: dict[str, float] = {}  # provider -> monotonic time the cool-down ends
_local_failures: dict[str, list[float]] = {}


def _key(kind: str, provider: str) -> str:
    return f"{current_app.config.get('RATELIMIT_KEY_PREFIX', 'gw')}:chat:{kind}:{provider}"


def cooling(providers: list[str]) -> set[str]:
    """The subset of ``providers`` currently cooling down (one MGET with Redis)."""
    if not providers:
        return set()
    r = get_redis()
    if r is not None:
        try:
            values = r.mget([_key("cool", p) for p in providers])
            return {p for p, v in zip(providers, values) if v is not None}
        except Exception:  # Redis down: fall back to this process's view
            log.warning("chat cool-down store unavailable; using in-process state")
    now = time.monotonic()
    return {p for p in providers if _local_until.get(p, 0) > now}


def record_failure(provider: str, retry_after: float | None = None) -> None:
    cfg = current_app.config
    cool_for = float(cfg["CHAT_COOLDOWN_SECONDS"])
    threshold = int(cfg["CHAT_COOLDOWN_FAILURES"])
    window = float(cfg["CHAT_COOLDOWN_WINDOW"])
    immediate = min(retry_after, cool_for) if retry_after else None
    r = get_redis()
    if r is not None:
        try:
            if immediate:
                r.set(_key("cool", provider), "1", px=max(1, int(immediate * 1000)))
                return
            fkey = _key("fail", provider)
            pipe = r.pipeline()
            pipe.incr(fkey)
            pipe.expire(fkey, max(1, int(window)), nx=True)
            count = pipe.execute()[0]
            if int(count) >= threshold:
                pipe = r.pipeline()
                pipe.set(_key("cool", provider), "1", px=max(1, int(cool_for * 1000)))
                pipe.delete(fkey)
                pipe.execute()
            return
        except Exception:
            log.warning("chat cool-down store unavailable; using in-process state")
    now = time.monotonic()
    with _lock:
        if immediate:
            _local_until[provider] = max(_local_until.get(provider, 0), now + immediate)
            return
        fails = [t for t in _local_failures.get(provider, []) if t > now - window] + [now]
        if len(fails) >= threshold:
            _local_until[provider] = now + cool_for
            fails = []
        _local_failures[provider] = fails


def reset() -> None:
    """Forget the in-process state (tests; the Redis keys expire on their own)."""
    with _lock:
        _local_until.clear()
        _local_failures.clear()
