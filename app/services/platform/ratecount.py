"""Rate counting: the ONE counter behind every rate limit of the service (the plan's limit
per account, a key's rpm and tpm, the per-IP, per-e-mail and per-recipient throttles:
``app.ratelimits`` and ``accounts.key_controls`` say what is counted, this says how).

* ``hit(name, items)``: count one request (or ``n`` units, e.g. a completion's estimated
  tokens) in every window of ``items`` (``limits`` items, from ``parse``) of the counter
  ``name``, only when every window has room for all of it; a refused request counts in no
  window. Returns ``(item, remaining, reset_seconds)`` per window, ``remaining < 0`` on
  a window that refused it.
* ``give(name, items, start, n)``: correct a count made earlier in the windows that
  started at ``start`` (a completion's tokens settled: ``n`` < 0 gives back, never below
  zero), nothing once they have ended.
* Fixed windows aligned to the clock (a minute from :00, UTC epoch), named by their
  length and start, so every process and node counts the same window.
* The store every worker and node shares: Redis when the rate-limit storage
  (``RATELIMIT_STORAGE_URI``) is Redis — one ``EVALSHA`` of ``_HITS_LUA`` per count, on
  the thread's own connection (``_evalsha``) — else PostgreSQL (the embedded default):
  ONE statement per count, ``gw_rate_hit`` (a conditional upsert of the counter's row in
  the UNLOGGED table ``rate_windows``) in autocommit, or on the unit of work's connection
  when one is open (a mail throttle counted with the mail it lets through). Old rows are
  deleted by the ``rate-windows-purge`` job (``purge``).
* Leases (``hit(..., lease=n)``): see "Leases" below.
* The store unreachable: the request is allowed (fail open, logged), as it always was.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time

from flask import current_app
from limits import parse_many
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.extensions import db, redis_for
from app.services.platform.freelist import FreeList

log = logging.getLogger(__name__)

_parsed: dict[str, tuple] = {}
PARSED_MAX = 10_000  # specs kept parsed (keys' own limits are many) before the cache is emptied


def parse(spec: str) -> tuple:
    """The ``limits`` items of a ``spec`` in the ``limits`` syntax (``"60/minute;10/second"``),
    cached; of two limits over the same window length the smaller one (the one that binds)."""
    items = _parsed.get(spec)
    if items is None:
        by_window: dict[int, object] = {}
        for item in parse_many(spec):
            held = by_window.get(item.get_expiry())
            if held is None or item.amount < held.amount:
                by_window[item.get_expiry()] = item
        if len(_parsed) >= PARSED_MAX:
            _parsed.clear()
        items = _parsed[spec] = tuple(by_window.values())
    return items


# --- the stores ---------------------------------------------------------------------------

# Counts hits in each window (KEYS: the windows' counter keys; ARGV: n, least, then per
# window its TTL, its limit (-1: none) and the hits given back). First a process's unused
# hits of a lease it dropped are given back (DECRBY, never below zero); then it grants
# g = the smallest room left under any limit, at most n, and adds g to every counter
# (INCRBY, then EXPIRE … NX so a window's counter is never extended). Fewer than ``least``
# (1 for a lease, n for all or nothing) is a refusal: nothing is added, so a refused
# request does not use up the window. n <= 0 gives back (never below zero). Atomic, one
# command, one reply: the counts after it, then g (0: refused).
_HITS_LUA = """
local n = tonumber(ARGV[1])
local grant = n
for i, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  local back = math.min(tonumber(ARGV[3 * i + 2]), count)
  if back > 0 then count = redis.call('DECRBY', key, back) end
  local limit = tonumber(ARGV[3 * i + 1])
  if n > 0 and limit >= 0 and limit - count < grant then grant = limit - count end
end
if n > 0 and grant < tonumber(ARGV[2]) then grant = 0 end
local out = {}
for i, key in ipairs(KEYS) do
  if grant == 0 then
    out[i] = tonumber(redis.call('GET', key) or '0')
  else
    local count = redis.call('INCRBY', key, grant)
    if count < 0 then redis.call('SET', key, 0, 'KEEPTTL') count = 0 end
    redis.call('EXPIRE', key, ARGV[3 * i], 'NX')
    out[i] = count
  end
