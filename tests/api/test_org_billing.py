"""Organisations get the billing features of an account (issue 41): `org_id` on the payment
history, the saved methods (list, default, remove), auto top-up (set, read, delete) and a
pending checkout (resume, cancel), with the roles of `billing:read` / `billing:write`; and
an organisation's auto top-up fires when an organisation key's call takes the
organisation's balance under its threshold, charging the organisation's saved card."""
from __future__ import annotations

import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import Account, AutoTopupRun, OutboxMessage
from app.services.billing import autotopup
from tests.api.test_auto_topup import concurrent_calls
from tests.gateway_helpers import balance_cents, create_module, provider, provider_server  # noqa: F401
from tests.orgkit import fund, h, join, make_org, org_key
from tests.support.errors import error_code

RULE = {"threshold_cents": 500, "amount_cents": 2000, "monthly_cap_cents": 10_000}


@pytest.fixture
def team(app, client, make_account):
    """An organisation of ``owner`` with a billing, an admin and a developer member, and an
    outsider; the owner's personal account has a card of its own."""
    owner, billing, admin, dev, outsider = (make_account(cents=1000, plan="enterprise") for _ in range(5))
    org = make_org(client, owner)["id"]
    for acct, role in ((billing, "billing"), (admin, "admin"), (dev, "developer")):
        join(app, org, acct, role)
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_usBankAccount"}, headers=owner.headers)
    assert r.status_code == 200
    return {"org": org, "owner": owner, "billing": billing, "admin": admin, "dev": dev, "outsider": outsider}


def _methods(client, acct, org=None):
    r = client.get("/api/pay/methods", query_string={"org_id": org} if org else {}, headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return [(m["payment_method_id"], m["default"]) for m in r.get_json()["methods"]]


def test_saved_methods_of_an_organisation_are_its_own(client, team):
    org, owner = team["org"], team["owner"]
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa", "org_id": org},
                    headers=owner.headers)
    assert r.status_code == 200
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_card_mastercard", "org_id": org},
                    headers=team["billing"].headers)
    assert r.status_code == 200
    # the organisation's methods with org_id (this ignored org_id and listed the person's)
    assert _methods(client, owner, org) == [("pm_card_visa", False), ("pm_card_mastercard", True)]
    assert _methods(client, owner) == [("pm_usBankAccount", True)]
    assert _methods(client, team["admin"], org) == _methods(client, team["billing"], org)  # billing:read
    # the default again, then removal, on the organisation's methods
    r = client.post("/api/pay/methods/pm_card_visa/default", query_string={"org_id": org},
                    headers=team["billing"].headers)
    assert r.status_code == 200 and r.get_json()["last4"] == "4242"
    assert _methods(client, owner, org) == [("pm_card_visa", True), ("pm_card_mastercard", False)]
    assert client.delete("/api/pay/methods/pm_card_mastercard", headers=owner.headers).status_code == 404
    r = client.delete("/api/pay/methods/pm_card_mastercard", query_string={"org_id": org}, headers=owner.headers)
    assert r.status_code == 200 and r.get_json() == {"deleted": True}
    assert _methods(client, owner, org) == [("pm_card_visa", True)]
    assert _methods(client, owner) == [("pm_usBankAccount", True)]


def test_roles_and_outsiders_on_the_organisation_billing_routes(client, team):
    org, owner = team["org"], team["owner"]
    assert client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa", "org_id": org},
                       headers=owner.headers).status_code == 200
    assert client.put("/api/pay/auto-topup", json={**RULE, "org_id": org}, headers=owner.headers).status_code == 200
    q = {"org_id": org}
    reads = [("get", "/api/pay/history"), ("get", "/api/pay/methods"), ("get", "/api/pay/auto-topup")]
    writes = [("post", "/api/pay/methods/pm_card_visa/default"), ("delete", "/api/pay/methods/pm_card_visa"),
              ("delete", "/api/pay/auto-topup")]
    for method, path in reads:  # admin reads; a developer may not (billing:read: owner, admin, billing, viewer)
        assert getattr(client, method)(path, query_string=q, headers=team["admin"].headers).status_code == 200
        r = getattr(client, method)(path, query_string=q, headers=team["dev"].headers)
        assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required", path
    for method, path in reads + writes:  # not a member: 404 like an organisation that does not exist
        r = getattr(client, method)(path, query_string=q, headers=team["outsider"].headers)
        assert r.status_code == 404, path
        r = getattr(client, method)(path, query_string={"org_id": "acct_nosuchorg"}, headers=owner.headers)
        assert r.status_code == 404, path
    for method, path in writes:  # billing:write is owner and billing: the admin is refused
        r = getattr(client, method)(path, query_string=q, headers=team["admin"].headers)
        assert r.status_code == 403 and r.get_json()["roles"] == ["owner", "billing"], path
    r = client.put("/api/pay/auto-topup", json={**RULE, "threshold_cents": 100, "org_id": org},
                   headers=team["admin"].headers)
    assert r.status_code == 403 and r.get_json()["roles"] == ["owner", "billing"]
    r = client.put("/api/pay/auto-topup", json={**RULE, "org_id": org}, headers=team["outsider"].headers)
    assert r.status_code == 404
    # the refusals changed nothing
    rule = client.get("/api/pay/auto-topup", query_string=q, headers=owner.headers).get_json()
    assert rule["threshold_cents"] == 500 and rule["method"]["payment_method_id"] == "pm_card_visa"
    assert _methods(client, owner, org) == [("pm_card_visa", True)]
    # the owner's personal account has no rule; the billing member deletes the organisation's
    assert client.get("/api/pay/auto-topup", headers=owner.headers).status_code == 404
    assert client.delete("/api/pay/auto-topup", query_string=q, headers=team["billing"].headers).status_code == 200
    assert client.get("/api/pay/auto-topup", query_string=q, headers=owner.headers).status_code == 404


