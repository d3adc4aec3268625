"""Endpoints 14–16 and 20 (card/ACH) with the sandbox processor, the hosted checkout page
and the webhook: success, decline, cancel, ACH settlement, refunds, replay, forgery,
stale signatures, crash-safety and BOLA."""
from __future__ import annotations

import json
import time
from urllib.parse import urlparse

import pytest

from app.extensions import db
from app.models import Payment, PaymentEvent
from app.services.money import ledger
from app.services.billing.processors import sandbox_webhook_secret, sign_payload


def _balance(client, acct):
    return client.get("/api/account", headers=acct.headers).get_json()["balance_cents"]


def _fund(client, acct, cents, method, with_method=None):
    """POST /api/wallet/fund; ``with_method``: a payment method saved first (/api/pay/method)."""
    if with_method:
        client.post("/api/pay/method", json={"payment_method_id": with_method}, headers=acct.headers)
    return client.post("/api/wallet/fund", json={"amount_cents": cents, "method": method}, headers=acct.headers)


def _checkout(client, acct, cents=500, **extra):
    r = client.post("/api/pay/checkout", json={"amount_cents": cents, **extra}, headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def test_checkout_pay_credits_once_and_shows_in_history(client, account, ledger_clean):
    out = _checkout(client, account, 2500, product="Top-up")
    assert set(out) == {"url", "payment_id", "status", "expires_at"} and out["status"] == "pending"
    page_path = urlparse(out["url"]).path
    assert page_path.startswith("/pay/sandbox/checkout/cs_sbx_")
    page = client.get(page_path)
    assert page.status_code == 200 and page.content_type.startswith("text/html")
    assert b"$25.00" in page.data and b"Top-up" in page.data and b"pm_card_visa" in page.data
    assert _balance(client, account) == 1000  # nothing before confirmation

    r = client.post(page_path, data={"action": "pay", "payment_method": "pm_card_visa"})
    assert r.status_code == 200 and b"succeeded" in r.data
    assert _balance(client, account) == 3500
    # Paying again is refused by the page and credits nothing.
    r = client.post(page_path, data={"action": "pay", "payment_method": "pm_card_visa"})
    assert b"already succeeded" in r.data
    assert _balance(client, account) == 3500

    hist = client.get("/api/pay/history", headers=account.headers).get_json()["payments"]
    assert hist[0]["id"] == out["payment_id"] and hist[0]["status"] == "succeeded"
    assert hist[0]["amount_cents"] == 2500 and hist[0]["method"] == "card" and hist[0]["created_at"]
    ledger_clean()


def test_checkout_decline_then_cancel(client, account, ledger_clean):
    path = urlparse(_checkout(client, account, 100)["url"]).path
    r = client.post(path, data={"action": "pay", "payment_method": "pm_card_chargeDeclined"})
    assert r.status_code == 200 and b"declined" in r.data
    assert _balance(client, account) == 1000
    r = client.post(path, data={"action": "cancel"})
    assert b"canceled" in r.data.lower()
    hist = client.get("/api/pay/history", headers=account.headers).get_json()["payments"]
    assert hist[0]["status"] == "expired"
    assert client.post(path, data={"action": "pay", "payment_method": "pm_card_visa"}).status_code == 200
    assert _balance(client, account) == 1000
    ledger_clean()


def test_checkout_return_url_redirect(client, account):
    out = _checkout(client, account, 300, return_url="https://shop.example/done?x=1")
    r = client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    assert r.status_code == 303
    assert r.headers["Location"] == f"https://shop.example/done?x=1&checkout=success&payment_id={out['payment_id']}"


def test_checkout_ach_settles_later_via_cli(app, client, account, ledger_clean):
    out = _checkout(client, account, 1000)
    path = urlparse(out["url"]).path
    r = client.post(path, data={"action": "pay", "payment_method": "pm_usBankAccount"})
    assert b"settles" in r.data or b"settlement" in r.data
    assert _balance(client, account) == 1000
    res = app.test_cli_runner().invoke(args=["payments", "sandbox-settle", out["payment_id"]])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["payment"]["status"] == "succeeded"
    assert _balance(client, account) == 2000
    res = app.test_cli_runner().invoke(args=["payments", "sandbox-settle", out["payment_id"]])
    assert res.exit_code != 0  # nothing pending any more
    assert _balance(client, account) == 2000
    ledger_clean()


@pytest.mark.parametrize("body", [
    {}, {"amount_cents": 99}, {"amount_cents": "500"}, {"amount_cents": 500, "return_url": "javascript:alert(1)"},
    {"amount_cents": 10**9}, {"amount_cents": 500.5}, {"amount_cents": True},
])
def test_checkout_bad_input(client, account, body):
    r = client.post("/api/pay/checkout", json=body, headers=account.headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"


def test_scopes(client, make_account):
    ro = make_account(scopes=["billing:read"])
    assert client.post("/api/pay/checkout", json={"amount_cents": 500}, headers=ro.headers).status_code == 403
    assert client.get("/api/pay/history", headers=ro.headers).status_code == 200
    none = make_account(scopes=["call:read"])
    assert client.get("/api/pay/history", headers=none.headers).status_code == 403
    assert client.get("/api/pay/history").status_code == 401


def test_method_and_fund_card(client, account, ledger_clean):
    r = _fund(client, account, 500, "card")
    assert r.status_code == 409 and r.get_json()["error"] == "no_payment_method"
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_nope"}, headers=account.headers)
    assert r.status_code == 404 and r.get_json()["error"] == "payment_method_not_found"
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=account.headers)
    assert r.status_code == 200
    assert r.get_json() == {"payment_method_id": "pm_card_visa", "type": "card", "brand": "visa",
                            "last4": "4242", "processor": "sandbox"}
    r = _fund(client, account, 500, "card")
    assert r.status_code == 200
    body = r.get_json()
    assert body["status"] == "succeeded" and body["balance_cents"] == 1500 and body["deposit"] is None
    r = _fund(client, account, 500, "ach")
    assert r.status_code == 409 and r.get_json()["error"] == "no_payment_method"

    r = _fund(client, account, 700, "card", with_method="pm_card_chargeDeclined")
    assert r.status_code == 402 and r.get_json()["error"] == "card_declined"
    assert r.get_json()["decline_code"] == "generic_decline"
    assert _balance(client, account) == 1500
    statuses = [p["status"] for p in client.get("/api/pay/history", headers=account.headers).get_json()["payments"]]
    assert statuses == ["failed", "succeeded"]
    ledger_clean()


def test_fund_ach_pending_then_settle_or_fail(app, client, account, ledger_clean):
    r = _fund(client, account, 1200, "ach", with_method="pm_usBankAccount")
    assert r.status_code == 200 and r.get_json()["status"] == "pending"
    first = r.get_json()["payment_id"]
    r = _fund(client, account, 800, "ach")
    second = r.get_json()["payment_id"]
    assert _balance(client, account) == 1000
    runner = app.test_cli_runner()
    assert runner.invoke(args=["payments", "sandbox-settle", first]).exit_code == 0
    assert runner.invoke(args=["payments", "sandbox-settle", second, "--fail"]).exit_code == 0
    assert _balance(client, account) == 2200
    hist = {p["id"]: p for p in client.get("/api/pay/history", headers=account.headers).get_json()["payments"]}
    assert hist[first]["status"] == "succeeded" and hist[second]["status"] == "failed"
    assert hist[second]["failure_code"] == "debit_not_authorized"
    ledger_clean()


def test_refund_debits_and_shortfall_is_booked(app, client, account, ledger_clean):
    out = _checkout(client, account, 500)
    client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    runner = app.test_cli_runner()
    res = runner.invoke(args=["payments", "sandbox-refund", out["payment_id"], "--cents", "200"])
    assert json.loads(res.output)["payment"]["status"] == "partially_refunded"
    assert _balance(client, account) == 1300
    # Spend the balance down, then refund the rest: only what is left can be taken back.
    with app.app_context():
        ledger.post("test_spend", [(ledger.customer(account.id), -1_200 * 10_000), (ledger.REVENUE, 1_200 * 10_000)])
        db.session.commit()
    res = runner.invoke(args=["payments", "sandbox-refund", out["payment_id"]])
    assert json.loads(res.output)["payment"]["status"] == "refunded"
    assert _balance(client, account) == 0
    with app.app_context():
        assert ledger.balance("adjust:refund_shortfall") == -200 * 10_000
    ledger_clean()


# --- webhook: signatures, replay, crash-safety ----------------------------------------------

def _pending_checkout(client, account, cents=400):
    out = _checkout(client, account, cents)
    return out, urlparse(out["url"]).path.rsplit("/", 1)[1]


def _session_event(session_id, payment_id, account_id, cents, evt="evt_manual_1", paid="paid"):
    return {"id": evt, "object": "event", "type": "checkout.session.completed", "created": int(time.time()),
            "data": {"object": {"id": session_id, "object": "checkout.session", "amount_total": cents,
                                "currency": "usd", "payment_status": paid, "payment_intent": "pi_x",
                                "metadata": {"payment_id": payment_id, "account_id": account_id}}}}


def _post_webhook(client, event, secret, ts=None, header=None):
    payload = json.dumps(event).encode()
    sig = header if header is not None else sign_payload(payload, secret, ts)
    return client.post("/api/pay/webhook", data=payload, headers={"Stripe-Signature": sig,
                                                                   "Content-Type": "application/json"})


def test_webhook_replay_forgery_and_stale(app, client, account, ledger_clean):
    out, sid = _pending_checkout(client, account)
    with app.app_context():
        secret = sandbox_webhook_secret()
    event = _session_event(sid, out["payment_id"], account.id, 400)
    r = _post_webhook(client, event, "whsec_forged")
    assert r.status_code == 401 and r.get_json()["error"] == "webhook_signature_invalid"
    r = _post_webhook(client, event, secret, ts=int(time.time()) - 301)
    assert r.status_code == 401 and r.get_json()["error"] == "webhook_signature_invalid"
    r = _post_webhook(client, event, secret, header="")
    assert r.status_code == 400
    r = client.post("/api/pay/webhook", data=b"{}")
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    assert "Stripe-Signature" in r.get_json()["message"]
    assert _balance(client, account) == 1000

    r = _post_webhook(client, event, secret)
    assert r.status_code == 200 and r.get_json()["outcome"] == "credited"
    r = _post_webhook(client, event, secret)  # exact replay
    assert r.status_code == 200 and r.get_json()["duplicate"] is True
    event2 = dict(event, id="evt_manual_2")  # same payment reported by another event
    assert _post_webhook(client, event2, secret).get_json()["outcome"] == "already_final"
    assert _balance(client, account) == 1400
    # A tampered body under a valid old signature fails.
    payload = json.dumps(event).encode()
    sig = sign_payload(payload, secret)
    r = client.post("/api/pay/webhook", data=payload.replace(b"400", b"900"), headers={"Stripe-Signature": sig})
    assert r.status_code == 401
    ledger_clean()


def test_webhook_amount_mismatch_credits_nothing(app, client, account, ledger_clean):
    out, sid = _pending_checkout(client, account, 400)
    with app.app_context():
        secret = sandbox_webhook_secret()
    r = _post_webhook(client, _session_event(sid, out["payment_id"], account.id, 40000), secret)
    assert r.get_json()["outcome"] == "amount_mismatch"
    assert _balance(client, account) == 1000
    ledger_clean()


def test_webhook_crash_after_event_insert_rolls_back(app, client, account, monkeypatch, ledger_clean):
    out, sid = _pending_checkout(client, account)
    with app.app_context():
        secret = sandbox_webhook_secret()
    event = _session_event(sid, out["payment_id"], account.id, 400, evt="evt_crash")

    def boom(*a, **kw):
        raise RuntimeError("process died mid-posting")

    monkeypatch.setattr(ledger, "post", boom)
    r = _post_webhook(client, event, secret)
    assert r.status_code == 500 and r.get_json()["error"] == "internal_error"
    monkeypatch.undo()
    with app.app_context():
        assert db.session.query(PaymentEvent).count() == 0
        assert db.session.get(Payment, out["payment_id"]).status == "pending"
        db.session.remove()
    assert _balance(client, account) == 1000
    # The processor retries the same event: now it applies, once.
    assert _post_webhook(client, event, secret).get_json()["outcome"] == "credited"
    assert _balance(client, account) == 1400
    ledger_clean()


def _refund_event(evt, payment_intent, cents_refunded, cents=400):
    return {"id": evt, "object": "event", "type": "charge.refunded", "created": int(time.time()),
            "data": {"object": {"id": "ch_" + evt, "object": "charge", "payment_intent": payment_intent,
                                "amount": cents, "amount_refunded": cents_refunded, "refunded": True}}}


def test_a_refund_that_arrives_before_its_payment_is_applied_when_the_payment_is(app, client, account,
                                                                                  ledger_clean):
    """Stripe does not order events and retries a failed delivery for days: a
    ``charge.refunded`` may come before the checkout's own ``checkout.session.completed``.
    It was stored as handled (``unknown_payment``, 200, never sent again), and the late
    completion then credited the full amount: the customer kept both. Now it is kept as
    ``refund_early`` and applied in the unit of work that credits the payment."""
    out, sid = _pending_checkout(client, account)
    with app.app_context():
        secret = sandbox_webhook_secret()
    r = _post_webhook(client, _refund_event("evt_refund_a", "pi_x", 150), secret)
    assert r.status_code == 200 and r.get_json()["outcome"] == "refund_early"
    r = _post_webhook(client, _refund_event("evt_refund_b", "pi_x", 400), secret)  # the rest, also early
    assert r.get_json()["outcome"] == "refund_early"
    r = _post_webhook(client, _session_event(sid, out["payment_id"], account.id, 400), secret)
    assert r.status_code == 200 and r.get_json()["outcome"] == "credited"
    assert _balance(client, account) == 1000  # credited 400, refunded 400
    hist = client.get("/api/pay/history", headers=account.headers).get_json()["payments"]
    assert (hist[0]["status"], hist[0]["refunded_cents"]) == ("refunded", 400)
    with app.app_context():
        rows = {e.event_id: (e.outcome, e.payment_id) for e in db.session.query(PaymentEvent)}
        db.session.remove()
    assert rows["evt_refund_a"][1] == rows["evt_refund_b"][1] == out["payment_id"]
    assert {rows["evt_refund_a"][0], rows["evt_refund_b"][0]} <= {"refunded", "already_refunded"}
    # a refund of someone else's payment intent stays early and touches nothing
    _post_webhook(client, _refund_event("evt_refund_c", "pi_other", 400), secret)
    assert _balance(client, account) == 1000
    ledger_clean()


def test_sandbox_event_cannot_credit_a_stripe_payment(app, client, account, ledger_clean):
    """Events signed with the sandbox secret only touch sandbox payments."""
    from app.ids import new_id

    with app.app_context():
        p = Payment(id=new_id("pay"), account_id=account.id, method="card", kind="checkout",
                    processor="stripe", amount_micros=5_000_000, provider_id="cs_live_real", status="pending")
        db.session.add(p)
        db.session.commit()
        pid = p.id
        secret = sandbox_webhook_secret()
    r = _post_webhook(client, _session_event("cs_live_real", pid, account.id, 500), secret)
    assert r.get_json()["outcome"] == "unknown_payment"
    assert _balance(client, account) == 1000
    ledger_clean()


def test_bola_other_accounts_objects(client, make_account):
    alice, bob = make_account(), make_account()
    _checkout(client, alice, 500)
    assert client.get("/api/pay/history", headers=bob.headers).get_json()["payments"] == []
    assert client.get("/pay/sandbox/checkout/cs_sbx_doesnotexist").status_code == 404
    assert client.post("/pay/sandbox/checkout/cs_sbx_doesnotexist", data={"action": "pay"}).status_code == 404


def test_charge_recorded_but_intent_id_lost_is_completed_by_webhook(app, client, account, ledger_clean):
    """A crash after the processor charged but before the intent id was stored: the
    processor's event names the payment in its metadata and credits it once."""
    from app.ids import new_id

    with app.app_context():
        p = Payment(id=new_id("pay"), account_id=account.id, method="card", kind="charge",
                    processor="sandbox", amount_micros=3_000_000, status="pending")
        db.session.add(p)
        db.session.commit()
        pid, secret = p.id, sandbox_webhook_secret()
    obj = {"id": "pi_sbx_lost", "object": "payment_intent", "amount": 300, "amount_received": 300,
           "currency": "usd", "metadata": {"payment_id": pid}}
    event = {"id": "evt_lost_1", "object": "event", "type": "payment_intent.succeeded",
             "created": int(time.time()), "data": {"object": obj}}
    assert _post_webhook(client, event, secret).get_json()["outcome"] == "credited"
    assert _post_webhook(client, dict(event, id="evt_lost_2"), secret).get_json()["outcome"] == "already_final"
    assert _balance(client, account) == 1300
    ledger_clean()


def test_a_card_funding_that_needs_3ds_says_how_to_pay_with_that_card(client, account, ledger_clean):
    """An off-session charge cannot run 3-D Secure: the 402 says so and points to the hosted
    checkout, where the customer can authenticate (before, it only said that the payment
    requires authentication, with no way to give it)."""
    r = _fund(client, account, 500, "card", with_method="pm_card_authenticationRequired")
    body = r.get_json()
    assert r.status_code == 402 and body["decline_code"] == "authentication_required"
    assert "POST /api/pay/checkout" in body["message"]
    assert client.get("/api/account", headers=account.headers).get_json()["balance_cents"] == 1000
    ledger_clean()
