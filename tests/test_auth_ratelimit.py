"""Per-credential plan rate limits (app/ratelimits.py): the one-round-trip Redis counter, the
``limits`` storage path without Redis, and failing open when the storage is down."""
from __future__ import annotations

import os

import pytest
import redis
from limits import parse_many

from app import ratelimits
from tests.gateway_helpers import mod, provider, provider_server  # noqa: F401 (fixtures)
from tests.support.procs import free_port

REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL (real Redis)")


@needs_redis
def test_redis_hits_count_every_window_in_one_round_trip(app):
    client = redis.Redis.from_url(REDIS_URL)
    items = parse_many("3/minute;10/hour")
    key = "gwtest-rl:plan:key_1"
    seen = []
    for _ in range(4):
        seen.append([(str(i), remaining) for i, remaining, _reset in ratelimits._redis_hits(client, key, items)])
    assert [r for _, r in (w[0] for w in seen)] == [2, 1, 0, -1]      # minute window: 4th exceeds
    assert [r for _, r in (w[1] for w in seen)] == [9, 8, 7, 6]       # hour window still counts
    keys = sorted(k.decode() for k in client.scan_iter("gwtest-rl:plan:key_1:*"))
    assert len(keys) == 2 and keys[0].startswith("gwtest-rl:plan:key_1:10/3600:")
    assert int(keys[1].rsplit(":", 1)[1]) % 60 == 0                  # named by the window start
    for k in keys:
        window = int(k.split(":")[-2].split("/")[1])
        assert 0 < client.ttl(k) <= window + 1                          # never extended beyond it
    _, _, reset = ratelimits._redis_hits(client, key, items)[0]
    assert 0 <= reset <= 60
    client.delete(*keys)


@needs_redis
def test_redis_hits_send_one_command_per_request(app, monkeypatch):
    """Every window in ONE command (the Lua script by EVALSHA), not MULTI + 2 per limit +
    EXEC; a Redis that lost the script (restart, SCRIPT FLUSH) gets it loaded again."""
    client = redis.Redis.from_url(REDIS_URL)
    items = parse_many("3/minute;10/hour;100/day")
    key = "gwtest-rl:plan:one-command"
    ratelimits._redis_hits(client, key, items)  # loads the script once
    sent = []
    real = redis.connection.AbstractConnection.send_packed_command

    def send_packed(self, command, check_health=True):
        sent.append(b"".join(command) if isinstance(command, list) else command)
        return real(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", send_packed)
    assert [r for _, r, _ in ratelimits._redis_hits(client, key, items)] == [1, 8, 98]
    assert len(sent) == 1 and b"EVALSHA" in sent[0]
    client.script_flush()
    sent.clear()
    assert [r for _, r, _ in ratelimits._redis_hits(client, key, items)] == [0, 7, 97]
    assert [next(c for c in (b"EVALSHA", b"LOAD") if c in cmd) for cmd in sent] == [b"EVALSHA", b"LOAD", b"EVALSHA"]
    client.delete(*client.scan_iter(key + ":*"))


@needs_redis
def test_redis_hits_survive_a_dropped_connection(app):
    """The thread's connection breaking (server restart, idle timeout) costs one resend
    on a new connection, not a failed-open request."""
    client = redis.Redis.from_url(REDIS_URL)
    items = parse_many("5/minute")
    key = "gwtest-rl:plan:dropped"
    assert ratelimits._redis_hits(client, key, items)[0][1] == 4
    (_, conn), = [v for c, v in ratelimits._threads.conns.items() if c is client]
    conn.send_command("CLIENT", "ID")
    client.client_kill_filter(_id=conn.read_response())  # that one connection, server side
    assert ratelimits._redis_hits(client, key, items)[0][1] == 3
    client.delete(*client.scan_iter(key + ":*"))


@needs_redis
def test_redis_hits_are_per_credential(app):
    client = redis.Redis.from_url(REDIS_URL)
    items = parse_many("1/minute")
    assert ratelimits._redis_hits(client, "gwtest-rl:plan:a", items)[0][1] == 0
    assert ratelimits._redis_hits(client, "gwtest-rl:plan:b", items)[0][1] == 0
    assert ratelimits._redis_hits(client, "gwtest-rl:plan:a", items)[0][1] == -1
    client.delete(*client.scan_iter("gwtest-rl:plan:*"))


def test_limit_headers_and_429(app, client, make_account, monkeypatch):
    monkeypatch.setitem(app.config["PLANS"], "starter", {"plan_cents": 2000, "rate_limit": "2/hour;50/day"})
    acct = make_account(plan="starter")
    first = client.get("/api/account", headers=acct.headers)
    assert first.status_code == 200
    assert first.headers["RateLimit-Limit"] == "2" and first.headers["RateLimit-Remaining"] == "1"
    assert 0 < int(first.headers["RateLimit-Reset"]) <= 3600
    assert client.get("/api/account", headers=acct.headers).status_code == 200
    r = client.get("/api/account", headers=acct.headers)
    assert r.status_code == 429 and r.get_json()["error"] == "rate_limited"
    assert 1 <= int(r.headers["Retry-After"]) <= 3600 and r.headers["RateLimit-Remaining"] == "0"
    other = make_account(plan="starter")  # another credential has its own budget
    assert client.get("/api/account", headers=other.headers).status_code == 200


def test_storage_down_fails_open(app, client, make_account, monkeypatch):
    monkeypatch.setitem(app.config["PLANS"], "starter", {"plan_cents": 2000, "rate_limit": "1/hour"})
    monkeypatch.setitem(app.config, "RATELIMIT_STORAGE_URI", f"redis://127.0.0.1:{free_port()}/0")
    acct = make_account(plan="starter")
    codes = [client.get("/api/account", headers=acct.headers).status_code for _ in range(3)]
    assert codes == [200, 200, 200]


def test_flask_limiter_skips_the_hot_routes_only(app, client, make_account, mod, monkeypatch):
    """Flask-Limiter resolves limits only where a per-IP / per-e-mail limit can apply: not
    on the metered call or chat (their limit is the plan's), still on a public form."""
    from app.extensions import limiter
    from tests.gateway_helpers import call

    resolved, scoped = [], []
    real = limiter.limit_manager.resolve_limits
    monkeypatch.setattr(limiter.limit_manager, "resolve_limits",
                        lambda *a, **kw: resolved.append(a[1]) or real(*a, **kw))
    real_scope = limiter.limit_manager.exemption_scope
    monkeypatch.setattr(limiter.limit_manager, "exemption_scope",
                        lambda *a, **kw: scoped.append(a[1]) or real_scope(*a, **kw))
    acct = make_account(cents=100)
    assert call(client, acct, {"action": "ok"}).status_code == 200
    client.post("/v1/chat/completions", json={"model": "auto", "messages": []}, headers=acct.headers)
    assert resolved == [] and scoped == []  # not even the (empty) evaluation ran
    client.post("/api/contact", json={})
    assert resolved and set(resolved) == {"contact.ContactView"}
    # the filter names real routes, none of which carries a Flask-Limiter limit
    endpoints = {rule.endpoint for rule in app.url_map.iter_rules()}
    assert ratelimits.NO_IP_LIMIT_ENDPOINTS <= endpoints
    for endpoint in ratelimits.NO_IP_LIMIT_ENDPOINTS:
        view = app.view_functions[endpoint].view_class
        for method in view.methods:
            name = f"{view.__module__}.{view.__name__}.{method.lower()}"
            assert not any(marked.endswith(f"{view.__name__}.{method.lower()}")
                           for marked in limiter._marked_for_limiting), name