def test_an_organisation_checkout_is_resumed_canceled_and_listed_with_org_id(client, team):
    org, billing = team["org"], team["billing"]
    r = client.post("/api/pay/checkout", json={"amount_cents": 1500, "org_id": org}, headers=billing.headers)
    assert r.status_code == 200
    pid = r.get_json()["payment_id"]
    q = {"org_id": org}
    # the person's own account has no such checkout
    assert client.get(f"/api/pay/checkout/{pid}", headers=billing.headers).status_code == 404
    assert client.post(f"/api/pay/checkout/{pid}/cancel", headers=billing.headers).status_code == 404
    assert [p["id"] for p in client.get("/api/pay/history", headers=billing.headers).get_json()["payments"]] == []
    r = client.get(f"/api/pay/checkout/{pid}", query_string=q, headers=team["admin"].headers)
    assert r.status_code == 200 and r.get_json()["status"] == "pending" and r.get_json()["url"]
    r = client.post(f"/api/pay/checkout/{pid}/cancel", query_string=q, headers=team["admin"].headers)
    assert r.status_code == 403  # admin: billing:read only
    r = client.post(f"/api/pay/checkout/{pid}/cancel", query_string=q, headers=team["outsider"].headers)
    assert r.status_code == 404
    r = client.post(f"/api/pay/checkout/{pid}/cancel", query_string=q, headers=billing.headers)
    assert r.status_code == 200 and r.get_json()["status"] == "canceled"
    hist = client.get("/api/pay/history", query_string=q, headers=team["owner"].headers).get_json()["payments"]
    assert [(p["id"], p["status"], p["amount_cents"]) for p in hist] == [(pid, "canceled", 1500)]


def test_an_organisation_key_acts_on_its_organisation_without_org_id(client, team):
    org, owner = team["org"], team["owner"]
    key = org_key(client, owner, org)["key"]
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=h(key))
    assert r.status_code == 200
    assert [m["payment_method_id"] for m in client.get("/api/pay/methods", headers=h(key)).get_json()["methods"]] \
        == ["pm_card_visa"]
    assert _methods(client, owner, org) == [("pm_card_visa", True)]
    # an organisation key names no other organisation
    other = make_org(client, owner, "Other")["id"]
    assert client.get("/api/pay/methods", query_string={"org_id": other}, headers=h(key)).status_code == 404