end
out[#KEYS + 1] = grant
return out
"""
_HITS_SHA = hashlib.sha1(_HITS_LUA.encode()).hexdigest()
# The process's Redis connections for ``_evalsha`` (``platform.freelist``): {client: FreeList}
_idle: dict = {}


class RedisStore:
    """Counters as Redis keys ``<prefix>:<name>:<window seconds>:<window start>``."""

    def __init__(self, client, prefix: str):
        self.client, self.prefix = client, prefix

    def count(self, name: str, windows: list, n: int, least: int, back) -> list:
        """``windows``: (length, start, limit) per window. Returns the counts, then g."""
        keys, args = [], [n, least]
        for i, (length, start, limit) in enumerate(windows):
            keys.append(f"{self.prefix}:{name}:{length}:{start}")
            args += [length + 1, limit, back[i] if back else 0]
        return _evalsha(self.client, ("EVALSHA", _HITS_SHA, len(keys), *keys, *args))


_PG_HIT = ("SELECT gw_rate_hit(%(key)s, %(starts)s::bigint[], %(limits)s::bigint[], %(until)s, "
           "%(n)s, %(least)s, %(back)s::bigint[])")


class PostgresStore:
    """Counters as rows of ``rate_windows`` (key ``<name>:<window seconds>,…``)."""

    def count(self, name: str, windows: list, n: int, least: int, back) -> list:
        params = {"key": f"{name}:{','.join(str(w[0]) for w in windows)}",
                  "starts": _array(w[1] for w in windows), "limits": _array(w[2] for w in windows),
                  "until": max(w[0] + w[1] for w in windows), "n": n, "least": least,
                  "back": _array(back) if back else "{}"}
        from app.services.platform import uow

        if uow.in_unit_of_work():  # counted with the unit's writes (and undone with them)
            return db.session.connection().exec_driver_sql(_PG_HIT, params).scalar_one()
        return uow.run_one(_PG_HIT, params)[0][0]


def _array(values) -> str:
    return "{" + ",".join(str(int(v)) for v in values) + "}"


_stores: dict = {}
_postgres = PostgresStore()


def store(cfg=None):
    """The store of the app (config ``cfg``; default: the current app's): Redis when
    ``RATELIMIT_STORAGE_URI`` is Redis, else PostgreSQL."""
    if cfg is None:
        cfg = current_app.config
    uri, prefix = cfg.get("RATELIMIT_STORAGE_URI") or "", cfg.get("RATELIMIT_KEY_PREFIX") or "gw"
    found = _stores.get((uri, prefix))
    if found is None:
        client = redis_for(uri)
        found = _stores[(uri, prefix)] = RedisStore(client, prefix) if client is not None else _postgres
    return found


def purge(now: float | None = None) -> int:
    """Delete the PostgreSQL counters whose windows have all ended (the rate-windows-purge
    job); returns how many. A row deleted while a request counts is counted anew by it."""
    from app.services.platform.uow import run_one

    now = time.time() if now is None else now
    rows = run_one("WITH gone AS (DELETE FROM rate_windows WHERE until < %(now)s RETURNING 1) "
                   "SELECT count(*) FROM gone", {"now": int(now)})
    return int(rows[0][0])


# --- counting -------------------------------------------------------------------------------

def _count(store_, name: str, items, n: int, least: int, now: float, back=None) -> tuple[list, int]:
    """Count ``n`` (granting at least ``least``) in the current windows of ``items``:
    ``(item, remaining, reset_seconds)`` per window and the units granted (0: refused)."""
    windows, ends = [], []
    for item in items:
        length = item.get_expiry()
        start = int(now // length) * length
        windows.append((length, start, item.amount))
        ends.append(start + length)
    if least > 1 and any(item.amount < least for item in items):  # can never fit: no round trip
        return [(item, -1 if item.amount < least else item.amount, max(0, math.ceil(end - now)))
                for item, end in zip(items, ends)], 0
    reply = store_.count(name, windows, n, least, back)
    granted = int(reply[-1])
    refused = n > 0 and granted == 0
    out = []
    for item, count, end in zip(items, reply, ends):
        left = item.amount - int(count)
        if refused and left < least:  # the window that refused it
            left = -1
        out.append((item, left, max(0, math.ceil(end - now))))
    return out, granted


def hit(name: str, items, n: int = 1, *, lease: int = 1, store_=None) -> list[tuple]:
    """Count ``n`` units (all or none) against every window of ``items`` for the counter
    ``name``; with ``lease`` > 1 (one request, ``n`` = 1) through this process's lease.
    Returns ``(item, remaining, reset_seconds)`` per window; any ``remaining < 0``: refused
    and counted nowhere. Storage errors propagate (the caller fails open)."""
    store_ = store_ or store()
    if lease > 1 and n == 1:
        return _leased(store_, name, items, lease)
    return _count(store_, name, items, n, n, time.time())[0]


def give(name: str, items, start: int, n: int, *, store_=None) -> None:
    """Add ``n`` (negative: give back, never below zero) to the windows of ``items`` that
    started at ``start``, without limit; nothing when they have ended."""
    if n == 0:
        return
    now = time.time()
    if any(start + item.get_expiry() <= now for item in items):
        return
    windows = [(item.get_expiry(), start, -1) for item in items]
    (store_ or store()).count(name, windows, n, 1, None)


def admitted(windows: list[tuple]) -> bool:
    return all(remaining >= 0 for _, remaining, _ in windows)


# --- Leases: a high limit counted a batch of hits at a time ---------------------------------
#
# A process takes n hits of a counter's current windows at once (``_count`` with n, least
# 1) and admits the next n - 1 requests of that counter in the same windows from the lease,
# without a round trip. The store's counters always include every leased hit, so the limit
# is never exceeded. n = the fraction RATELIMIT_LEASE_FRACTION of the smallest window's
# limit (at most LEASE_MAX); below 2 there is no lease and every request is counted in the
# store (the embedded plans' small limits, and any fraction of 0). Near the limit the store
# grants only the room left, so leases shrink to single hits.
#
# A lease belongs to its limits and to the windows it was taken in. When a window ends (or
# the lease is used up) the next request drops it under the lock and gives its unused
# hits back to the windows that have not ended (a second's lease, to its minute), in the
# same command that takes the new lease (PostgreSQL: only when that one is granted); the
# hits of the window that ended are lost, so a counter may be refused up to n - 1 requests
# per process and window early. Threads that take leases at the same moment add them up.
# ``RateLimit-Remaining`` is the count after the lease plus this process's unused leased
# hits: exact for one process, an upper bound with several (RFC 9331's are advisory).

_leases: dict[str, "_Lease"] = {}
_leases_lock = threading.Lock()
LEASES_MAX = 50_000  # counters with a lease per process before the table is emptied
LEASE_MAX = 100  # hits per lease, whatever the fraction


class _Lease:
    __slots__ = ("items", "starts", "left", "windows")

    def __init__(self, items, starts, left, windows):
        self.items, self.starts, self.left, self.windows = items, starts, left, windows


def lease_size(items, fraction: float) -> int:
    """Hits per lease for limits ``items`` (1: no lease)."""
    if fraction <= 0:
        return 1
    return max(1, min(LEASE_MAX, int(min(item.amount for item in items) * fraction)))


def _leased(store_, key: str, items, lease: int) -> list[tuple]:
    """One request of ``key`` from this process's lease of its current windows when it has
    a hit left (no round trip), else by taking a new lease of up to ``lease`` hits."""
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
    windows, granted = _count(store_, key, items, lease, 1, now, back)
    if granted > 1 and admitted(windows):
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
    """Send ``command`` (an ``EVALSHA`` of ``_HITS_LUA``) on one of the process's own
    connections to ``client``'s server (``_connections``: a free list, made from the
    client's pool settings) and return the reply, so a request skips redis-py's command
    path (pool checkout and return, retry wrapper, response callbacks: ~70 µs of CPU per
    call measured here; the raw send and read cost ~60 µs). A server without the script
    (restart, ``SCRIPT FLUSH``) gets it loaded and the command sent again; a connection
    that broke (server restart, timeout) is dropped and the command sent once more on a
    new one; any other error propagates (the caller then fails open), and the connection
    is closed first, since a reply may be left unread on it."""
    with _connections(client).lend() as conn:
        try:
            return _send(conn, command)
        except BaseException:
            conn.disconnect()  # reconnects on its next command
            raise


def _connections(client) -> FreeList:
    idle = _idle.get(client)
    if idle is None:
        idle = _idle.setdefault(client, FreeList(client.connection_pool.make_connection,
                                                 lambda conn: conn.disconnect()))
    return idle


def _send(conn, command: tuple):
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
