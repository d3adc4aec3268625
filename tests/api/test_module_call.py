"""SPEC endpoint 1: POST /v1/module/{slug}/call — statuses, charging, refunds, 402,
idempotency, test mode, revenue share, provider auth, limits."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from app.extensions import db
from app.models import IdempotencyRecord, LedgerEntry, ModuleCall
from app.services.money import ledger
from tests.gateway_helpers import (PROVIDER, PROVIDER_SECRET, balance_cents, call,  # noqa: F401
                                   create_module, mod, provider, provider_server)
from tests.support.finalize import drain
from tests.support.procs import free_port


def calls_of(app, account_id):
    drain(app)  # the calls answered so far are finalized (deferred finalize)
    with app.app_context():
        rows = db.session.execute(select(ModuleCall).where(ModuleCall.account_id == account_id)
                                  .order_by(ModuleCall.created_at)).scalars().all()
        out = [(r.status, r.price_micros, r.error, r.mode) for r in rows]
        db.session.remove()
    return out


# --- success ---------------------------------------------------------------------------

def test_call_charges_forwards_and_answers_exact_shape(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=100)
    r = call(client, acct, {"action": "ok", "text": "hi", "nested": {"a": [1, 2]}},
             headers={"X-Custom": "not-forwarded"})
    assert r.status_code == 200, r.get_json()
    data = r.get_json()
    assert set(data) == {"ok", "module", "call_id", "cost_cents", "result", "receipt"}
    assert data["ok"] is True and data["module"] == "svc" and data["cost_cents"] == 3
    assert data["call_id"].startswith("call_")
    assert {"hash", "sig"} <= set(data["receipt"])
    # every body property reaches the provider, with the gateway's credential only
    assert data["result"]["echo"] == {"action": "ok", "text": "hi", "nested": {"a": [1, 2]}}
    assert data["result"]["provider_key"] == PROVIDER_SECRET
    assert data["result"]["authorization"] is None
    seen = PROVIDER.requests[-1]
    assert "X-Custom" not in seen.headers and seen.headers["X-Gateway-Call-Id"] == data["call_id"]
    assert balance_cents(app, acct.id) == 97
    assert calls_of(app, acct.id) == [("succeeded", 30_000, None, "live")]
    with app.app_context():
        assert ledger.balance(ledger.REVENUE) == 30_000
        db.session.remove()
    ledger_clean()


def test_wallet_transactions_name_the_call_of_a_charge(app, client, make_account, mod, ledger_clean):
    """The charge is posted with its call only in the ref (``call:<id>``): the listing
    still names the call, so a debit can be matched to its receipt."""
    from app.services.billing.wallets import _call_of_ref

    acct = make_account(cents=100)
    data = call(client, acct, {"action": "ok"}).get_json()
    txs = client.get("/api/wallet/transactions", headers=acct.headers).get_json()["transactions"]
    charge = [t for t in txs if t["kind"] == "module_call"]
    assert [(t["call_id"], t["amount_micros"]) for t in charge] == [(data["call_id"], -30_000)]
    assert {t["call_id"] for t in txs if t["kind"] != "module_call"} == {None}  # the funding
    assert _call_of_ref("chat_settle:chatcmpl-x") == "chatcmpl-x" and _call_of_ref("chat_hold:chatcmpl-x") == "chatcmpl-x"
    assert _call_of_ref("promo:mailbox:ab") is None and _call_of_ref(None) is None
    ledger_clean()


def test_provider_4xx_is_charged_with_ok_false(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=10)
    r = call(client, acct, {"action": "bad"})
    assert r.status_code == 200
    data = r.get_json()
    assert data["ok"] is False and data["cost_cents"] == 2
    assert data["result"] == {"error": "bad_input", "field": "text"}
    assert balance_cents(app, acct.id) == 8
    ledger_clean()


@pytest.mark.parametrize("action,result", [
    ("list", {"data": [1, 2, 3]}),
    ("text", {"text": "plain words", "content_type": "text/plain"}),
    ("empty", {}),
])
def test_non_object_bodies_are_wrapped(client, make_account, mod, action, result):
    r = call(client, make_account(), {"action": action})
    assert r.status_code == 200 and r.get_json()["result"] == result


def test_free_action_works_on_zero_balance(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=0)
    bal = balance_cents(app, acct.id)
    r = call(client, acct, {"action": "free"})
    assert r.status_code == 200 and r.get_json()["cost_cents"] == 0
    assert balance_cents(app, acct.id) == bal
    ledger_clean()


def test_get_action_sends_query_parameters(client, make_account, mod):
    r = call(client, make_account(), {"action": "get", "q": "x y", "n": 2, "flag": True})
    assert r.status_code == 200
    seen = PROVIDER.requests[-1]
    assert seen.method == "GET" and "q=x+y" in seen.target and "flag=true" in seen.target


# --- client errors ---------------------------------------------------------------------

def test_auth_and_scope(client, make_account, mod):
    assert client.post("/v1/module/svc/call", json={"action": "ok"}).status_code == 401
    r = call(client, None, {"action": "ok"}, bearer="svc_live_nope")
    assert r.status_code == 401 and r.get_json()["error"] == "unauthorized"
    reader = make_account(scopes=["call:read"])
    r = call(client, reader, {"action": "ok"})
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"


def test_unknown_or_unapproved_module_is_404(app, client, make_account, provider):
    create_module(app, "pending-mod", provider, {"ok": (1, "/ok")}, status="review")
    acct = make_account()
    for slug in ("nope", "pending-mod", "UPPER"):
        r = call(client, acct, {"action": "ok"}, slug=slug)
        assert r.status_code == 404 and r.get_json()["error"] == "module_not_found"


@pytest.mark.parametrize("body,code", [
    ({}, "invalid_request"), ({"text": "x"}, "invalid_request"), ({"action": 5}, "invalid_request"),
    ([1, 2], "invalid_request"),
])
def test_bad_requests_are_400_and_change_nothing(app, client, make_account, mod, body, code):
    acct = make_account(cents=10)
    r = call(client, acct, body)
    assert r.status_code == 400 and r.get_json()["error"] == code
    assert balance_cents(app, acct.id) == 10 and calls_of(app, acct.id) == []
    assert PROVIDER.requests == []


def test_an_action_the_module_does_not_have_is_404_and_changes_nothing(app, client, make_account, mod):
    """Issue 42 item 12: `{"action": "nope"}` is schema-valid (the module's actions are catalog
    data the document cannot enumerate per slug), so it is not a 400: the action is not
    found, like an unknown module (404 `unknown_action`). Nothing charged or recorded."""
    acct = make_account(cents=10)
    r = call(client, acct, {"action": "nope"})
    assert r.status_code == 404 and r.get_json()["error"] == "unknown_action"
    assert balance_cents(app, acct.id) == 10 and calls_of(app, acct.id) == []
    assert PROVIDER.requests == []


def test_non_json_body_is_400(client, make_account, mod):
    acct = make_account()
    r = client.post("/v1/module/svc/call", data="action=ok", headers=acct.headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    r = client.post("/v1/module/svc/call", data="{broken", headers={**acct.headers,
                                                                   "Content-Type": "application/json"})
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"


def test_body_over_limit_is_413(client, make_account, mod):
    acct = make_account()
    r = call(client, acct, {"action": "ok", "blob": "x" * (1024 * 1024 + 10)})
    assert r.status_code == 413 and r.get_json()["error"] == "payload_too_large"


def test_rate_limit_is_429_with_headers(app, client, make_account, mod, monkeypatch):
    monkeypatch.setitem(app.config["PLANS"], "starter", {"plan_cents": 2000, "rate_limit": "3/hour"})
    acct = make_account(plan="starter")
    codes = [call(client, acct, {"action": "free"}).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    r = call(client, acct, {"action": "ok"})
    assert r.status_code == 429 and r.get_json()["error"] == "rate_limited"
    assert int(r.headers["Retry-After"]) >= 1 and r.headers["RateLimit-Limit"] == "3"
    assert len(PROVIDER.requests) == 3


# --- provider failures: refunded -------------------------------------------------------

@pytest.mark.parametrize("action,status,code", [
    ("boom", 502, "provider_error"), ("redirect", 502, "provider_error"),
    ("unauth", 502, "provider_error"), ("busy", 502, "provider_error"),
    ("slow", 504, "provider_timeout"),
])
def test_provider_failure_is_refunded(app, client, make_account, mod, ledger_clean, action, status, code):
    acct = make_account(cents=10)
    r = call(client, acct, {"action": action})
    assert r.status_code == status and r.get_json()["error"] == code
    assert "not charged" in r.get_json()["message"]
    assert balance_cents(app, acct.id) == 10
    (row,) = calls_of(app, acct.id)
    assert row[0] == "refunded" and row[2] == code
    u = client.get("/api/usage/current", headers=acct.headers).get_json()
    assert u["calls"] == 1 and u["spend_cents"] == 0
    with app.app_context():
        assert ledger.balance(ledger.REVENUE) == 0
        db.session.remove()
    ledger_clean()


def test_unreachable_provider_is_502(app, client, make_account, ledger_clean):
    create_module(app, "dead", f"http://127.0.0.1:{free_port()}", {"ok": (1, "/ok")})
    acct = make_account(cents=5)
    r = call(client, acct, {"action": "ok"}, slug="dead")
    assert r.status_code == 502 and r.get_json()["error"] == "provider_error"
    assert balance_cents(app, acct.id) == 5
    ledger_clean()


def test_private_upstream_refused_unless_allowed(app, client, make_account, mod, monkeypatch, ledger_clean):
    monkeypatch.setitem(app.config, "ALLOW_PRIVATE_URLS", False)
    acct = make_account(cents=5)
    r = call(client, acct, {"action": "ok"})
    assert r.status_code == 502 and r.get_json()["error"] == "provider_error"
    assert PROVIDER.requests == [] and calls_of(app, acct.id) == []
    assert balance_cents(app, acct.id) == 5
    ledger_clean()


def test_missing_provider_secret_in_production_is_refunded(app, client, make_account, mod, monkeypatch,
                                                           ledger_clean):
    monkeypatch.setitem(app.config, "PRODUCTION", True)
    monkeypatch.delenv("TEST_PROVIDER_SECRET", raising=False)
    acct = make_account(cents=5)
    r = call(client, acct, {"action": "ok"})
    assert r.status_code == 502 and PROVIDER.requests == []
    assert balance_cents(app, acct.id) == 5
    monkeypatch.setenv("TEST_PROVIDER_SECRET", "from-env")
    r = call(client, acct, {"action": "ok"})
    assert r.status_code == 200 and r.get_json()["result"]["provider_key"] == "from-env"
    ledger_clean()


# --- 402 ---------------------------------------------------------------------------------

def test_insufficient_balance_is_402_with_payment_request(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=2)
    r = call(client, acct, {"action": "ok"}, key="k402")
    assert r.status_code == 402
    body = r.get_json()
    assert body["error"] == "payment_required" and "POST /api/wallet/fund" in body["message"]
    assert r.headers["WWW-Authenticate"].startswith("X402 ")
    assert r.headers["X-Price-Cents"] == "3" and r.headers["X-Pay-To"] == app.config["X402_PAY_TO"]
    assert r.headers["X-Nonce"] and r.headers["X-Nonce"] == body["nonce"]
    assert call(client, acct, {"action": "ok"}).headers["X-Nonce"] != r.headers["X-Nonce"]
    assert balance_cents(app, acct.id) == 2 and calls_of(app, acct.id) == []
    assert PROVIDER.requests == []
    # the 402 stored no idempotency record: after funding, the same key works
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(IdempotencyRecord)).scalar_one() == 0
        ledger.post("test_grant", [("adjust:test", -10_000), (ledger.customer(acct.id), 10_000)])
        db.session.commit()
        db.session.remove()
    assert call(client, acct, {"action": "ok"}, key="k402").status_code == 200
    assert balance_cents(app, acct.id) == 0
    ledger_clean()


def test_undecodable_x_payment_is_400(app, client, make_account, mod, ledger_clean):
    acct = make_account(cents=0)
    r = call(client, acct, {"action": "ok"}, headers={"X-Payment": "eyJ4IjoxfQ"})
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_payment"
    assert calls_of(app, acct.id) == []
    ledger_clean()


def test_fifty_concurrent_calls_on_twenty_cents(app, make_account, provider, ledger_clean):
    acct = make_account(cents=20, plan="enterprise")
    create_module(app, "one", provider, {"ok": (1, "/ok")})

    def one(_):
        c = app.test_client()
        return c.post("/v1/module/one/call", json={"action": "ok"}, headers=acct.headers).status_code

    with ThreadPoolExecutor(max_workers=50) as pool:
        codes = list(pool.map(one, range(50)))
    assert codes.count(200) == 20 and codes.count(402) == 30, codes
    assert balance_cents(app, acct.id) == 0
    assert [c[0] for c in calls_of(app, acct.id)] == ["succeeded"] * 20
    with app.app_context():
        assert ledger.balance(ledger.REVENUE) == 20 * 10_000
        neg = db.session.execute(select(func.count()).select_from(LedgerEntry)
                                 .where(LedgerEntry.ledger_account == ledger.customer(acct.id),
                                        LedgerEntry.amount_micros < 0)).scalar_one()
        db.session.remove()
    assert neg == 20
    ledger_clean()


# --- revenue share ------------------------------------------------------------------------

def test_owner_agent_earns_30_percent_and_refund_reverses(app, client, make_account, provider, ledger_clean):
    create_module(app, "agentmod", provider, {"ok": (3, "/ok"), "boom": (3, "/boom")},
                  owner_agent_id="agt_owner")
    acct = make_account(cents=10)
    assert call(client, acct, {"action": "ok"}, slug="agentmod").status_code == 200
    with app.app_context():
        assert ledger.balance(ledger.earnings("agt_owner")) == 9_000
        assert ledger.balance(ledger.REVENUE) == 21_000
        db.session.remove()
    assert call(client, acct, {"action": "boom"}, slug="agentmod").status_code == 502
    with app.app_context():
        assert ledger.balance(ledger.earnings("agt_owner")) == 9_000
        assert ledger.balance(ledger.REVENUE) == 21_000
        db.session.remove()
    assert balance_cents(app, acct.id) == 7
    ledger_clean()


def test_standard_webhooks_provider_auth(app, client, make_account, provider):
    from standardwebhooks.webhooks import Webhook

    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    create_module(app, "hooked", provider, {"ok": (1, "/ok")},
                  provider_auth={"type": "standard_webhooks", "secret": secret})
    acct = make_account()
    r = call(client, acct, {"action": "ok", "x": 1}, slug="hooked")
    assert r.status_code == 200
    seen = PROVIDER.requests[-1]
    headers = {k.lower(): v for k, v in seen.headers.items()}
    assert headers["webhook-id"] == r.get_json()["call_id"]
    assert Webhook(secret).verify(seen.body, headers) == {"action": "ok", "x": 1}
    assert "authorization" not in headers