def test_org_key_calls_crossing_the_org_threshold_top_up_the_org_once(app, client, team, provider,  # noqa: F811
                                                                      ledger_clean):
    org, owner, dev = team["org"], team["owner"], team["dev"]
    fund(app, org, 1000, plan="enterprise")
    create_module(app, "meter", provider, {"ok": (40, "/ok", 30.0)})  # a loaded machine: no timeouts
    assert client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa", "org_id": org},
                       headers=owner.headers).status_code == 200
    r = client.put("/api/pay/auto-topup", json={**RULE, "org_id": org}, headers=team["billing"].headers)
    assert r.status_code == 200 and r.get_json()["method"]["last4"] == "4242"
    key = org_key(client, dev, org)["key"]
    dev_before = balance_cents(app, dev.id)

    ok = concurrent_calls(app, h(key))
    left = 1000 - ok * 40
    assert balance_cents(app, org) == left < 500
    with app.app_context():  # the organisation's charge queued one run of the organisation
        runs = db.session.execute(select(AutoTopupRun.account_id, AutoTopupRun.status)).all()
        db.session.remove()
    assert [tuple(r) for r in runs] == [(org, "queued")]
    with app.app_context():  # the schedule's autotopup-start (jobs run inline in the suite)
        assert autotopup.start_due() == 1
        db.session.remove()
    assert balance_cents(app, org) == left + 2000
    assert balance_cents(app, dev.id) == dev_before  # the member's own balance is not touched
    hist = client.get("/api/pay/history", query_string={"org_id": org}, headers=owner.headers).get_json()["payments"]
    assert [(p["product"], p["amount_cents"], p["status"]) for p in hist] == [("Auto top-up", 2000, "succeeded")]
    view = client.get("/api/pay/auto-topup", query_string={"org_id": org}, headers=owner.headers).get_json()
    assert view["month_cents"] == 2000 and [r["status"] for r in view["runs"]] == ["succeeded"]
    ledger_clean()


def test_an_organisation_rule_disabled_after_declines_tells_its_owners_and_billing(app, client, team,
                                                                                   monkeypatch, ledger_clean):
    org, owner, billing = team["org"], team["owner"], team["billing"]
    fund(app, org, 400)
    monkeypatch.setitem(app.config, "AUTOTOPUP_MAX_FAILURES", 1)
    assert client.post("/api/pay/method", json={"payment_method_id": "pm_card_chargeDeclined", "org_id": org},
                       headers=owner.headers).status_code == 200
    assert client.put("/api/pay/auto-topup", json={**RULE, "org_id": org}, headers=owner.headers).status_code == 200
    view = client.get("/api/pay/auto-topup", query_string={"org_id": org}, headers=owner.headers).get_json()
    assert view["enabled"] is False and [r["status"] for r in view["runs"]] == ["failed"]
    with app.app_context():
        mails = db.session.execute(select(OutboxMessage.destination, OutboxMessage.payload).where(
            OutboxMessage.account_id == org)).all()
        emails = [db.session.get(Account, a.id).email for a in (owner, billing)]
        db.session.remove()
    told = sorted(to for to, payload in mails if payload["subject"] == "Auto top-up disabled")
    assert told == sorted(emails)  # the owner and the billing member; not the admin or the developer
    assert balance_cents(app, org) == 400
    ledger_clean()


def test_the_organisation_wallet_is_connected_and_read_with_org_id(app, client, team):
    """A billing member holds no organisation key (`keys:write` is not theirs), so the
    organisation's wallet and ledger entries are reached with `org_id`, as the console's
    billing page does: `org_id` was ignored and the person's own wallet answered."""
    from eth_account import Account as EthAccount
    from eth_account.messages import encode_defunct

    from app.services.billing import wallets

    org, billing = team["org"], team["billing"]
    fund(app, org, 700)
    q = {"org_id": org}
    r = client.get("/api/wallet/balance", query_string=q, headers=billing.headers)
    assert r.status_code == 200 and r.get_json()["credits_cents"] == 700 and r.get_json()["connected"] is False
    r = client.get("/api/wallet/transactions", query_string=q, headers=team["admin"].headers)  # billing:read
    assert r.status_code == 200
    assert [(t["kind"], t["amount_cents"]) for t in r.get_json()["transactions"]] == [("test_grant", 700)]
    own = client.get("/api/wallet/transactions", headers=billing.headers).get_json()["transactions"]
    assert all(t["amount_cents"] != 700 for t in own)
    for path in ("/api/wallet/balance", "/api/wallet/transactions"):
        r = client.get(path, query_string=q, headers=team["dev"].headers)
        assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required", path
        assert client.get(path, query_string=q, headers=team["outsider"].headers).status_code == 404, path

    eth = EthAccount.create()
    r = client.get("/api/wallet/connect/message", query_string={"chain": "base", "address": eth.address, **q},
                   headers=team["admin"].headers)
    assert r.status_code == 403  # billing:write: owner, billing
    r = client.get("/api/wallet/connect/message", query_string={"chain": "base", "address": eth.address, **q},
                   headers=billing.headers)
    assert r.status_code == 200, r.get_json()
    sig = eth.sign_message(encode_defunct(text=r.get_json()["message"])).signature.hex()
    r = client.post("/api/wallet/connect", json={"chain": "base", "address": eth.address,
                                                 "signature": "0x" + sig.removeprefix("0x"), "org_id": org},
                    headers=billing.headers)
    assert r.status_code == 200, r.get_json()
    with app.app_context():
        assert wallets.get_wallet(org).address == eth.address
        assert wallets.get_wallet(billing.id) is None
        db.session.remove()


