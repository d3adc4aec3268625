"""Saving the card used at a hosted checkout (``save_method``): Stripe's
``setup_future_usage=off_session`` on a session of the account's customer, the method read from
the paid intent and saved as the default once; the sandbox does the same with the method picked
on its page. The saved method is listed, can be removed, and auto top-up can use it."""
from __future__ import annotations

from urllib.parse import urlparse

from tests.api.test_payments_stripe import _deliver, stripe_api  # noqa: F401


def _methods(client, acct):
    return client.get("/api/pay/methods", headers=acct.headers).get_json()["methods"]


def _topup(client, acct):
    return client.put("/api/pay/auto-topup", json={"threshold_cents": 100, "amount_cents": 500,
                                                   "monthly_cap_cents": 5000}, headers=acct.headers)


def test_sandbox_checkout_saves_the_card_it_was_paid_with(client, make_account, ledger_clean):
    acct = make_account()
    plain = client.post("/api/pay/checkout", json={"amount_cents": 300}, headers=acct.headers).get_json()
    client.post(urlparse(plain["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    assert _methods(client, acct) == []  # not asked: nothing saved
    assert _topup(client, acct).status_code == 409
    out = client.post("/api/pay/checkout", json={"amount_cents": 500, "save_method": True},
                      headers=acct.headers).get_json()
    r = client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_card_mastercard"})
    assert r.status_code == 200
    saved = _methods(client, acct)
    assert [(m["payment_method_id"], m["default"], m["last4"]) for m in saved] == [
        ("pm_card_mastercard", True, "4444")]
    assert _topup(client, acct).get_json()["method"]["payment_method_id"] == "pm_card_mastercard"
    assert client.delete("/api/pay/methods/pm_card_mastercard", headers=acct.headers).status_code == 200
    assert _methods(client, acct) == []
    ledger_clean()


def test_stripe_checkout_sets_up_future_usage_and_saves_the_intents_method_once(client, account, stripe_api,
                                                                                ledger_clean):
    out = client.post("/api/pay/checkout", json={"amount_cents": 1200, "save_method": True},
                      headers=account.headers).get_json()
    params = next(x for x in stripe_api.requests if x[1] == "/v1/checkout/sessions")[2]
    assert params["payment_intent_data"]["setup_future_usage"] == "off_session"
    assert params["customer"].startswith("cus_")  # a card is saved on the account's customer
    stripe_api.intents["pi_save_1"] = {"id": "pi_save_1", "payment_method": "pm_card_visa", "status": "succeeded"}
    obj = {"id": out["url"].rsplit("/", 1)[1], "object": "checkout.session", "amount_total": 1200,
           "currency": "usd", "payment_status": "paid", "payment_intent": "pi_save_1",
           "metadata": params["metadata"]}
    assert _deliver(client, stripe_api, stripe_api.event("checkout.session.completed", obj)).get_json()[
        "outcome"] == "credited"
    assert _deliver(client, stripe_api, stripe_api.event("checkout.session.completed", obj)).get_json()[
        "outcome"] == "already_final"
    assert [(m["payment_method_id"], m["default"]) for m in _methods(client, account)] == [("pm_card_visa", True)]
    retrieved = [p for m, p, _ in stripe_api.requests if m == "GET" and p == "/v1/payment_intents/pi_save_1"]
    assert len(retrieved) == 1  # saved once, not again for the second event
    attach = [p for m, p, _ in stripe_api.requests if p == "/v1/payment_methods/pm_card_visa/attach"]
    assert attach and _topup(client, account).status_code == 200
    # without save_method, no setup_future_usage
    client.post("/api/pay/checkout", json={"amount_cents": 300}, headers=account.headers)
    last = [x for x in stripe_api.requests if x[1] == "/v1/checkout/sessions"][-1][2]
    assert "setup_future_usage" not in last["payment_intent_data"]
    ledger_clean()


def test_the_sandbox_pages_save_box_marks_the_checkout_like_the_api_flag(app, client, make_account, ledger_clean):
    """One path saves a checkout's card: the sandbox page's "save" box marks the checkout as
    the API's ``save_method`` does, and ``checkouts.save_paid_method`` saves it after the
    credit, once (``meta.saved_method``). A bank debit that settles later is saved when it
    settles, not when it is submitted (the box used to save at once, before any credit)."""
    from app.extensions import db
    from app.models import Payment
    from app.services.billing import sandbox_checkout

    acct = make_account()
    out = client.post("/api/pay/checkout", json={"amount_cents": 400}, headers=acct.headers).get_json()
    r = client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_usBankAccount",
                                                     "save_method": "true"})
    assert r.status_code == 200 and _methods(client, acct) == []  # submitted, not credited: nothing saved yet
    with app.app_context():
        pay_id = db.session.query(Payment).filter_by(account_id=acct.id, kind="checkout").one().id
        sandbox_checkout.sandbox_settle(pay_id)
        db.session.remove()
    assert [m["payment_method_id"] for m in _methods(client, acct)] == ["pm_usBankAccount"]
    # the box alone, a card: saved by the same path, recorded once on the payment
    out = client.post("/api/pay/checkout", json={"amount_cents": 300}, headers=acct.headers).get_json()
    client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa",
                                                 "save_method": "true"})
    with app.app_context():
        pay = db.session.query(Payment).filter_by(provider_id=urlparse(out["url"]).path.rsplit("/", 1)[1]).one()
        assert (pay.status, pay.meta["save_method"], pay.meta["saved_method"]) == ("succeeded", True, "pm_card_visa")
        db.session.remove()
    assert [(m["payment_method_id"], m["default"]) for m in _methods(client, acct) if m["default"]] == [
        ("pm_card_visa", True)]
    ledger_clean()


def test_save_method_must_be_a_json_boolean(client, account):
    """The document says ``boolean``: ``0``, ``1`` or ``"yes"`` are refused (400), not read as
    marshmallow's truthy/falsy spellings (schemathesis ST201: ``"save_method": 0`` made a
    checkout)."""
    for value in (0, 1, "true", "yes", None, []):
        r = client.post("/api/pay/checkout", json={"amount_cents": 300, "save_method": value},
                        headers=account.headers)
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", value
    assert client.get("/api/pay/history", headers=account.headers).get_json()["payments"] == []
