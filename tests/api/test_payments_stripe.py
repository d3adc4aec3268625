"""The Stripe processor through the official SDK against a local Stripe stand-in:
checkout, saved method, off-session card (success/decline) and ACH, signed webhooks."""
from __future__ import annotations

import time

import pytest

from tests.api.test_payments_sandbox import _balance, _fund
from tests.standins import stripe_server


@pytest.fixture
def stripe_api(app, monkeypatch):
    with stripe_server() as fake:
        for key, value in {"PAYMENTS_PROCESSOR": "stripe", "STRIPE_SECRET_KEY": "sk_test_standin",
                           "STRIPE_WEBHOOK_SECRET": fake.webhook_secret, "STRIPE_API_BASE": fake.url}.items():
            monkeypatch.setitem(app.config, key, value)
        yield fake


def _deliver(client, fake, event, **kw):
    payload, sig = fake.signed(event, **kw)
    return client.post("/api/pay/webhook", data=payload, headers={"Stripe-Signature": sig})


def test_checkout_session_then_webhook_credits_once(client, account, stripe_api, ledger_clean):
    r = client.post("/api/pay/checkout", json={"amount_cents": 1500, "product": "Credits",
                                               "return_url": "https://app.example/billing"},
                    headers=account.headers)
    assert r.status_code == 200, r.get_json()
    out = r.get_json()
    assert out["url"].startswith("https://checkout.stripe.test/")
    method, path, params = next(x for x in stripe_api.requests if x[1] == "/v1/checkout/sessions")
    assert params["mode"] == "payment" and params["line_items"]["0"]["price_data"]["unit_amount"] == "1500"
    assert params["metadata"]["payment_id"] == out["payment_id"]
    assert params["success_url"].startswith("https://app.example/billing?checkout=success")
    session_id = out["url"].rsplit("/", 1)[1]
    assert _balance(client, account) == 1000

    obj = {"id": session_id, "object": "checkout.session", "amount_total": 1500, "currency": "usd",
           "payment_status": "paid", "payment_intent": "pi_chk_1", "metadata": params["metadata"]}
    event = stripe_api.event("checkout.session.completed", obj)
    assert _deliver(client, stripe_api, event).get_json()["outcome"] == "credited"
    assert _deliver(client, stripe_api, event).get_json()["duplicate"] is True
    assert _balance(client, account) == 2500
    # Stale delivery of a new event id: refused.
    stale = stripe_api.event("checkout.session.completed", obj)
    r = _deliver(client, stripe_api, stale, timestamp=int(time.time()) - 400)
    assert r.status_code == 401 and r.get_json()["error"] == "webhook_signature_invalid"
    # Refund through charge.refunded.
    refund = stripe_api.event("charge.refunded", {"id": "ch_1", "object": "charge", "payment_intent": "pi_chk_1",
                                                  "amount": 1500, "amount_refunded": 500})
    assert _deliver(client, stripe_api, refund).get_json()["outcome"] == "refunded"
    assert _balance(client, account) == 2000
    ledger_clean()


def test_method_and_off_session_card(client, account, stripe_api, ledger_clean):
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_unknown"}, headers=account.headers)
    assert r.status_code == 404 and r.get_json()["error"] == "payment_method_not_found"
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=account.headers)
    assert r.status_code == 200 and r.get_json()["processor"] == "stripe" and r.get_json()["last4"] == "4242"
    paths = [p for _, p, _ in stripe_api.requests]
    assert "/v1/customers" in paths and "/v1/payment_methods/pm_card_visa/attach" in paths
    r = _fund(client, account, 900, "card")
    assert r.status_code == 200 and r.get_json()["status"] == "succeeded"
    assert _balance(client, account) == 1900
    _, _, params = next(x for x in stripe_api.requests if x[1] == "/v1/payment_intents")
    assert params["off_session"] == "true" and params["confirm"] == "true"
    # The processor's later payment_intent.succeeded for the same intent credits nothing more.
    pid = r.get_json()["payment_id"]
    pi_obj = {"id": "pi_test_%06d" % stripe_api.n, "object": "payment_intent", "amount": 900,
              "amount_received": 900, "currency": "usd", "metadata": {"payment_id": pid}}
    assert _deliver(client, stripe_api, stripe_api.event("payment_intent.succeeded", pi_obj)).get_json()["outcome"] \
        == "already_final"
    assert _balance(client, account) == 1900

    r = _fund(client, account, 900, "card", with_method="pm_card_chargeDeclined")
    assert r.status_code == 402 and r.get_json()["error"] == "card_declined"
    assert "declined" in r.get_json()["message"]
    assert _balance(client, account) == 1900
    ledger_clean()


def test_ach_settles_by_webhook(client, account, stripe_api, ledger_clean):
    r = _fund(client, account, 5000, "ach", with_method="pm_usBankAccount")
    assert r.status_code == 200 and r.get_json()["status"] == "pending"
    pid = r.get_json()["payment_id"]
    _, _, params = next(x for x in stripe_api.requests if x[1] == "/v1/payment_intents")
    assert params["payment_method_types"] == {"0": "us_bank_account"}
    pi_id = "pi_test_%06d" % stripe_api.n
    assert _balance(client, account) == 1000
    ok = stripe_api.event("payment_intent.succeeded", {"id": pi_id, "object": "payment_intent", "amount": 5000,
                                                       "amount_received": 5000, "currency": "usd",
                                                       "metadata": {"payment_id": pid}})
    assert _deliver(client, stripe_api, ok).get_json()["outcome"] == "credited"
    assert _balance(client, account) == 6000
    hist = client.get("/api/pay/history", headers=account.headers).get_json()["payments"]
    assert hist[0]["method"] == "ach" and hist[0]["status"] == "succeeded"
    ledger_clean()


def test_test_keys_use_the_sandbox_even_with_stripe(client, make_account, stripe_api):
    acct = make_account(test_key=True)
    r = client.post("/api/pay/checkout", json={"amount_cents": 500},
                    headers={"Authorization": f"Bearer {acct.test_key}"})
    assert r.status_code == 200 and "/pay/sandbox/checkout/" in r.get_json()["url"]
    assert stripe_api.requests == []
