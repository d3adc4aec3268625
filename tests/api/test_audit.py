"""Issue 37 item 6: one audit log (``orgs.audit.record``) for every change to money, keys,
alerts, wallets and agents, of an organisation or of a personal account; ``GET /api/audit``
lists a person's own account's log (cursor pages, CSV) and an organisation key's for owners
and admins only. Refused changes write nothing."""
from __future__ import annotations

from urllib.parse import urlparse

from sqlalchemy import func, select

from app.extensions import db
from app.models import OrgAuditEntry
from tests.agentkit import Keypair
from tests.api.test_wallet import connect_evm
from tests.orgkit import h, join, make_org, org_key
from tests.support.errors import error_code


def _count(app) -> int:
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(OrgAuditEntry)).scalar_one()
        db.session.remove()
    return n


def _checkout(client, headers, cents, **extra):
    r = client.post("/api/pay/checkout", json={"amount_cents": cents, **extra}, headers=headers)
    assert r.status_code == 200, r.get_json()
    done = client.post(urlparse(r.get_json()["url"]).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    assert b"succeeded" in done.data
    return r.get_json()["payment_id"]


def _log(client, headers, **query):
    r = client.get("/api/audit", headers=headers, query_string=query)
    assert r.status_code == 200, r.get_json()
    return r.get_json()


def test_a_persons_own_changes_are_in_their_log(app, client, make_account, ledger_clean):
    me, other = make_account(plan="scale"), make_account(plan="scale")
    pay_id = _checkout(client, me.headers, 700)
    key = client.post("/api/keys", json={"name": "ci"}, headers=me.headers).get_json()
    assert client.patch(f"/api/keys/{key['id']}", json={"spend_limit_cents": 50},
                        headers=me.headers).status_code == 200
    rotated = client.post(f"/api/keys/{key['id']}/rotate", json={"overlap_seconds": 0}, headers=me.headers)
    assert rotated.status_code == 201
    assert client.delete(f"/api/keys/{rotated.get_json()['id']}", headers=me.headers).status_code == 200
    assert client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"},
                       headers=me.headers).status_code == 200
    rule = {"threshold_cents": 100, "amount_cents": 2000, "monthly_cap_cents": 10_000}
    assert client.put("/api/pay/auto-topup", json=rule, headers=me.headers).status_code == 200
    assert client.delete("/api/pay/auto-topup", headers=me.headers).status_code == 200
    fund = client.post("/api/wallet/fund", json={"amount_cents": 300, "method": "card"}, headers=me.headers)
    assert fund.status_code == 200, fund.get_json()
    assert client.delete("/api/pay/methods/pm_card_visa", headers=me.headers).status_code == 200
    alert = client.post("/api/alerts", json={"name": "a", "metric": "spend_cents", "op": ">", "threshold": 5,
                                             "window": "day", "channel": "webhook",
                                             "target": "https://hooks.example.com/x"}, headers=me.headers)
    assert alert.status_code == 201
    assert client.delete(f"/api/alerts/{alert.get_json()['id']}", headers=me.headers).status_code == 200
    _eth, connected = connect_evm(client, me)
    assert connected.status_code == 200, connected.get_json()
    agent = client.post("/api/agent/register", json={"name": "bot", "pubkey": Keypair().pubkey}, headers=me.headers)
    assert agent.status_code == 201
    funded = client.post(f"/api/agent/{agent.get_json()['id']}/fund", json={"amount_cents": 10}, headers=me.headers)
    assert funded.status_code == 200, funded.get_json()

    entries = _log(client, me.headers, limit=200)["entries"]
    actions = [e["action"] for e in reversed(entries)]
    assert actions == ["checkout.create", "payment.credit", "key.create", "key.update", "key.rotate", "key.revoke",
                       "method.default", "autotopup.set", "autotopup.delete", "funding.create", "payment.credit",
                       "method.remove", "alert.create", "alert.delete", "wallet.connect", "agent.register",
                       "agent.fund"]
    by_action = {e["action"]: e for e in entries}
    mine = by_action["key.update"]
    assert (mine["actor_account_id"], mine["target"]) == (me.id, key["id"])
    assert (mine["before"]["spend_limit_micros"], mine["after"]["spend_limit_micros"]) == (None, 500_000)
    assert mine["credential_id"] and mine["request_id"].startswith("req_") and mine["ip"]
    credit = entries[-2]
    assert (credit["action"], credit["target"], credit["actor_account_id"]) == ("payment.credit", pay_id, None)
    assert credit["credential_id"] == "sandbox" and credit["after"]["amount_micros"] == 7_000_000
    assert by_action["autotopup.set"]["after"]["threshold_micros"] == 1_000_000
    # cursor pages and CSV, like an organisation's
    first = _log(client, me.headers, limit=5)
    assert [e["action"] for e in first["entries"]] == actions[::-1][:5]
    rest = _log(client, me.headers, limit=200, cursor=first["next_cursor"])
    assert [e["action"] for e in rest["entries"]] == actions[::-1][5:] and rest["next_cursor"] is None
    exported = client.get("/api/audit?format=csv", headers=me.headers)
    assert exported.status_code == 200 and exported.mimetype == "text/csv"
    lines = [x for x in exported.get_data(as_text=True).split("\r\n") if x]
    assert lines[0].startswith("id,created_at,actor_account_id") and len(lines) == 1 + len(actions)
    # nobody else's
    assert _log(client, other.headers)["entries"] == []
    assert client.get("/api/audit?cursor=abc", headers=me.headers).status_code == 400
    ledger_clean()


