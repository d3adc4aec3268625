"""Every rate limit of the service, one mechanism: named limits read from config.py at
request time (Flask-Limiter syntax, e.g. ``"5/minute;30/hour"``; the names and defaults
are listed and explained in config.py's rate-limit section).

* ``per_ip(name)``: a route decorator, ``config[name]`` per client IP (after ProxyFix);
* ``per_email(name)``: a route decorator, ``config[name]`` per e-mail address in the body;
* ``per_credential(principal)``: the plan's limit (``PLANS[plan]["rate_limit"]``) per
  API key or session, applied by ``@authenticated`` (app.auth).

Storage is Flask-Limiter's (Redis when REDIS_URL is set, so every worker and node shares
the counters); the per-credential limit counts all its windows in one Redis round trip.
A breach is 429 ``rate_limited`` with ``Retry-After`` (app.errors).
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time

from flask import current_app, g, request
from limits import parse_many
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.errors import RateLimited
from app.extensions import limiter, redis_for
from app.ids import sha256_hex

log = logging.getLogger(__name__)


def _email_key() -> str:
    """The normalised e-mail of the JSON body (hashed), or the client IP without one."""
    data = request.get_json(silent=True, cache=True)
    email = data.get("email") if isinstance(data, dict) else None
    if isinstance(email, str) and 0 < len(email) <= 320:
        return "email:" + sha256_hex(email.strip().lower())[:32]
    return "ip:" + (request.remote_addr or "unknown")


def per_ip(config_name: str):
    """Decorator: the limit in ``config[config_name]`` per client IP."""
    return limiter.limit(lambda: current_app.config[config_name],
                         error_message=lambda: f"{current_app.config[config_name]} per client IP")


def per_email(config_name: str):
    """Decorator: the limit in ``config[config_name]`` per e-mail address in the body."""
    return limiter.limit(lambda: current_app.config[config_name], key_func=_email_key,
                         error_message=lambda: f"{current_app.config[config_name]} per e-mail address")


# --- per credential: the plan's limit ---------------------------------------------------

_parsed_limits: dict[str, list] = {}


def per_credential(principal) -> None:
    """Per-credential limit from the plan table: fixed windows (Flask-Limiter's default
    strategy), counted in Redis in production, so every worker and node shares them.

    With Redis (``RATELIMIT_STORAGE_URI`` ``redis://…``) this is ONE round trip for all
    the plan's limits (``_redis_hits``); otherwise the ``limits`` library's storage
    (memory in the embedded default). A breach is 429 ``rate_limited`` with
    ``Retry-After``; a passing request gets ``RateLimit-*`` headers for the plan's first
    limit. When the storage is unreachable the request is allowed (fail open, logged)."""
    app = current_app
    if not app.config.get("RATELIMIT_ENABLED", True):
        return
    spec = app.config["PLANS"].get(principal.plan, {}).get("rate_limit")
    if not spec:
        return
    items = _parsed_limits.get(spec)
    if items is None:
        items = _parsed_limits[spec] = parse_many(spec)
    try:
        client = redis_for(app.config.get("RATELIMIT_STORAGE_URI") or "")
        if client is not None:
            prefix = app.config.get("RATELIMIT_KEY_PREFIX") or "gw"
            windows = _redis_hits(client, f"{prefix}:plan:{principal.credential_id}", items)
        else:
            windows = _storage_hits(("cred", principal.credential_id), items)
    except RateLimited:
        raise
    except Exception:  # storage down: fail open (documented), calls keep working
        log.warning("rate limit storage unavailable; allowing request")
        return
    for item, remaining, reset in windows:
        if remaining < 0:
            retry = max(1, reset)
            raise RateLimited(
                f"Rate limit of {item} exceeded for this credential.",
                headers={"Retry-After": str(retry), "RateLimit-Limit": str(item.amount),
                         "RateLimit-Remaining": "0", "RateLimit-Reset": str(retry)},
            )
    first, remaining, reset = windows[0]
    g.ratelimit_headers = {"RateLimit-Limit": str(first.amount),
                           "RateLimit-Remaining": str(remaining), "RateLimit-Reset": str(reset)}


# Counts one request in each window (KEYS: the windows' counter keys, ARGV: their TTLs):
# INCR, and EXPIRE … NX so a window's counter is never extended. One command, one reply.
_HITS_LUA = """
local counts = {}
for i, key in ipairs(KEYS) do
  counts[i] = redis.call('INCR', key)
  redis.call('EXPIRE', key, ARGV[i], 'NX')
end
return counts
"""
_HITS_SHA = hashlib.sha1(_HITS_LUA.encode()).hexdigest()
_threads = threading.local()  # this thread's own Redis connections: {client: (pid, connection)}


def _redis_hits(client, key: str, items: list) -> list[tuple]:
    """Count this request in every limit's current fixed window with ONE command: the
    ``_HITS_LUA`` script (``EVALSHA``, loaded on ``NOSCRIPT``: ``_evalsha``), atomic like the
    former ``MULTI``/``EXEC`` of ``INCR`` + ``EXPIRE … NX`` per limit, but one reply to
    parse instead of 2 + 2 per limit. The key names the window's start, so a window's
    counter is never extended. Returns ``(item, remaining, reset_seconds)`` per limit;
    ``remaining < 0`` means the limit is exceeded."""
    now = time.time()
    keys, ttls, ends = [], [], []
    for item in items:
        window = item.get_expiry()
        start = int(now // window) * window
        keys.append(f"{key}:{item.amount}/{window}:{start}")
        ttls.append(window + 1)
        ends.append(start + window)
    counts = _evalsha(client, ("EVALSHA", _HITS_SHA, len(keys), *keys, *ttls))
    return [(item, item.amount - int(count), max(0, math.ceil(end - now)))
            for item, count, end in zip(items, counts, ends)]


def _evalsha(client, command: tuple):
    """Send ``command`` (an ``EVALSHA`` of ``_HITS_LUA``) on this thread's own connection
    to ``client``'s server and return the reply. The connection is made from the
    client's pool settings and kept by the thread, so a request skips redis-py's command
    path (pool checkout and return, retry wrapper, response callbacks: ~70 µs of CPU per
    call measured here; the raw send and read cost ~60 µs). A server without the script
    (restart, ``SCRIPT FLUSH``) gets it loaded and the command sent again; a connection
    that broke (server restart, timeout) is dropped and the command sent once more on a
    new one; any other error propagates (``per_credential`` then fails open)."""
    conns = _threads.__dict__.setdefault("conns", {})
    pid = os.getpid()
    held = conns.get(client)
    if held is None or held[0] != pid:  # new thread, or a connection inherited through fork
        held = conns[client] = (pid, client.connection_pool.make_connection())
    conn = held[1]
    retried = loaded = False
    while True:
        try:
            conn.send_command(*command)
            return conn.read_response()
        except NoScriptError:
            if loaded:
                raise
            loaded = True
            conn.send_command("SCRIPT", "LOAD", _HITS_LUA)
            conn.read_response()
        except (RedisConnectionError, RedisTimeoutError):
            conn.disconnect()
            if retried:
                raise
            retried = True


def _storage_hits(key: tuple, items: list) -> list[tuple]:
    """The same through Flask-Limiter's storage (memory in the embedded default): stops
    counting at the first exceeded limit, like the Redis path reports it first."""
    strategy = limiter.limiter
    out = []
    for item in items:
        allowed = strategy.hit(item, *key)
        stats = strategy.get_window_stats(item, *key)
        reset = max(0, math.ceil(stats.reset_time - time.time()))
        out.append((item, stats.remaining if allowed else -1, reset))
        if not allowed:
            break
    return out


# --- Flask-Limiter's per-request check, skipped where it has nothing to count -------------

# The hot routes carry no ``per_ip`` / ``per_email`` limit (their limit is the plan's, by
# ``per_credential``), so Flask-Limiter's before-request check (resolving and evaluating
# the route's limits, ~4% of a metered call's CPU) has nothing to do there.
NO_IP_LIMIT_ENDPOINTS = frozenset({"modules.ModuleCallView", "chat.ChatCompletionsView"})
limiter.skip_endpoints = NO_IP_LIMIT_ENDPOINTS
