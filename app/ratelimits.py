"""Every rate limit of the service, one mechanism: named limits read from config.py at
request time (Flask-Limiter syntax, e.g. ``"5/minute;30/hour"``; the names and defaults
are listed and explained in config.py's rate-limit section).

* ``per_ip(name)``: a route decorator, ``config[name]`` per client IP (after ProxyFix);
* ``per_email(name)``: a route decorator, ``config[name]`` per e-mail address in the body;
* ``per_credential(principal)``: the plan's limit (``PLANS[plan]["rate_limit"]``) for the
  credential's account (all its keys and sessions together), applied by
  ``@authenticated`` (app.auth); a refused request does not count;
* ``recipient_allowed(name, email)``: ``config[name]`` per recipient mailbox, for the mail a
  stranger can make us send (``outbox.add_email(throttle=name)``): over it, the mail is not
  sent and the request is answered as usual.

E-mail keys are the canonical mailbox (``accounts.mailbox.canonical``: ``a+1@x`` and
``a+2@x`` are one inbox), hashed.

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


def mailbox_key(email: str) -> str:
    """The hashed canonical mailbox of ``email``: every ``+tag`` and (Gmail) dotted
    spelling of one inbox counts as one recipient."""
    from app.services.accounts.mailbox import canonical

    return sha256_hex(canonical(email))[:32]


def _email_key() -> str:
    """The canonical mailbox of the JSON body's e-mail (hashed), or the client IP without one."""
    data = request.get_json(silent=True, cache=True)
    email = data.get("email") if isinstance(data, dict) else None
    if isinstance(email, str) and 0 < len(email) <= 320:
        return "email:" + mailbox_key(email)
    return "ip:" + (request.remote_addr or "unknown")


def recipient_allowed(config_name: str, email: str) -> bool:
    """Count one mail to ``email``'s mailbox against ``config[config_name]`` (every window)
    in the rate-limit storage (Redis when configured, shared by every worker and node);
    False when a window is full (then nothing is counted in the later windows). Storage
    down: allowed (fail open, logged), like the other limits."""
    app = current_app
    if not app.config.get("RATELIMIT_ENABLED", True):
        return True
    spec = app.config[config_name]
    items = _parsed_limits.get(spec)
    if items is None:
        items = _parsed_limits[spec] = parse_many(spec)
    try:
        windows = _storage_hits(("mail", config_name, mailbox_key(email)), items)
    except Exception:
        log.warning("rate limit storage unavailable; allowing mail")
        return True
    return all(remaining >= 0 for _, remaining, _ in windows)


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
    """The plan's limit (the plan table) for the credential's ACCOUNT: every key, rotated
    key and agent session of one account counts in one set of windows (until 2026-11-27
    each credential had its own, so five keys got five times the plan). Fixed windows
    (Flask-Limiter's default strategy), counted in Redis in production, so every worker
    and node shares them; a refused request is not counted.

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
            windows = _leased_hits(client, f"{prefix}:plan:{principal.account_id}", items,
                                   lease_size(items, app.config.get("RATELIMIT_LEASE_FRACTION", 0)))
        else:
            windows = _storage_hits(("acct", principal.account_id), items)
    except RateLimited:
        raise
    except Exception:  # storage down: fail open (documented), calls keep working
        log.warning("rate limit storage unavailable; allowing request")
        return
    for item, remaining, reset in windows:
        if remaining < 0:
            retry = max(1, reset)
            raise RateLimited(
                f"Rate limit of {item} exceeded for this account (its keys and sessions share it).",
                headers={"Retry-After": str(retry), "RateLimit-Limit": str(item.amount),
                         "RateLimit-Remaining": "0", "RateLimit-Reset": str(retry)},
            )
    first, remaining, reset = windows[0]
    g.ratelimit_headers = {"RateLimit-Limit": str(first.amount),
                           "RateLimit-Remaining": str(remaining), "RateLimit-Reset": str(reset)}


# Counts hits in each window (KEYS: the windows' counter keys; ARGV: the lease size n, then
# per window its TTL, its limit and the hits given back). First a process's unused hits
# of a lease it dropped are given back (DECRBY, never below zero) to the windows that
# have not ended; then it grants g = the smallest room left under any window's limit, at
# most n, and adds g to every counter (INCRBY, then EXPIRE … NX so a window's counter is
# never extended). With no room (g < 1) nothing is added: a refused request does not use
# up the window (until 2026-11-27 it did, so a client retrying too fast starved itself).
# Atomic, one command, one reply: the counts after the increment, then g (0: refused).
# With n = 1 and nothing given back it is the plain per-request INCR.
_HITS_LUA = """
local n = tonumber(ARGV[1])
local grant = n
for i, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  local back = math.min(tonumber(ARGV[3 * i + 1]), count)
  if back > 0 then count = redis.call('DECRBY', key, back) end
  local room = tonumber(ARGV[3 * i]) - count
  if room < grant then grant = room end
end
local out = {}
for i, key in ipairs(KEYS) do
  if grant < 1 then
    out[i] = tonumber(redis.call('GET', key) or '0')
  else
    out[i] = redis.call('INCRBY', key, grant)
    redis.call('EXPIRE', key, ARGV[3 * i - 1], 'NX')
  end
