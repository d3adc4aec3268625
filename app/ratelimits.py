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

import logging
import math
import time

from flask import current_app, g, request
from limits import parse_many

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
_hits_scripts: dict = {}  # Redis client (process-wide, one per URL) -> its registered script


def _redis_hits(client, key: str, items: list) -> list[tuple]:
    """Count this request in every limit's current fixed window with ONE command: the
    ``_HITS_LUA`` script (``EVALSHA``; redis-py loads it on ``NOSCRIPT``), atomic like the
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
    script = _hits_scripts.get(client)
    if script is None:
        script = _hits_scripts[client] = client.register_script(_HITS_LUA)
    counts = script(keys=keys, args=ttls)
    return [(item, item.amount - int(count), max(0, math.ceil(end - now)))
            for item, count, end in zip(items, counts, ends)]


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
