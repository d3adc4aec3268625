"""Issue 42 item 13 (second bullet): every money-moving POST honours ``Idempotency-Key``
with Stripe's semantics — the same key and body answer the first response and move no
money again, another body is 409 — through one mechanism (``platform/idempotency.py``,
the module call's too). 8 parallel ``POST /api/wallet/fund`` with one key charged the
saved card 8 times."""
from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.extensions import db
from app.models import Payment
from tests.agentkit import Keypair, register
from tests.support.concurrency import at_once


def _payments(app, account_id) -> int:
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(Payment).where(
            Payment.account_id == account_id)).scalar_one()
        db.session.remove()
        return n


def _balance(client, acct) -> int:
    return client.get("/api/account", headers=acct.headers).get_json()["balance_cents"]


@pytest.fixture
def carded(client, make_account):
    acct = make_account(plan="pro")
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return acct


def test_eight_parallel_fundings_with_one_key_charge_once(app, carded, ledger_clean):
    before = _balance(app.test_client(), carded)
    headers = {**carded.headers, "Idempotency-Key": "fund-once"}

    def fund():
        r = app.test_client().post("/api/wallet/fund", json={"amount_cents": 100, "method": "card"}, headers=headers)
        return r.status_code, r.get_json(), r.headers.get("Idempotent-Replayed")

    results = at_once(8, fund)
    ok = [body for status, body, _ in results if status == 200]
    assert ok and all(status in (200, 409) for status, _, _ in results), results
    assert all(body == ok[0] for body in ok)  # every answer is the first one
    assert _payments(app, carded.id) == 1
    assert _balance(app.test_client(), carded) == before + 100
    # afterwards: the first answer again, marked as a replay; another body is 409
    again = app.test_client().post("/api/wallet/fund", json={"amount_cents": 100, "method": "card"}, headers=headers)
    assert again.status_code == 200 and again.get_json() == ok[0] and again.headers["Idempotent-Replayed"] == "true"
    other = app.test_client().post("/api/wallet/fund", json={"amount_cents": 200, "method": "card"}, headers=headers)
    assert other.status_code == 409 and other.get_json()["error"] == "idempotency_key_reused"
    assert _payments(app, carded.id) == 1
    ledger_clean()


def test_a_declined_funding_releases_the_key(app, client, make_account):
    acct = make_account()
    client.post("/api/pay/method", json={"payment_method_id": "pm_card_chargeDeclined"}, headers=acct.headers)
    headers = {**acct.headers, "Idempotency-Key": "k1"}
    r = client.post("/api/wallet/fund", json={"amount_cents": 100, "method": "card"}, headers=headers)
    assert r.status_code == 402
    client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=acct.headers)
    r = client.post("/api/wallet/fund", json={"amount_cents": 100, "method": "card"}, headers=headers)
    assert r.status_code == 200 and "Idempotent-Replayed" not in r.headers


def test_checkout_once_per_key(app, client, account):
    headers = {**account.headers, "Idempotency-Key": "co-1"}
    first = client.post("/api/pay/checkout", json={"amount_cents": 500}, headers=headers)
    again = client.post("/api/pay/checkout", json={"amount_cents": 500}, headers=headers)
    assert first.status_code == 200 and again.get_json() == first.get_json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert _payments(app, account.id) == 1
    other = client.post("/api/pay/checkout", json={"amount_cents": 700}, headers=headers)
    assert other.status_code == 409 and other.get_json()["error"] == "idempotency_key_reused"
    # the key is the account's, across routes: the same key on another money route is 409
    other = client.post("/api/wallet/fund", json={"amount_cents": 500, "method": "card"}, headers=headers)
    assert other.status_code == 409


def test_agent_funding_answers_the_first_response(app, client, account):
    kp = Keypair()
    agent = register(client, account, kp).get_json()
    headers = {**account.headers, "Idempotency-Key": "ag-1"}
    results = at_once(8, lambda: app.test_client().post(f"/api/agent/{agent['id']}/fund", json={"amount_cents": 50},
                                                       headers=headers))
    bodies = [r.get_json() for r in results if r.status_code == 200]
    assert bodies and all(b == bodies[0] for b in bodies) and all(r.status_code in (200, 409) for r in results)
    agent_balance = client.get("/api/account", headers=account.headers).get_json()["balance_cents"]
    assert agent_balance == 1000 - 50