def test_the_organisation_payouts_are_managed_with_org_id(client, team):
    """An organisation that owns modules earns (docs/payments.md, "Payouts"); its billing
    member holds no organisation key, so its earnings, payout destination and payouts are
    reached with `org_id` (owner, billing write; admin, viewer read): `org_id` was ignored
    and the person's own destination was set."""
    org, billing = team["org"], team["billing"]
    q = {"org_id": org}
    r = client.put("/api/payouts/destination/stripe_connect", json={"account": "acct_orgpay01", "org_id": org},
                   headers=billing.headers)
    assert r.status_code == 200, r.get_json()
    assert client.get("/api/payouts/destination", headers=billing.headers).status_code == 404  # the person's: none
    r = client.get("/api/payouts/destination", query_string=q, headers=team["admin"].headers)
    assert r.status_code == 200 and r.get_json()["account"] == "acct_orgpay01", r.get_json()
    for path in ("/api/earnings", "/api/payouts"):
        assert client.get(path, query_string=q, headers=team["admin"].headers).status_code == 200, path
        r = client.get(path, query_string=q, headers=team["dev"].headers)
        assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required", path
        assert client.get(path, query_string=q, headers=team["outsider"].headers).status_code == 404, path
    r = client.post("/api/payouts", query_string=q, headers=team["admin"].headers)
    assert r.status_code == 403  # billing:write: owner, billing
    r = client.post("/api/payouts", query_string=q, headers=billing.headers)
    assert r.status_code == 409 and error_code(r.get_json()) == "below_payout_minimum", r.get_json()
    r = client.delete("/api/payouts/destination", query_string=q, headers=team["owner"].headers)
    assert r.status_code == 200
    assert client.get("/api/payouts/destination", query_string=q, headers=billing.headers).status_code == 404


def test_an_org_key_of_a_budgeted_member_cannot_set_the_money_settings(app, client, team, make_account):
    """An organisation key's charges count under its member's monthly budget as well as under
    its own spend limit, so a budgeted member's key is a bounded credential like a limited
    key: it may not set auto top-up nor the payout destination (403 ``beyond_own_limits``
    naming the budget, nothing set); it may still turn auto top-up off. Without the budget the
    same key sets both; the member's personal key with ``org_id`` is not bounded by the budget
    (its own spend is personal) and sets them too (docs/decisions.md "Money settings need a
    key without a spend limit"). Before, the budget was not looked at. (Only owners' keys reach
    billing:write: a billing member cannot create keys, so the budgeted member is a second
    owner, whose budget another owner sets.)"""
    org, owner = team["org"], team["owner"]
    second = make_account(cents=1000, plan="enterprise")
    join(app, org, second, "owner")
    assert client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa", "org_id": org},
                       headers=owner.headers).status_code == 200
    key = h(org_key(client, second, org)["key"])
    r = client.patch(f"/api/orgs/{org}/members/{second.id}", json={"monthly_budget_cents": 500},
                     headers=owner.headers)
    assert r.status_code == 200, r.get_json()
    r = client.put("/api/pay/auto-topup", json=RULE, headers=key)
    assert r.status_code == 403 and error_code(r.get_json()) == "beyond_own_limits", r.get_json()
    assert "monthly budget of 500 cents" in r.get_json()["message"], r.get_json()
    r = client.put("/api/payouts/destination/stripe_connect", json={"account": "acct_budget01"}, headers=key)
    assert r.status_code == 403 and error_code(r.get_json()) == "beyond_own_limits", r.get_json()
    q = {"org_id": org}
    assert client.get("/api/pay/auto-topup", query_string=q, headers=owner.headers).status_code == 404
    assert client.get("/api/payouts/destination", query_string=q, headers=owner.headers).status_code == 404
    # the member's personal key, acting on the organisation, is not the budgeted credential
    r = client.put("/api/pay/auto-topup", json={**RULE, "org_id": org}, headers=second.headers)
    assert r.status_code == 200, r.get_json()
    assert client.delete("/api/pay/auto-topup", headers=key).status_code == 200  # turning it off stays allowed
    # no budget: the same organisation key sets both
    r = client.patch(f"/api/orgs/{org}/members/{second.id}", json={"monthly_budget_cents": None},
                     headers=owner.headers)
    assert r.status_code == 200, r.get_json()
    assert client.put("/api/pay/auto-topup", json=RULE, headers=key).status_code == 200
    r = client.put("/api/payouts/destination/stripe_connect", json={"account": "acct_budget01"}, headers=key)
    assert r.status_code == 200, r.get_json()
