"""Issue 42 item 3: the plan's rate limit cannot be multiplied and does not starve a
client. It is counted per account (every key, rotated key and agent session of the
account shares it: five keys of one starter account got five times the plan), on a store
every worker and node shares — also in the embedded default, where each gunicorn worker
counted in its own memory (two workers admitted 20 of a 40-request burst against 10) —
and a refused request does not count against any window, on either store."""
from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis as redis_lib
import requests

from app.services.platform import ratecount
from tests.support.apps import app_env, gunicorn


@pytest.fixture
def tight_plan(app, monkeypatch):
    monkeypatch.setitem(app.config["PLANS"]["starter"], "rate_limit", "5/hour")


def test_keys_of_one_account_share_the_plan(client, account, tight_plan):
    keys = [client.post("/api/keys", json={"name": f"k{i}"}, headers=account.headers).get_json()["key"]
            for i in range(4)]  # 4 requests of the account's 5
    codes = [client.get("/api/account", headers={"Authorization": f"Bearer {k}"}).status_code
             for k in keys * 2]
    assert codes.count(200) == 1 and codes.count(429) == 7  # 4 creations + 1 = the plan's 5
    other = client.post("/api/keys", json={"name": "x"}, headers=account.headers)
    assert other.status_code == 429 and "account" in other.get_json()["message"]


def test_another_account_is_not_affected(client, make_account, tight_plan):
    a, b = make_account(), make_account()
    for _ in range(6):
        client.get("/api/account", headers=a.headers)
    assert client.get("/api/account", headers=b.headers).status_code == 200


# --- a refused request counts nowhere, on both stores ----------------------------------------

def _refusals_do_not_count(store):
    items = ratecount.parse("2/minute;5/hour")
    name = f"test-refusals-{uuid.uuid4().hex}"
    seen = [ratecount.hit(name, items, store_=store) for _ in range(5)]  # 2 admitted, 3 refused
    assert [w[0][1] for w in seen] == [1, 0, -1, -1, -1]
    assert [w[1][1] for w in seen] == [4, 3, 3, 3, 3]  # the hour window counted the 2 admitted only
    # all or nothing (a completion's tokens): 4 units do not fit the 3 left, counted nowhere
    hour, tokens = ratecount.parse("5/hour"), name + ":tokens"
    assert ratecount.hit(tokens, hour, 2, store_=store)[0][1] == 3
    assert not ratecount.admitted(ratecount.hit(tokens, hour, 4, store_=store))
    assert ratecount.hit(tokens, hour, 3, store_=store)[0][1] == 0


def test_a_refused_request_counts_nowhere_in_postgresql(app):
    with app.app_context():
        _refusals_do_not_count(ratecount.PostgresStore())


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")
def test_a_refused_request_counts_nowhere_in_redis(app):
    client = redis_lib.Redis.from_url(os.environ["REDIS_URL"])
    with app.app_context():
        _refusals_do_not_count(ratecount.RedisStore(client, f"gwtest-refusals-{os.getpid()}"))


def test_the_postgresql_store_counts_in_one_statement_and_old_rows_are_purged(app):
    """One round trip per count (the conditional upsert, in autocommit: no BEGIN/COMMIT),
    and the purge job deletes the counters whose windows have all ended."""
    from sqlalchemy import event

    from app.extensions import db
    from app.services.platform.uow import statement_events

    items = ratecount.parse("3/minute")
    with app.app_context():
        seen = []

        def _sql(conn, cursor, statement, *args):  # noqa: ARG001
            seen.append(statement)

        event.listen(db.engine, "before_cursor_execute", _sql)
        try:
            with statement_events():
                ratecount.hit("test-one-statement", items, store_=ratecount.PostgresStore())
        finally:
            event.remove(db.engine, "before_cursor_execute", _sql)
        assert len(seen) == 1 and "gw_rate_hit" in seen[0]
        assert ratecount.purge(now=time.time()) == 0  # its minute has not ended
        assert ratecount.purge(now=time.time() + 61) == 1
        db.session.remove()


# --- the embedded default: two gunicorn workers, no Redis ------------------------------------

def test_two_workers_without_redis_admit_the_plan_once(app, make_account):
    """The issue's case on the embedded-default configuration (no REDIS_URL, two gunicorn
    workers): a 40-request burst from five keys of one account against a plan of 10 admits
    10, not 10 per worker (20 before). The plan's window is an hour here, so that the
    machine's speed cannot spread the burst over two windows."""
    acct = make_account(plan="starter")
    env = app_env(app.config)
    env.pop("REDIS_URL", None)
    env.pop("RATELIMIT_STORAGE_URI", None)
    env["TEST_PLAN_RATE_LIMITS"] = json.dumps({"starter": "10/hour"})
    with gunicorn(env, workers=2, module="tests.support.wsgi_plans:app") as url:
        keys = [requests.post(f"{url}/api/keys", json={"name": f"k{i}"}, headers=acct.headers, timeout=30)
                for i in range(5)]
        assert [r.status_code for r in keys] == [201] * 5, [r.text for r in keys]
        bearers = [{"Authorization": f"Bearer {r.json()['key']}"} for r in keys]

        def one(i):  # a new connection each: gunicorn's two workers both serve the burst
            return requests.get(f"{url}/api/account", headers=bearers[i % 5], timeout=30)

        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(one, range(40)))
        codes = [r.status_code for r in answers]
        # 5 key creations + 5 of the burst = the plan's 10
        assert codes.count(200) == 5 and codes.count(429) == 35, codes
        refused = next(r for r in answers if r.status_code == 429)
        assert refused.json()["error"] == "rate_limited" and int(refused.headers["Retry-After"]) >= 1


def test_a_throttle_counts_per_route_and_client(app, client, monkeypatch):
    """The per-IP throttles moved onto the one counter keep their scope: each route its own
    count per client IP (as Flask-Limiter's decorators counted), in the shared store."""
    monkeypatch.setitem(app.config, "PUBLIC_PAGE_RATE_LIMIT", "2/hour")
    assert [client.get("/login").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/login/confirm").status_code != 429  # another route: its own count
    refused = client.get("/login")
    assert refused.status_code == 429 and refused.get_json()["error"] == "rate_limited"
    assert "per client IP" in refused.get_json()["message"] and int(refused.headers["Retry-After"]) >= 1
