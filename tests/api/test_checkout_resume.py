"""Resume or cancel a pending checkout (``GET /api/pay/checkout/{id}``, ``POST
/api/pay/checkout/{id}/cancel``): the sandbox and Stripe (the stand-in's sessions), a paid or
submitted checkout cannot be canceled, another account's checkout is not found."""
from __future__ import annotations

from urllib.parse import urlparse

from tests.api.test_payments_stripe import stripe_api  # noqa: F401


def _balance(client, acct):
    return client.get("/api/account", headers=acct.headers).get_json()["balance_cents"]


def _checkout(client, acct, cents=500):
    r = client.post("/api/pay/checkout", json={"amount_cents": cents}, headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def _cancel(client, acct, pid):
    return client.post(f"/api/pay/checkout/{pid}/cancel", headers=acct.headers)


def test_sandbox_resume_then_cancel(client, make_account, ledger_clean):
    acct, other = make_account(), make_account()
    out = _checkout(client, acct)
    r = client.get(f"/api/pay/checkout/{out['payment_id']}", headers=acct.headers)
    assert r.status_code == 200
    assert r.get_json()["url"] == out["url"] and r.get_json()["status"] == "pending"
    assert client.get(f"/api/pay/checkout/{out['payment_id']}", headers=other.headers).status_code == 404
    assert _cancel(client, other, out["payment_id"]).status_code == 404
    r = _cancel(client, acct, out["payment_id"])
    assert r.status_code == 200 and r.get_json()["status"] == "canceled"
    assert client.get(f"/api/pay/checkout/{out['payment_id']}", headers=acct.headers).get_json()["url"] is None
    r = _cancel(client, acct, out["payment_id"])
    assert r.status_code == 409 and r.get_json()["error"] == "checkout_not_cancelable"
    page = urlparse(out["url"]).path
    assert b"already canceled" in client.post(page, data={"action": "pay", "payment_method": "pm_card_visa"}).data
    assert _balance(client, acct) == 1000
    ledger_clean()


def test_a_paid_or_submitted_checkout_cannot_be_canceled(client, account, ledger_clean):
    paid = _checkout(client, account)
    client.post(urlparse(paid["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    r = _cancel(client, account, paid["payment_id"])
    assert r.status_code == 409 and r.get_json()["error"] == "checkout_not_cancelable"
    bank = _checkout(client, account)
    client.post(urlparse(bank["url"]).path, data={"action": "pay", "payment_method": "pm_usBankAccount"})
    assert _cancel(client, account, bank["payment_id"]).status_code == 409
    assert client.get(f"/api/pay/checkout/{bank['payment_id']}", headers=account.headers).get_json()["url"] is None
    assert _balance(client, account) == 1500
    # A payment that is not a checkout is not found here.
    client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=account.headers)
    fund = client.post("/api/wallet/fund", json={"amount_cents": 100, "method": "card"}, headers=account.headers)
    assert client.get(f"/api/pay/checkout/{fund.get_json()['payment_id']}", headers=account.headers).status_code == 404
    ledger_clean()


def test_stripe_resume_and_cancel_expire_the_session(client, account, stripe_api, ledger_clean):
    out = _checkout(client, account)
    session_id = out["url"].rsplit("/", 1)[1]
    r = client.get(f"/api/pay/checkout/{out['payment_id']}", headers=account.headers)
    assert r.get_json()["url"] == out["url"]
    assert ("GET", f"/v1/checkout/sessions/{session_id}") in [(m, p) for m, p, _ in stripe_api.requests]
    r = _cancel(client, account, out["payment_id"])
    assert r.status_code == 200 and r.get_json()["status"] == "canceled"
    assert stripe_api.sessions[session_id]["status"] == "expired"
    # A session the customer completed at Stripe meanwhile is not canceled: it stays pending
    # until its webhook credits it.
    done = _checkout(client, account)
    stripe_api.sessions[done["url"].rsplit("/", 1)[1]]["status"] = "complete"
    r = _cancel(client, account, done["payment_id"])
    assert r.status_code == 409 and r.get_json()["error"] == "checkout_not_cancelable"
    hist = {p["id"]: p["status"] for p in client.get("/api/pay/history", headers=account.headers).get_json()["payments"]}
    assert hist == {out["payment_id"]: "canceled", done["payment_id"]: "pending"}
    ledger_clean()


def test_a_sandbox_checkout_past_its_expiry_is_expired_as_stripe_would_report_it(client, app, make_account,
                                                                                 ledger_clean):
    """Stripe sends ``checkout.session.expired`` when a session's time is up; the sandbox did
    not, so an unpaid checkout stayed ``pending`` in the history for ever and its cancel read
    "is pending; it can no longer be canceled"."""
    from datetime import timedelta

    from app.extensions import db
    from app.models import Payment
    from app.models.base import utcnow
    from app.tasks import billing

    acct = make_account()
    old, fresh = _checkout(client, acct), _checkout(client, acct)
    with app.app_context():
        db.session.get(Payment, old["payment_id"]).expires_at = utcnow() - timedelta(seconds=1)
        db.session.commit()
        r = _cancel(client, acct, old["payment_id"])
        assert r.status_code == 409 and "expired" in r.get_json()["message"]
        assert billing.expire_sandbox_checkouts() == 1
        assert billing.expire_sandbox_checkouts() == 0
        db.session.remove()
    history = {p["id"]: p["status"] for p in
               client.get("/api/pay/history", headers=acct.headers).get_json()["payments"]}
    assert history == {old["payment_id"]: "expired", fresh["payment_id"]: "pending"}
    state = client.get(f"/api/pay/checkout/{old['payment_id']}", headers=acct.headers).get_json()
    assert state["status"] == "expired" and state["url"] is None
    assert _balance(client, acct) == 1000
    ledger_clean()


def test_a_3ds_card_at_the_sandbox_checkout_asks_to_authenticate_and_can_fail(client, make_account, ledger_clean):
    """Stripe Checkout shows a 3-D Secure challenge for a card that requires authentication;
    the sandbox paid it at once, so neither the challenge nor a failed authentication could
    be tried. Now: Pay shows the challenge (nothing charged), failing it leaves the checkout
    open with Stripe's message, completing it pays (and saves the card when asked)."""
    acct = make_account()
    out = _checkout(client, acct, 700)
    page = urlparse(out["url"]).path
    pay = {"action": "pay", "payment_method": "pm_card_authenticationRequired", "save_method": "true"}
    r = client.post(page, data=pay)
    assert r.status_code == 200 and b"Complete authentication" in r.data and b"Fail authentication" in r.data
    assert client.get(f"/api/pay/checkout/{out['payment_id']}", headers=acct.headers).get_json()["status"] == "pending"
    r = client.post(page, data={**pay, "action": "fail_authentication"})
    assert b"unable to authenticate" in r.data and b'value="pay"' in r.data  # still open: choose again
    assert _balance(client, acct) == 1000
    r = client.post(page, data={**pay, "action": "authenticate"})
    assert b"Payment succeeded" in r.data
    assert client.get(f"/api/pay/checkout/{out['payment_id']}", headers=acct.headers).get_json()["status"] == "succeeded"
    assert _balance(client, acct) == 1700
    methods = client.get("/api/pay/methods", headers=acct.headers).get_json()["methods"]
    assert [m["payment_method_id"] for m in methods] == ["pm_card_authenticationRequired"]
    ledger_clean()


def test_the_expiry_job_leaves_sandbox_checkouts_alone_with_the_sandbox_off(client, app, make_account, monkeypatch):
    from datetime import timedelta

    from app.extensions import db
    from app.models import Payment
    from app.models.base import utcnow
    from app.tasks import billing

    acct = make_account()
    out = _checkout(client, acct)
    with app.app_context():
        db.session.get(Payment, out["payment_id"]).expires_at = utcnow() - timedelta(seconds=1)
        db.session.commit()
        monkeypatch.setitem(app.config, "PAYMENTS_SANDBOX_ENABLED", False)
        assert billing.expire_sandbox_checkouts() == 0  # no sandbox event could verify: nothing tried
        db.session.remove()
