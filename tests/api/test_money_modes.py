"""Issue 15 (modes): test and live money never mix; admin routes need a live admin-scoped
key; production refuses to sell play money and to start without RECEIPT_SIGNING_KEY; one
promotional grant per mailbox."""
from __future__ import annotations

from urllib.parse import urlparse

import pytest

from app.extensions import db
from app.models import Account
from app.services.money import ledger
from config import ConfigError, load_config


def _h(key):
    return {"Authorization": f"Bearer {key}"}


def _balance(client, key):
    return client.get("/api/account", headers=_h(key)).get_json()["balance_cents"]


# --- live and test balances ------------------------------------------------------------

def test_test_key_funding_never_reaches_the_live_balance(client, make_account, ledger_clean):
    acct = make_account(test_key=True, plan="enterprise")  # 14 requests in a burst: past starter's 10/s per account
    assert _balance(client, acct.key) == 1000 and _balance(client, acct.test_key) == 0
    r = client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=_h(acct.test_key))
    assert r.status_code == 200, r.get_json()
    r = client.post("/api/wallet/fund", json={"amount_cents": 100_000, "method": "card"}, headers=_h(acct.test_key))
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["balance_cents"] == 100_000
    out = client.post("/api/pay/checkout", json={"amount_cents": 500}, headers=_h(acct.test_key)).get_json()
    client.post(urlparse(out["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    assert _balance(client, acct.key) == 1000                       # live: unchanged
    assert _balance(client, acct.test_key) == 100_500               # test: both purchases
    live = client.get("/api/wallet/balance", headers=acct.headers).get_json()
    test = client.get("/api/wallet/balance", headers=_h(acct.test_key)).get_json()
    assert live["credits_cents"] == 1000 and test["credits_cents"] == 100_500
    # Payment history and ledger transactions are per mode too.
    assert client.get("/api/pay/history", headers=acct.headers).get_json()["payments"] == []
    assert len(client.get("/api/pay/history", headers=_h(acct.test_key)).get_json()["payments"]) == 2
    live_tx = client.get("/api/wallet/transactions", headers=acct.headers).get_json()
    assert [t["kind"] for t in live_tx["transactions"]] == ["promo_grant"]
    with client.application.app_context():
        row = db.session.get(Account, acct.id)
        assert row.balance_micros == 10_000_000 and row.test_balance_micros == 1_005_000_000
        assert ledger.balance(ledger.customer(acct.id, "test")) == 1_005_000_000
        db.session.remove()
    ledger_clean()


def test_test_balance_cannot_be_overdrawn(app, make_account):
    acct = make_account()
    with app.app_context():
        with pytest.raises(ledger.InsufficientFunds):
            ledger.post("t", [(ledger.customer(acct.id, "test"), -1), ("adjust:test", 1)])
        db.session.rollback()
        assert ledger.check() == []
        db.session.remove()


def test_test_key_cannot_list_or_revoke_live_keys(client, make_account):
    acct = make_account(test_key=True)
    live = client.get("/api/keys", headers=acct.headers).get_json()["keys"]
    test = client.get("/api/keys", headers=_h(acct.test_key)).get_json()["keys"]
    assert {k["prefix"][:9] for k in live} == {"svc_live_"}
    assert {k["prefix"][:9] for k in test} == {"svc_test_"}
    r = client.delete(f"/api/keys/{live[0]['id']}", headers=_h(acct.test_key))
    assert r.status_code == 404
    assert client.get("/api/account", headers=acct.headers).status_code == 200  # still valid
    r = client.delete(f"/api/keys/{test[0]['id']}", headers=acct.headers)  # and vice versa
    assert r.status_code == 404
    assert client.get("/api/account", headers=_h(acct.test_key)).status_code == 200


def test_test_key_cannot_see_or_delete_live_alerts(client, make_account):
    acct = make_account(test_key=True)
    body = {"name": "big", "metric": "calls", "op": ">", "threshold": 10, "window": "day",
            "channel": "email", "target": "ops@example.com"}
    alert = client.post("/api/alerts", json=body, headers=acct.headers).get_json()
    assert client.get("/api/alerts", headers=_h(acct.test_key)).get_json()["alerts"] == []
    assert client.delete(f"/api/alerts/{alert['id']}", headers=_h(acct.test_key)).status_code == 404
    assert [a["id"] for a in client.get("/api/alerts", headers=acct.headers).get_json()["alerts"]] == [alert["id"]]


def test_test_key_cannot_read_or_take_over_live_agents(client, make_account):
    from tests.agentkit import Keypair, register

    acct = make_account(test_key=True)
    kp = Keypair()
    agent = register(client, acct, kp, name="live-bot").get_json()
    for suffix in ("usage", "earnings"):
        url = f"/api/agent/{agent['id']}/{suffix}"
        assert client.get(url, headers=acct.headers).status_code == 200
        assert client.get(url, headers=_h(acct.test_key)).status_code == 404
    r = client.post("/api/agent/register", json={"name": "renamed", "pubkey": agent["pubkey"]},
                    headers=_h(acct.test_key))
    assert r.status_code == 409


def test_a_test_key_never_funds_an_agent_with_live_money(app, client, make_account, ledger_clean):
    """Funding is in the caller's mode: a test key gets 404 for a live agent (and moved 500
    live cents before, DESIGN §5), and a test agent is funded from the test balance into
    the agent's test balance, where its test sessions can spend it."""
    from tests.agentkit import Keypair, register

    acct = make_account(test_key=True)
    live_agent = register(client, acct, Keypair(), name="live-bot").get_json()
    r = client.post(f"/api/agent/{live_agent['id']}/fund", json={"amount_cents": 500},
                    headers=_h(acct.test_key))
    assert r.status_code == 404, r.get_json()
    assert _balance(client, acct.key) == 1000
    test_agent = client.post("/api/agent/register", json={"name": "test-bot", "pubkey": Keypair().pubkey},
                             headers=_h(acct.test_key)).get_json()
    assert client.post(f"/api/agent/{test_agent['id']}/fund", json={"amount_cents": 5},
                       headers=acct.headers).status_code == 404  # a live key, a test agent
    with app.app_context():
        ledger.post("test_grant", [("adjust:test", -300 * 10_000), (ledger.customer(acct.id, "test"), 300 * 10_000)])
        db.session.commit()
        db.session.remove()
    r = client.post(f"/api/agent/{test_agent['id']}/fund", json={"amount_cents": 120}, headers=_h(acct.test_key),
                    )
    assert r.status_code == 200, r.get_json()
    assert (r.get_json()["owner_balance_cents"], r.get_json()["agent_balance_cents"]) == (180, 120)
    with app.app_context():
        agent_acct = db.session.get(Account, test_agent["account_id"])
        assert (agent_acct.balance_micros, agent_acct.test_balance_micros) == (0, 120 * 10_000)
        db.session.remove()
    assert _balance(client, acct.key) == 1000
    ledger_clean()


def test_a_test_key_does_not_list_live_agents_builds(client, make_account):
    """A live agent's submissions (and their webhook secrets) are not listed to the owner's
    test key; its live key lists them."""
    from tests.agentkit import Keypair, register, session_headers

    acct = make_account(test_key=True)
    kp = Keypair()
    assert register(client, acct, kp, name="live-bot", webhook="https://example.com/hook").status_code == 201
    r = client.post("/api/agent/build", json={"slug": "live-mod", "price_cents": 5, "actions": ["go"]},
                    headers=session_headers(client, kp))
    assert r.status_code == 202, r.get_json()
    assert [b["slug"] for b in client.get("/api/agent/builds", headers=acct.headers).get_json()["builds"]] \
        == ["live-mod"]
    assert client.get("/api/agent/builds", headers=_h(acct.test_key)).get_json()["builds"] == []


def test_a_test_key_cannot_replace_the_wallet_that_attributes_live_deposits(app, client, make_account):
    """The account's one wallet decides which live USDC deposits are the account's: a test
    key replaced it (200) before; now 403 (live keys only), and the live wallet stays."""
    from types import SimpleNamespace

    from tests.api.test_wallet import connect_evm

    acct = make_account(test_key=True)
    live_eth, r = connect_evm(client, acct)
    assert r.status_code == 200
    as_test = SimpleNamespace(headers=_h(acct.test_key))
    _, r = connect_evm(client, as_test)
    assert r.status_code == 403 and "live key" in r.get_json()["message"], r.get_json()
    from app.services.billing import wallets

    with app.app_context():  # read from the database (the balance endpoint would ask a chain node)
        assert wallets.get_wallet(acct.id).address == live_eth.address
        db.session.remove()


def test_a_test_agent_cannot_submit_a_module(client, make_account):
    """An approved build is a live module earning live money: a test-mode agent (registered
    by a test key) gets 403 instead of a live module whose earnings nobody can see."""
    from tests.agentkit import Keypair, session_headers

    acct = make_account(test_key=True)
    kp = Keypair()
    r = client.post("/api/agent/register", json={"name": "test-bot", "pubkey": kp.pubkey,
                                                  "webhook": "https://example.com/hook"},
                    headers=_h(acct.test_key))
    assert r.status_code == 201
    r = client.post("/api/agent/build", json={"slug": "test-mod", "price_cents": 5, "actions": ["go"]},
                    headers=session_headers(client, kp))
    assert r.status_code == 403 and "live" in r.get_json()["message"], r.get_json()


# --- admin scope ------------------------------------------------------------------------

ADMIN_ROUTES = ("/api/admin/modules/pending", "/api/track/recent", "/api/track/sessions")


def test_admin_routes_need_a_live_key_with_admin_scope(app, client, make_account):
    from app.scopes import ALL_SCOPES
    from app.services.accounts import keys

    admin = make_account(admin=True, test_key=True)
    with app.app_context():
        read_only = keys.mint(admin.id, "ro", ["call:read"])[1]
        no_admin = keys.mint(admin.id, "all-but-admin", ALL_SCOPES)[1]
        test_admin = keys.mint(admin.id, "test-admin", [*ALL_SCOPES, "admin"], mode="test")[1]
        db.session.remove()
    for path in ADMIN_ROUTES:
        assert client.get(path, headers=admin.headers).status_code == 200, path  # live + admin scope
        for key in (read_only, no_admin, admin.test_key, test_admin):
            r = client.get(path, headers=_h(key))
            assert r.status_code == 403, (path, key[:9], r.status_code)
    r = client.post("/api/admin/modules/x/approve", json={}, headers=_h(admin.test_key))
    assert r.status_code == 403


def test_only_admin_accounts_hold_the_admin_scope(app, client, make_account):
    from app.errors import Forbidden
    from app.services.accounts import keys

    user = make_account()
    r = client.post("/api/keys", json={"name": "x", "scopes": ["admin"]}, headers=user.headers)
    assert r.status_code == 403
    with app.app_context(), pytest.raises(Forbidden):
        keys.mint(user.id, "x", ["admin"])
    admin = make_account(admin=True)
    r = client.post("/api/keys", json={"name": "a", "scopes": ["admin", "analytics:read"]}, headers=admin.headers)
    assert r.status_code == 201
    assert client.get("/api/track/recent", headers=_h(r.get_json()["key"])).status_code == 200


# --- production configuration ----------------------------------------------------------

PROD = {"APP_ENV": "production", "SECRET_KEY": "s", "DATABASE_URL": "postgresql://x@127.0.0.1/db",
        "REDIS_URL": "redis://127.0.0.1:6379/0", "RECEIPT_SIGNING_KEY": "A" * 43 + "="}


def _prod_env(monkeypatch, **extra):
    for name in ("PAYMENTS_PROCESSOR", "STRIPE_SECRET_KEY", "STRIPE_WEBHOOK_SECRET", "RECEIPT_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**PROD, **extra}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def test_production_without_receipt_signing_key_refuses_to_start(monkeypatch):
    _prod_env(monkeypatch, RECEIPT_SIGNING_KEY=None)
    with pytest.raises(ConfigError, match="RECEIPT_SIGNING_KEY"):
        load_config()


def test_production_never_defaults_to_the_sandbox(monkeypatch):
    _prod_env(monkeypatch)
    assert load_config()["PAYMENTS_PROCESSOR"] == ""
    _prod_env(monkeypatch, PAYMENTS_PROCESSOR="sandbox")
    with pytest.raises(ConfigError, match="PAYMENTS_PROCESSOR"):
        load_config()
    _prod_env(monkeypatch, PAYMENTS_PROCESSOR="stripe")
    with pytest.raises(ConfigError, match="STRIPE_SECRET_KEY"):
        load_config()


def test_production_without_processor_refuses_to_sell(app, client, make_account, monkeypatch):
    monkeypatch.setitem(app.config, "PRODUCTION", True)
    monkeypatch.setitem(app.config, "PAYMENTS_PROCESSOR", "")
    acct = make_account(test_key=True)
    for path, body in (("/api/pay/method", {"payment_method_id": "pm_card_visa"}),
                       ("/api/wallet/fund", {"amount_cents": 50_000, "method": "card"}),
                       ("/api/wallet/fund", {"amount_cents": 50_000, "method": "ach"}),
                       ("/api/pay/checkout", {"amount_cents": 50_000})):
        r = client.post(path, json=body, headers=acct.headers)
        assert r.status_code == 503 and r.get_json()["error"] == "payments_unavailable", (path, r.get_json())
    assert _balance(client, acct.key) == 1000
    # Test keys keep their sandbox (funding the test balance only).
    assert client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"},
                       headers=_h(acct.test_key)).status_code == 200


# --- one promotional grant per mailbox -------------------------------------------------

@pytest.mark.parametrize("addresses", [
    ("farm@example.com", "farm+1@example.com", "Farm+2@Example.com"),
    ("john.doe@gmail.com", "johndoe@gmail.com", "J.O.H.N.D.O.E+x@googlemail.com"),
])
def test_one_promotional_grant_per_mailbox(app, addresses, ledger_clean):
    from app.services.accounts import accounts

    with app.app_context():
        made = [accounts.create_account(a) for a in addresses]
        balances = [db.session.get(Account, m.id).balance_micros for m in made]
        assert len({m.id for m in made}) == len(addresses)     # every account exists
        assert balances == [10_000_000] + [0] * (len(addresses) - 1)
        assert len({db.session.get(Account, m.id).mailbox for m in made}) == 1
        db.session.remove()
    ledger_clean()


def test_mailbox_canonical_form():
    from app.services.accounts.mailbox import canonical

    assert canonical("Farm+2@Example.COM") == "farm@example.com"
    assert canonical("j.o.e+tag@googlemail.com") == "joe@gmail.com"
    assert canonical("j.o.e@example.com") == "j.o.e@example.com"   # dots matter elsewhere


def test_a_test_key_alert_watches_sandbox_usage_as_documented(app, client, make_account):
    """A rule is of its creator's mode and watches that mode's usage: sandbox usage fires the
    test key's rule, never the live one. The document and docs/alerts.md say so (they said
    "live-mode usage only", which a test key's rule contradicted)."""
    from app.services.billing import alerts
    from tests import usage_seed

    acct = make_account(test_key=True)
    body = {"name": "calls", "metric": "calls", "op": ">=", "threshold": 1, "window": "day",
            "channel": "webhook", "target": "https://hooks.example.com/a"}
    test_rule = client.post("/api/alerts", json=body, headers=_h(acct.test_key)).get_json()
    live_rule = client.post("/api/alerts", json=body, headers=acct.headers).get_json()
    with app.app_context():
        usage_seed.record(acct.id, "mod", spend_micros=10_000, mode="test")
        db.session.commit()
        alerts.evaluate_all(dispatch=False)
        db.session.remove()
    fired = client.get("/api/alerts/events", headers=_h(acct.test_key)).get_json()["events"]
    assert [e["alert_id"] for e in fired] == [test_rule["id"]]
    assert client.get("/api/alerts/events", headers=acct.headers).get_json()["events"] == []
    assert live_rule["id"] != test_rule["id"]
    metric = client.get("/openapi.json").get_json()["components"]["schemas"]["AlertCreate"]["properties"]["metric"]
    assert "Live-mode usage only" not in metric["description"] and "mode" in metric["description"]