def test_an_organisations_money_and_alerts_and_refusals(app, client, make_account, ledger_clean):
    owner, billing, dev, stranger = (make_account(plan="scale") for _ in range(4))
    org = make_org(client, owner)
    oid = org["id"]
    join(app, oid, billing, "billing")
    join(app, oid, dev, "developer")
    _checkout(client, billing.headers, 1000, org_id=oid)
    alert = client.post("/api/alerts", json={"name": "org", "metric": "spend_cents", "op": ">", "threshold": 5,
                                             "window": "day", "channel": "webhook", "org_id": oid,
                                             "target": "https://hooks.example.com/org"}, headers=billing.headers)
    assert alert.status_code == 201
    log = client.get(f"/api/orgs/{oid}/audit", headers=owner.headers).get_json()["entries"]
    assert [(e["action"], e["actor_account_id"]) for e in reversed(log)][-3:] == [
        ("checkout.create", billing.id), ("payment.credit", None), ("alert.create", billing.id)]
    assert _log(client, billing.headers)["entries"] == []  # the organisation's, not the person's

    # an organisation key: GET /api/audit is the organisation's log, for owners and admins
    owner_key, dev_key = org_key(client, owner, oid), org_key(client, dev, oid)
    assert [e["action"] for e in _log(client, h(owner_key["key"]))["entries"]][:2] == ["key.create", "key.create"]
    r = client.get("/api/audit", headers=h(dev_key["key"]))
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    assert r.get_json()["roles"] == ["owner", "admin"]
    r = client.get("/api/audit?format=csv", headers=h(dev_key["key"]))
    assert r.status_code == 403 and r.mimetype == "application/json"

    # refused changes write nothing: unknown org, another org, a role without the right
    before = _count(app)
    other = make_org(client, stranger, "Other")
    before += 1  # its org.create
    body = {"name": "x", "metric": "spend_cents", "op": ">", "threshold": 5, "window": "day",
            "channel": "webhook", "target": "https://hooks.example.com/x"}
    for headers, org_id, status in ((owner.headers, "acct_unknown", 404), (owner.headers, other["id"], 404),
                                    (dev.headers, oid, 403), (stranger.headers, oid, 404)):
        assert client.post("/api/alerts", json={**body, "org_id": org_id}, headers=headers).status_code == status
        r = client.post("/api/pay/checkout", json={"amount_cents": 500, "org_id": org_id}, headers=headers)
        assert r.status_code == status
    assert client.delete(f"/api/alerts/{alert.get_json()['id']}?org_id={oid}", headers=dev.headers).status_code == 403
    assert client.delete(f"/api/alerts/{alert.get_json()['id']}", headers=billing.headers).status_code == 404
    assert _count(app) == before
    ledger_clean()


def test_an_operators_credit_and_plan_change_are_in_the_accounts_log(app, client, make_account, ledger_clean):
    from app.services.accounts import accounts

    owner = make_account()
    org = make_org(client, owner)
    with app.app_context():
        accounts.grant_credits(org["id"], 2000, "welcome")
        accounts.set_plan(org["id"], "pro")
        accounts.set_plan(org["id"], "pro")  # no change: no entry
        db.session.remove()
    log = client.get(f"/api/orgs/{org['id']}/audit", headers=owner.headers).get_json()["entries"]
    assert [(e["action"], e["actor_account_id"], e["credential_id"], e["before"], e["after"]) for e in log[:2]] == [
        ("account.plan", None, "operator", {"plan": "starter"}, {"plan": "pro"}),
        ("credit.adjust", None, "operator", None, {"amount_micros": 20_000_000, "memo": "welcome"})]
    ledger_clean()
