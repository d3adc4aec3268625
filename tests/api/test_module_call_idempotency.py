"""Idempotency-Key on SPEC endpoint 1 (rules 2, limits) and test-mode calls."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from app.extensions import db
from app.models import IdempotencyRecord
from app.services.gateway import calls as gateway
from tests.api.test_module_call import calls_of
from tests.support.finalize import drain
from tests.gateway_helpers import (PROVIDER, balance_cents, call, create_module,  # noqa: F401
                                   mod, provider, provider_server)
from tests.support.rows import expire


def test_replay_returns_identical_response_without_second_charge(app, client, make_account, mod,
                                                                 ledger_clean):
    acct = make_account(cents=10)
    first = call(client, acct, {"action": "counter", "x": 1}, key="order-1")
    assert first.status_code == 200 and first.get_json()["result"] == {"n": 1}
    assert "Idempotent-Replayed" not in first.headers
    # the provider now answers differently; the replay still returns the first response
    assert call(client, acct, {"action": "counter", "x": 1}).get_json()["result"] == {"n": 2}
    again = call(client, acct, {"x": 1, "action": "counter"}, key="order-1")  # same body, other order
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.data == first.data
    assert len(PROVIDER.requests) == 2
    assert balance_cents(app, acct.id) == 8
    ledger_clean()


def test_same_key_different_body_is_409_reused(client, make_account, mod):
    acct = make_account()
    assert call(client, acct, {"action": "ok", "a": 1}, key="k").status_code == 200
    for body, slug in (({"action": "ok", "a": 2}, "svc"), ({"action": "counter"}, "svc")):
        r = call(client, acct, body, key="k", slug=slug)
        assert r.status_code == 409 and r.get_json()["error"] == "idempotency_key_reused"


def test_same_key_in_flight_is_409_in_use(app, make_account, mod):
    acct = make_account(cents=10)
    results = {}

    def first():
        results["first"] = call(app.test_client(), acct, {"action": "block"}, key="slow-1")

    t = threading.Thread(target=first)
    t.start()
    try:
        deadline = time.time() + 10
        while not PROVIDER.requests and time.time() < deadline:
            time.sleep(0.01)
        r = call(app.test_client(), acct, {"action": "block"}, key="slow-1")
    finally:
        PROVIDER.release.set()
        t.join()
    assert r.status_code == 409 and r.get_json()["error"] == "idempotency_key_in_use"
    assert results["first"].status_code == 200
    replay = call(app.test_client(), acct, {"action": "block"}, key="slow-1")
    assert replay.data == results["first"].data
    assert balance_cents(app, acct.id) == 9


@pytest.mark.parametrize("key,status", [("", 400), ("x" * 129, 400), ("x" * 128, 200)])
def test_key_length(app, client, make_account, mod, key, status):
    acct = make_account(cents=10)
    r = call(client, acct, {"action": "ok"}, key=key)
    assert r.status_code == status
    if status == 400:
        assert r.get_json()["error"] == "invalid_request" and "Idempotency-Key" in r.get_json()["message"]
        assert balance_cents(app, acct.id) == 10


def test_keys_are_per_account(app, client, make_account, mod):
    a, b = make_account(cents=10), make_account(cents=10)
    ra = call(client, a, {"action": "ok"}, key="shared")
    rb = call(client, b, {"action": "ok", "other": True}, key="shared")
    assert ra.status_code == rb.status_code == 200
    assert ra.get_json()["call_id"] != rb.get_json()["call_id"]
    assert balance_cents(app, a.id) == balance_cents(app, b.id) == 7


def test_failed_call_releases_the_key(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=10)
    assert call(client, acct, {"action": "boom"}, key="retry-me").status_code == 502
    assert call(client, acct, {"action": "boom"}, key="retry-me").status_code == 502
    assert balance_cents(app, acct.id) == 10
    ledger_clean()


def test_expired_key_is_a_new_call_and_purge_deletes(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=10)
    first = call(client, acct, {"action": "ok"}, key="old")
    drain(app)  # the key's record is finalized before the test ages it
    expire(app, IdempotencyRecord)
    second = call(client, acct, {"action": "ok"}, key="old")
    assert second.status_code == 200 and "Idempotent-Replayed" not in second.headers
    assert second.get_json()["call_id"] != first.get_json()["call_id"]
    assert balance_cents(app, acct.id) == 4
    drain(app)
    expire(app, IdempotencyRecord)
    with app.app_context():
        assert gateway.purge_idempotency() == 1
        assert db.session.execute(select(func.count()).select_from(IdempotencyRecord)).scalar_one() == 0
        db.session.remove()
    ledger_clean()


def test_concurrent_same_key_charges_once(app, make_account, mod, ledger_clean):
    acct = make_account(cents=50, plan="enterprise")
    from concurrent.futures import ThreadPoolExecutor

    def one(_):
        r = call(app.test_client(), acct, {"action": "ok"}, key="burst")
        return r.status_code, r.data

    with ThreadPoolExecutor(max_workers=10) as pool:
        out = list(pool.map(one, range(10)))
    codes = [c for c, _ in out]
    assert set(codes) <= {200, 409} and codes.count(200) >= 1
    assert len({d for c, d in out if c == 200}) == 1  # every 200 is the same response
    assert balance_cents(app, acct.id) == 47
    ledger_clean()


# --- test mode -----------------------------------------------------------------------------

def test_test_key_uses_sandbox_and_is_never_charged(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=10, test_key=True)
    r = call(client, acct, {"action": "ok"}, bearer=acct.test_key)
    assert r.status_code == 200
    data = r.get_json()
    assert data["receipt"]["mode"] == "test" and data["cost_cents"] == 3
    assert PROVIDER.requests[-1].target == "/sandbox/ok"
    assert balance_cents(app, acct.id) == 10
    assert calls_of(app, acct.id) == [("succeeded", 30_000, None, "test")]
    u = client.get("/api/usage/current", headers=acct.headers).get_json()
    assert u["calls"] == 0 and u["spend_cents"] == 0
    # a test key is not charged even when the balance could not cover the price
    poor = make_account(cents=0, test_key=True)
    assert call(client, poor, {"action": "ok"}, bearer=poor.test_key).status_code == 200
    ledger_clean()


def test_test_key_on_module_without_sandbox_is_400(app, client, make_account, provider):
    create_module(app, "nosandbox", provider, {"ok": (1, "/ok")})
    acct = make_account(test_key=True)
    r = call(client, acct, {"action": "ok"}, slug="nosandbox", bearer=acct.test_key)
    assert r.status_code == 400 and "sandbox" in r.get_json()["message"]


def test_a_replay_while_the_call_finishes_waits_for_its_answer(app, client, make_account, mod):
    """Issue 36 item 7: right after a 200, the same key sent to another worker answered 409
    (the answer was not stored yet). A replay of a call still in flight now waits up to
    IDEMPOTENCY_IN_FLIGHT_WAIT_MS for the stored answer and returns it."""
    acct = make_account(cents=10)
    results = {}

    def send(name):
        results[name] = call(app.test_client(), acct, {"action": "block"}, key="finishing-1")

    first = threading.Thread(target=send, args=("first",))
    first.start()
    deadline = time.time() + 10
    while not PROVIDER.requests and time.time() < deadline:
        time.sleep(0.01)
    replay = threading.Thread(target=send, args=("replay",))
    replay.start()
    time.sleep(0.2)  # the replay finds the call in flight and waits for its answer
    PROVIDER.release.set()
    first.join()
    replay.join()
    assert results["first"].status_code == 200
    assert results["replay"].status_code == 200, results["replay"].get_json()
    assert results["replay"].headers.get("Idempotent-Replayed") == "true"
    assert results["replay"].data == results["first"].data
    assert balance_cents(app, acct.id) == 9
