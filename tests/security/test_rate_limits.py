"""Issue 42 item 3: the plan's rate limit cannot be multiplied and does not starve a
client. It is counted per account (every key, rotated key and agent session of the
account shares it: five keys of one starter account got five times the plan), and a
refused request does not count against any window."""
from __future__ import annotations

import os

import pytest
import redis as redis_lib
from limits import parse_many

from app import ratelimits


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


def _refusals_do_not_count(hits):
    items = parse_many("2/minute;5/hour")
    seen = [hits(items) for _ in range(5)]  # 2 admitted, then 3 refused by the minute window
    assert [w[0][1] for w in seen] == [1, 0, -1, -1, -1]
    assert [w[1][1] for w in seen] == [4, 3, 3, 3, 3]  # the hour window counted the 2 admitted only


def test_a_refused_request_counts_nowhere_in_memory(app):
    with app.app_context():
        _refusals_do_not_count(lambda items: ratelimits._storage_hits(("acct", "acct_refusals"), items))


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")
def test_a_refused_request_counts_nowhere_in_redis(app):
    client = redis_lib.Redis.from_url(os.environ["REDIS_URL"])
    key = f"gwtest-refusals-{os.urandom(4).hex()}:plan:acct_1"
    try:
        _refusals_do_not_count(lambda items: ratelimits._redis_hits(client, key, items)[0])
    finally:
        for k in client.scan_iter(key + ":*"):
            client.delete(k)
