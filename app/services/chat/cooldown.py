"""Provider cool-down for chat failover: shared through Redis when configured, else in-process.

A provider that fails ``CHAT_COOLDOWN_FAILURES`` times within ``CHAT_COOLDOWN_WINDOW``
seconds (connection error, timeout, 429, 5xx) is skipped for ``CHAT_COOLDOWN_SECONDS``.
A 429 or 503 with ``Retry-After`` cools the provider down at once for that many seconds
(capped at ``CHAT_COOLDOWN_SECONDS``). Success does not touch the store (no write on the
hot path); the failure counter simply expires with its window.

Reads stay off the request path too: a worker asks Redis (one MGET) for a provider's
state at most every ``CHAT_COOLDOWN_REFRESH`` seconds and answers from that view in
between, so another worker's cool-down is seen at most that late; a cool-down this worker
starts itself counts at once.
"""
from __future__ import annotations

import logging
import threading
import time

from flask import current_app

from app.extensions import get_redis, redis_key

log = logging.getLogger(__name__)

_lock = threading.Lock()
_local_until: dict[str, float] = {}  # provider -> monotonic time the cool-down ends
_local_failures: dict[str, list[float]] = {}
_view: dict[str, tuple[float, bool]] = {}  # provider -> (monotonic time read from Redis, cooling)


def _key(kind: str, provider: str) -> str:
    return redis_key("chat", kind, provider)


def cooling(providers: list[str]) -> set[str]:
    """The subset of ``providers`` currently cooling down (one MGET with Redis)."""
    if not providers:
        return set()
    r = get_redis()
    now = time.monotonic()
    if r is not None:
        refresh = float(current_app.config.get("CHAT_COOLDOWN_REFRESH", 0) or 0)
        stale = [p for p in providers if p not in _view or now - _view[p][0] >= refresh]
        try:
            if stale:
                values = r.mget([_key("cool", p) for p in stale])
                _view.update({p: (now, v is not None) for p, v in zip(stale, values)})
            return {p for p in providers if _view[p][1]}
        except Exception:  # Redis down: fall back to this process's view
            log.warning("chat cool-down store unavailable; using in-process state")
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
                _view[provider] = (time.monotonic(), True)
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
                _view[provider] = (time.monotonic(), True)
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
        _view.clear()
