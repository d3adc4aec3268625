"""Saved payment methods (``/api/pay/methods``): every saved method listed with the default
marked, made the default again, removed (detached at Stripe first); removing the default
leaves none, so funding by card answers ``no_payment_method``."""
from __future__ import annotations

from tests.api.test_payments_stripe import stripe_api  # noqa: F401


def _save(client, acct, pm):
    r = client.post("/api/pay/method", json={"payment_method_id": pm}, headers=acct.headers)
    assert r.status_code == 200, r.get_json()


def _listed(client, acct):
    r = client.get("/api/pay/methods", headers=acct.headers)
    assert r.status_code == 200
    return [(m["payment_method_id"], m["default"]) for m in r.get_json()["methods"]]


def test_list_default_remove(client, make_account, ledger_clean):
    acct, other = make_account(plan="enterprise"), make_account()
    assert _listed(client, acct) == []
    _save(client, acct, "pm_card_visa")
    _save(client, acct, "pm_card_mastercard")
    _save(client, acct, "pm_card_mastercard")  # saved once
    assert _listed(client, acct) == [("pm_card_visa", False), ("pm_card_mastercard", True)]
    r = client.post("/api/pay/methods/pm_card_visa/default", headers=acct.headers)
    assert r.status_code == 200 and r.get_json()["payment_method_id"] == "pm_card_visa"
    assert _listed(client, acct) == [("pm_card_visa", True), ("pm_card_mastercard", False)]
    # Another account's method, or one never saved: 404, nothing changes.
    assert client.post("/api/pay/methods/pm_card_visa/default", headers=other.headers).status_code == 404
    assert client.delete("/api/pay/methods/pm_card_visa", headers=other.headers).status_code == 404
    assert client.delete("/api/pay/methods/pm_card_chargeDeclined", headers=acct.headers).status_code == 404
    r = client.delete("/api/pay/methods/pm_card_mastercard", headers=acct.headers)
    assert r.status_code == 200 and r.get_json() == {"deleted": True}
    assert _listed(client, acct) == [("pm_card_visa", True)]
    fund = client.post("/api/wallet/fund", json={"amount_cents": 100, "method": "card"}, headers=acct.headers)
    assert fund.status_code == 200
    # Removing the default leaves none.
    assert client.delete("/api/pay/methods/pm_card_visa", headers=acct.headers).status_code == 200
    assert _listed(client, acct) == []
    fund = client.post("/api/wallet/fund", json={"amount_cents": 100, "method": "card"}, headers=acct.headers)
    assert fund.status_code == 409 and fund.get_json()["error"] == "no_payment_method"
    ledger_clean()


def test_stripe_remove_detaches_first(client, account, stripe_api, ledger_clean):
    _save(client, account, "pm_card_visa")
    assert client.delete("/api/pay/methods/pm_card_visa", headers=account.headers).status_code == 200
    assert ("POST", "/v1/payment_methods/pm_card_visa/detach") in [(m, p) for m, p, _ in stripe_api.requests]
    assert _listed(client, account) == []
    ledger_clean()


def test_removing_a_method_again_answers_as_the_first_time(client, make_account, stripe_api, ledger_clean):
    """A retried DELETE whose first answer was lost: 200 with the same body, nothing detached
    or recorded twice (docs/decisions.md "Deleting twice answers as the first time")."""
    acct, other = make_account(test_key=True), make_account()
    _save(client, acct, "pm_card_visa")
    for _ in range(2):
        r = client.delete("/api/pay/methods/pm_card_visa", headers=acct.headers)
        assert r.status_code == 200 and r.get_json() == {"deleted": True}
    assert [p for m, p, _ in stripe_api.requests if p.endswith("/detach")] == ["/v1/payment_methods/pm_card_visa/detach"]
    log = client.get("/api/audit", headers=acct.headers).get_json()["entries"]
    assert [e["action"] for e in log].count("method.remove") == 1
    # Not the caller's, or of the other mode: nothing of theirs was removed.
    assert client.delete("/api/pay/methods/pm_card_visa", headers=other.headers).status_code == 404
    test_headers = {"Authorization": f"Bearer {acct.test_key}"}
    assert client.delete("/api/pay/methods/pm_card_visa", headers=test_headers).status_code == 404
    ledger_clean()