end
if grant < 1 then grant = 0 end
out[#KEYS + 1] = grant
return out
"""
_HITS_SHA = hashlib.sha1(_HITS_LUA.encode()).hexdigest()
_threads = threading.local()  # this thread's own Redis connections: {client: (pid, connection)}
LEASE_MAX = 100  # hits per lease, whatever the fraction


def _redis_hits(client, key: str, items: list, lease: int = 1, now: float | None = None,
                back: list[int] | None = None) -> tuple[list[tuple], int]:
    """Count hits in every limit's current fixed window with ONE command: the
    ``_HITS_LUA`` script (``EVALSHA``, loaded on ``NOSCRIPT``: ``_evalsha``). ``lease``: how
    many hits to take at once (1: this request only); ``back``: per window, unused hits of
    a dropped lease to give back first. Returns ``(item, remaining, reset_seconds)`` per
    limit as seen right after the increment (``remaining < 0``: the limit is exceeded,
    nothing granted nor counted) and the hits granted (0 to ``lease``)."""
    now = time.time() if now is None else now
    keys, ends, args = [], [], [lease]
    for i, item in enumerate(items):
        window = item.get_expiry()
        start = int(now // window) * window  # the key names the window's start: never extended
        keys.append(f"{key}:{item.amount}/{window}:{start}")
        ends.append(start + window)
        args += [window + 1, item.amount, back[i] if back else 0]
    reply = _evalsha(client, ("EVALSHA", _HITS_SHA, len(keys), *keys, *args))
    refused = int(reply[-1]) == 0  # not counted: the full windows read as one past their limit
    windows = [(item, item.amount - int(count) - (refused and int(count) >= item.amount),
                max(0, math.ceil(end - now)))
               for item, count, end in zip(items, reply, ends)]
    return windows, int(reply[-1])


# --- Leases: a high per-key limit counted in Redis a batch of hits at a time ---------------
#
# A process takes n hits of a credential's current windows at once (``_HITS_LUA`` with n)
# and admits the next n - 1 requests of that credential in the same windows from the
# lease, without a round trip. The counters in Redis always include every leased hit, so
# the plan's limit is never exceeded. n = the fraction RATELIMIT_LEASE_FRACTION of the
# smallest window's limit (at most LEASE_MAX); below 2 there is no lease and every
# request is counted in Redis (the embedded plans' small limits, and any fraction of 0).
# Near the limit the script grants only the room left, so leases shrink to single hits.
#
# A lease belongs to its plan's limits and to the windows it was taken in. When a window
# ends (or the lease is used up) the next request drops it under the lock and gives its
# unused hits back to the windows that have not ended (a second's lease, to its minute),
# in the same command that takes the new lease; the hits of the window that ended are
# lost, so a credential may be refused up to n - 1 requests per process and window
# early. Threads that take leases at the same moment add them up. ``RateLimit-Remaining``
# is the count after the lease plus this process's unused leased hits: exact for one
# process, an upper bound with several (RFC 9331's headers are advisory).

_leases: dict[str, "_Lease"] = {}
_leases_lock = threading.Lock()
LEASES_MAX = 50_000  # credentials with a lease per process before the table is emptied


class _Lease:
    __slots__ = ("items", "starts", "left", "windows")

    def __init__(self, items, starts, left, windows):
        self.items, self.starts, self.left, self.windows = items, starts, left, windows


def lease_size(items: list, fraction: float) -> int:
    """Hits per lease for a plan of ``items`` (1: no lease)."""
    if fraction <= 0:
        return 1
    return max(1, min(LEASE_MAX, int(min(item.amount for item in items) * fraction)))


def _leased_hits(client, key: str, items: list, lease: int) -> list[tuple]:
    """``_redis_hits`` for one request, served from this process's lease of ``key``'s
    current windows when it has a hit left (no round trip), else by taking a new lease of
    up to ``lease`` hits. Returns ``(item, remaining, reset_seconds)`` per limit, where
    ``remaining`` counts this process's unused leased hits as still available."""
    if lease <= 1:
        return _redis_hits(client, key, items)[0]
    now = time.time()
    starts = tuple(int(now // item.get_expiry()) for item in items)
    back = None
    with _leases_lock:
        held = _leases.get(key)
        if held is not None and held.items == items:
            if held.starts == starts and held.left > 0:
                held.left -= 1
                left = held.left
                return [(item, remaining + left, max(0, math.ceil(end - now)))
                        for item, remaining, end in held.windows]
            if held.left > 0:  # its windows changed: its hits go back where they still count
                back = [held.left if old == new else 0 for old, new in zip(held.starts, starts)]
        if held is not None:  # used up, stale or another plan's: no thread may use it now
            del _leases[key]
    windows, granted = _redis_hits(client, key, items, lease, now, back)
    if granted > 1 and all(remaining >= 0 for _, remaining, _ in windows):
        ends = [(start + 1) * item.get_expiry() for item, start in zip(items, starts)]
        with _leases_lock:
            held = _leases.get(key)
            if held is not None and held.items == items and held.starts == starts:
                # another thread took a lease of the same windows meanwhile: add them up
                held.left += granted - 1
                held.windows = [(item, min(mine, theirs), end) for (item, mine, _), (_, theirs, end)
                                in zip(windows, held.windows)]
            elif held is None or held.items != items or held.starts < starts:
                if len(_leases) >= LEASES_MAX:
                    _leases.clear()
                _leases[key] = _Lease(items, starts, granted - 1, [
                    (item, remaining, end) for (item, remaining, _reset), end in zip(windows, ends)])
        # this request used the first granted hit; the others are unused, still available
        return [(item, remaining + granted - 1, reset) for item, remaining, reset in windows]
    return windows


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
    """The same through Flask-Limiter's storage (memory in the embedded default): a request
    is counted in every window only when every window has room; a refused one counts
    nowhere (reported as ``-1`` on the first full window, like the Redis path)."""
    strategy = limiter.limiter
    full = next((item for item in items if not strategy.test(item, *key)), None)
    out = []
    for item in items:
        if full is None:
            strategy.hit(item, *key)
        stats = strategy.get_window_stats(item, *key)
        reset = max(0, math.ceil(stats.reset_time - time.time()))
        out.append((item, -1 if item is full else stats.remaining, reset))
    return out
