"""Issue 37 items 1, 2 and 4: organisations with their own balance, funded by the existing
rails with ``org_id``; members and roles checked on every route (403 naming the roles);
the last owner stays; organisation keys spend the organisation's balance with the member
recorded as actor."""
from __future__ import annotations

from urllib.parse import urlparse

import pytest
from sqlalchemy import select, text

from app.extensions import db
from app.models import LedgerTransaction, ModuleCall, OrgAuditEntry
from tests.chatfakes import fakes, upstreams  # noqa: F401
from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401
from tests.orgkit import balances, h, join, make_org, org_key
from tests.support.errors import error_code
from tests.support.finalize import drain


def _audit(app, org_id):
    with app.app_context():
        out = [(e.action, e.actor_account_id, e.target) for e in db.session.execute(
            select(OrgAuditEntry).where(OrgAuditEntry.org_id == org_id).order_by(OrgAuditEntry.id)).scalars()]
        db.session.remove()
    return out


def _pay_checkout(client, acct, cents, **extra):
    r = client.post("/api/pay/checkout", json={"amount_cents": cents, **extra}, headers=acct.headers)
    if r.status_code != 200:
        return r
    page = urlparse(r.get_json()["url"]).path
    done = client.post(page, data={"action": "pay", "payment_method": "pm_card_visa"})
    assert done.status_code == 200 and b"succeeded" in done.data
    return r


def test_create_list_and_read_an_organisation(app, client, make_account):
    owner, stranger = make_account(), make_account()
    org = make_org(client, owner, "Acme Inc")
    assert set(org) == {"id", "name", "plan", "balance_cents", "role", "created_at"}
    assert org["name"] == "Acme Inc" and org["role"] == "owner" and org["balance_cents"] == 0
    assert org["plan"] == "starter" and org["id"].startswith("acct_")
    listed = client.get("/api/orgs", headers=owner.headers).get_json()["orgs"]
    assert [o["id"] for o in listed] == [org["id"]]
    assert client.get("/api/orgs", headers=stranger.headers).get_json() == {"orgs": []}
    r = client.get(f"/api/orgs/{org['id']}", headers=stranger.headers)  # not a member: as if none
    assert r.status_code == 404
    assert client.get(f"/api/orgs/{owner.id}", headers=owner.headers).status_code == 404  # a person is no org
    members = client.get(f"/api/orgs/{org['id']}/members", headers=owner.headers).get_json()["members"]
    assert [(m["member_id"], m["role"]) for m in members] == [(owner.id, "owner")]
    assert balances(app, owner.id) == [1000]  # no promotional credit moved
    assert _audit(app, org["id"]) == [("org.create", owner.id, org["id"])]
    r = client.post("/api/orgs", json={"name": "  "}, headers=owner.headers)
    assert r.status_code == 400


def test_org_funded_by_checkout_with_org_id_not_the_person(app, client, make_account, ledger_clean):
    owner, dev, billing, stranger = (make_account() for _ in range(4))
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    join(app, org["id"], billing, "billing")
    assert _pay_checkout(client, owner, 2000, org_id=org["id"]).status_code == 200
    assert _pay_checkout(client, billing, 500, org_id=org["id"]).status_code == 200
    assert balances(app, org["id"], owner.id, billing.id) == [2500, 1000, 1000]
    assert client.get(f"/api/orgs/{org['id']}", headers=owner.headers).get_json()["balance_cents"] == 2500
    r = client.post("/api/pay/checkout", json={"amount_cents": 500, "org_id": org["id"]}, headers=dev.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    assert "owner or billing" in r.get_json()["message"] and "developer" in r.get_json()["message"]
    r = client.post("/api/pay/checkout", json={"amount_cents": 500, "org_id": org["id"]}, headers=stranger.headers)
    assert r.status_code == 404
    r = client.post("/api/wallet/fund", json={"amount_cents": 500, "method": "card", "org_id": org["id"]},
                    headers=dev.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    assert balances(app, org["id"]) == [2500]
    ledger_clean()


def test_org_key_spends_the_org_balance_with_the_member_as_actor(app, client, make_account, mod,  # noqa: F811
                                                                 ledger_clean):
    owner, dev = make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    _pay_checkout(client, owner, 2000, org_id=org["id"])
    key = org_key(client, dev, org["id"])
    assert key["org_id"] == org["id"] and key["member_id"] == dev.id
    me = client.get("/api/account", headers=h(key["key"])).get_json()
    assert me["id"] == org["id"] and me["kind"] == "org" and me["balance_cents"] == 2000
    assert me["actor"] == {"account_id": dev.id, "credential_id": key["id"], "org_role": "developer"}
    personal = client.get("/api/account", headers=dev.headers).get_json()
    assert personal["kind"] == "human" and personal["actor"]["org_role"] is None
    r = call(client, None, {"action": "ok"}, bearer=key["key"])
    assert r.status_code == 200, r.get_json()
    assert balances(app, org["id"], dev.id) == [1997, 1000]
    drain(app)
    with app.app_context():
        row = db.session.execute(select(ModuleCall)).scalar_one()
        assert (row.account_id, row.actor) == (org["id"], key["id"])
        tx = db.session.execute(select(LedgerTransaction).where(LedgerTransaction.kind == "module_call")).scalar_one()
        assert (tx.account_id, tx.actor) == (org["id"], key["id"])
        db.session.remove()
    # usage of the organisation: with its key, or with a member's own key and org_id
    assert client.get("/api/usage/current", headers=h(key["key"])).get_json()["spend_cents"] == 3
    r = client.get(f"/api/usage/current?org_id={org['id']}", headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["calls"] == 1 and r.get_json()["spend_cents"] == 3
    assert client.get("/api/usage/current", headers=owner.headers).get_json()["calls"] == 0
    assert client.get(f"/api/usage/by-module?org_id={org['id']}",
                      headers=make_account().headers).status_code == 404
    assert ("key.create", dev.id, key["id"]) in _audit(app, org["id"])
    ledger_clean()


def test_org_key_chat_holds_and_settles_on_the_org(app, client, make_account, fakes, ledger_clean):  # noqa: F811
    owner, dev = make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    _pay_checkout(client, owner, 500, org_id=org["id"])
    key = org_key(client, dev, org["id"])
    r = client.post("/v1/chat/completions", headers=h(key["key"]),
                    json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.get_json()
    from app.models import Account, ChatCompletion

    with app.app_context():
        row = db.session.execute(select(ChatCompletion)).scalar_one()
        assert (row.account_id, row.actor, row.status) == (org["id"], key["id"], "settled")
        assert db.session.get(Account, org["id"]).balance_micros == 5_000_000 - row.cost_micros
        assert db.session.get(Account, dev.id).balance_micros == 10_000_000
        db.session.remove()
    ledger_clean()


def test_roles_narrow_org_keys_on_every_route(app, client, make_account, mod):  # noqa: F811
    owner, admin, dev, viewer = (make_account() for _ in range(4))
    org = make_org(client, owner)
    for acct, role in ((admin, "admin"), (dev, "developer"), (viewer, "viewer")):
        join(app, org["id"], acct, role)
    _pay_checkout(client, owner, 1000, org_id=org["id"])
    keys = {name: org_key(client, acct, org["id"]) for name, acct in (("admin", admin), ("dev", dev))}
    r = client.post("/api/keys", json={"name": "v", "org_id": org["id"]}, headers=viewer.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    assert "owner, admin or developer" in r.get_json()["message"]
    r = client.get(f"/api/usage/current?org_id={org['id']}", headers=viewer.headers)  # read only
    assert r.status_code == 200
    r = client.post("/api/pay/checkout", json={"amount_cents": 500}, headers=h(keys["dev"]["key"]))
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    r = client.patch(f"/api/orgs/{org['id']}/members/{viewer.id}", json={"role": "developer"},
                     headers=h(keys["dev"]["key"]))
    assert r.status_code == 403 and "owner or admin" in r.get_json()["message"]
    r = client.patch(f"/api/orgs/{org['id']}/members/{viewer.id}", json={"role": "developer"}, headers=dev.headers)
    assert r.status_code == 403 and r.get_json()["message"].startswith(
        "Managing members and invitations needs role owner or admin")  # until 2026-11-29: "This action (manage_members)"
    r = client.get(f"/api/pay/history?org_id={org['id']}", headers=dev.headers)
    assert r.status_code == 403 and "needs role owner, admin, billing or viewer in" in r.get_json()["message"]
    r = client.patch(f"/api/orgs/{org['id']}/members/{viewer.id}", json={"role": "developer"}, headers=dev.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    # a developer sees and changes only their own organisation keys; an admin all of them
    seen = {k["id"] for k in client.get("/api/keys", headers=h(keys["dev"]["key"])).get_json()["keys"]}
    assert seen == {keys["dev"]["id"]}
    seen = {k["id"] for k in client.get("/api/keys", headers=h(keys["admin"]["key"])).get_json()["keys"]}
    assert seen == {k["id"] for k in keys.values()}
    r = client.delete(f"/api/keys/{keys['admin']['id']}", headers=h(keys["dev"]["key"]))
    assert r.status_code == 404
    assert client.get("/api/account", headers=h(keys["admin"]["key"])).status_code == 200
    # a key made by an organisation key stays in the organisation, owned by the same member
    r = client.post("/api/keys", json={"name": "more"}, headers=h(keys["dev"]["key"]))
    assert r.status_code == 201 and (r.get_json()["org_id"], r.get_json()["member_id"]) == (org["id"], dev.id)
    # an organisation key cannot reach another organisation
    other = make_org(client, dev, "Dev's own")
    r = client.post("/api/keys", json={"name": "x", "org_id": other["id"]}, headers=h(keys["dev"]["key"]))
    assert r.status_code == 404
    # rotating an organisation key keeps it an organisation key of its member
    r = client.post(f"/api/keys/{keys['dev']['id']}/rotate", json={}, headers=h(keys["dev"]["key"]))
    assert r.status_code == 201, r.get_json()
    rotated = r.get_json()
    assert (rotated["org_id"], rotated["member_id"]) == (org["id"], dev.id)
    actor = client.get("/api/account", headers=h(rotated["key"])).get_json()["actor"]
    assert (actor["account_id"], actor["org_role"]) == (dev.id, "developer")


def test_org_keys_are_managed_with_a_personal_key_and_org_id(app, client, make_account):
    """GET/PATCH/rotate/DELETE /api/keys take `org_id` like POST does: a member who lost
    (or never kept) an organisation key lists, changes and revokes it with their own key.
    Before, `org_id` was refused (400) and the personal key only reached personal keys."""
    owner, dev, dev2, viewer, stranger = (make_account() for _ in range(5))
    oid = make_org(client, owner)["id"]
    for acct, role in ((dev, "developer"), (dev2, "developer"), (viewer, "viewer")):
        join(app, oid, acct, role)
    mine, theirs = org_key(client, dev, oid), org_key(client, dev2, oid)
    q = {"org_id": oid}

    def listed(acct):
        r = client.get("/api/keys", query_string=q, headers=acct.headers)
        assert r.status_code == 200, r.get_json()
        return {k["id"] for k in r.get_json()["keys"]}

    assert listed(owner) == {mine["id"], theirs["id"]} and listed(dev) == {mine["id"]} and listed(viewer) == set()
    r = client.get("/api/keys", query_string=q, headers=stranger.headers)
    assert r.status_code == 404
    # a developer changes and rotates their own; another member's is 404; a viewer 403
    r = client.patch(f"/api/keys/{mine['id']}", json={"rpm_limit": 30, "org_id": oid}, headers=dev.headers)
    assert r.status_code == 200 and r.get_json()["rpm_limit"] == 30, r.get_json()
    assert client.patch(f"/api/keys/{theirs['id']}", json={"rpm_limit": 30, "org_id": oid},
                        headers=dev.headers).status_code == 404
    r = client.delete(f"/api/keys/{mine['id']}", query_string=q, headers=viewer.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    r = client.post(f"/api/keys/{mine['id']}/rotate", json={"overlap_seconds": 0, "org_id": oid}, headers=dev.headers)
    assert r.status_code == 201 and (r.get_json()["org_id"], r.get_json()["member_id"]) == (oid, dev.id)
    new = r.get_json()
    # without org_id the person's own keys only: the organisation's key is not found there
    assert client.delete(f"/api/keys/{new['id']}", headers=dev.headers).status_code == 404
    assert client.delete(f"/api/keys/{theirs['id']}", query_string=q, headers=dev.headers).status_code == 404
    r = client.delete(f"/api/keys/{new['id']}", query_string=q, headers=dev.headers)
    assert r.status_code == 200 and r.get_json() == {"revoked": True, "id": new["id"]}
    assert client.get("/api/account", headers=h(new["key"])).status_code == 401
    r = client.delete(f"/api/keys/{theirs['id']}", query_string=q, headers=owner.headers)  # the owner: any
    assert r.status_code == 200
    assert listed(owner) == set()


def test_role_change_and_removal_reach_the_members_keys(app, client, make_account, mod):  # noqa: F811
    owner, dev = make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    _pay_checkout(client, owner, 1000, org_id=org["id"])
    key = org_key(client, dev, org["id"])
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 200
    r = client.patch(f"/api/orgs/{org['id']}/members/{dev.id}", json={"role": "viewer"}, headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["role"] == "viewer"
    r = call(client, None, {"action": "ok"}, bearer=key["key"])
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    r = client.delete(f"/api/orgs/{org['id']}/members/{dev.id}", headers=owner.headers)
    assert r.status_code == 200 and r.get_json() == {"removed": True, "member_id": dev.id,
                                                     "revoked_keys": [key["id"]], "disabled_agents": [],
                                                     "revoked_invites": []}
    assert client.get("/api/account", headers=h(key["key"])).status_code == 401
    assert client.get("/api/account", headers=dev.headers).status_code == 200  # their own key stays
    assert client.get(f"/api/orgs/{org['id']}", headers=dev.headers).status_code == 404
    actions = [a for a, _, _ in _audit(app, org["id"])]
    assert actions == ["org.create", "member.add", "checkout.create", "payment.credit", "key.create",
                       "member.update", "member.remove"]


def test_last_owner_stays_and_only_owners_touch_owners(app, client, make_account):
    owner, admin, second = make_account(), make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], admin, "admin")
    url = f"/api/orgs/{org['id']}/members"
    r = client.delete(f"{url}/{owner.id}", headers=owner.headers)
    assert r.status_code == 409 and error_code(r.get_json()) == "last_owner"
    r = client.patch(f"{url}/{owner.id}", json={"role": "admin"}, headers=owner.headers)
    assert r.status_code == 409 and error_code(r.get_json()) == "last_owner"
    r = client.patch(f"{url}/{owner.id}", json={"role": "viewer"}, headers=admin.headers)
    assert r.status_code == 403 and "role owner" in r.get_json()["message"]
    r = client.patch(f"{url}/{admin.id}", json={"role": "owner"}, headers=admin.headers)  # no self-promotion
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    for body in ({"role": "boss"}, {"role": None}, {}):
        assert client.patch(f"{url}/{admin.id}", json=body, headers=owner.headers).status_code == 400
    assert client.patch(f"{url}/{second.id}", json={"role": "viewer"}, headers=owner.headers).status_code == 404
    join(app, org["id"], second, "developer")
    assert client.patch(f"{url}/{second.id}", json={"role": "owner"}, headers=owner.headers).status_code == 200
    r = client.patch(f"{url}/{owner.id}", json={"role": "billing"}, headers=second.headers)
    assert r.status_code == 200 and r.get_json()["role"] == "billing"
    assert client.delete(f"{url}/{second.id}", headers=second.headers).status_code == 409  # last owner again
    assert client.delete(f"{url}/{admin.id}", headers=admin.headers).status_code == 200  # anyone may leave
    roles = {m["member_id"]: m["role"] for m in client.get(url, headers=owner.headers).get_json()["members"]}
    assert roles == {owner.id: "billing", second.id: "owner"}


def test_audit_log_is_append_only(app, client, make_account):
    owner = make_account()
    org = make_org(client, owner)
    with app.app_context():
        for stmt in ("UPDATE org_audit SET action = 'x'", "DELETE FROM org_audit"):
            with pytest.raises(Exception, match="append-only"):
                db.session.execute(text(stmt))
            db.session.rollback()
        db.session.remove()
    assert _audit(app, org["id"]) == [("org.create", owner.id, org["id"])]


def test_audit_log_endpoint_pages_and_exports(app, client, make_account):
    owner, admin, dev = make_account(), make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], admin, "admin")
    join(app, org["id"], dev, "developer")
    key = org_key(client, dev, org["id"])
    client.patch(f"/api/orgs/{org['id']}/members/{dev.id}", json={"role": "viewer"}, headers=admin.headers)
    url = f"/api/orgs/{org['id']}/audit"
    first = client.get(url + "?limit=3", headers=owner.headers)
    assert first.status_code == 200, first.get_json()
    page = first.get_json()
    assert [e["action"] for e in page["entries"]] == ["member.update", "key.create", "member.add"]
    update = page["entries"][0]
    assert (update["actor_account_id"], update["credential_id"], update["target"]) == (admin.id, _key_id(app, admin),
                                                                                       dev.id)
    assert (update["before"], update["after"]) == ({"role": "developer"}, {"role": "viewer"})
    assert update["request_id"].startswith("req_") and update["ip"]
    rest = client.get(f"{url}?limit=3&cursor={page['next_cursor']}", headers=admin.headers).get_json()
    assert [e["action"] for e in rest["entries"]] == ["member.add", "org.create"] and rest["next_cursor"] is None
    csv_r = client.get(url + "?format=csv", headers=owner.headers)
    assert csv_r.status_code == 200 and csv_r.mimetype == "text/csv"
    lines = csv_r.get_data(as_text=True).split("\r\n")
    assert lines[0].startswith("id,created_at,actor_account_id") and len([x for x in lines if x]) == 6
    assert key["id"] in csv_r.get_data(as_text=True)
    for who in (dev, make_account()):
        r = client.get(url + "?format=csv", headers=who.headers)
        assert r.status_code in (403, 404) and r.mimetype == "application/json"
    r = client.get(url, headers=dev.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    assert client.get(url + "?cursor=abc", headers=owner.headers).status_code == 400


def _key_id(app, acct):
    """The id of the one key ``make_account`` minted for ``acct``."""
    from app.models import ApiKey

    with app.app_context():
        out = db.session.execute(select(ApiKey.id).where(ApiKey.account_id == acct.id)).scalar_one()
        db.session.remove()
    return out


def test_two_owners_leaving_at_once_leave_one_owner(app, client, make_account):
    import itertools

    from tests.support.concurrency import at_once

    for _ in range(3):  # a race: several rounds
        a, b = make_account(), make_account()
        org = make_org(client, a)
        join(app, org["id"], b, "owner")
        people = itertools.cycle([a, b])

        def leave():
            who = next(people)
            return app.test_client().delete(f"/api/orgs/{org['id']}/members/{who.id}",
                                            headers=who.headers).status_code

        assert sorted(at_once(2, leave)) == [200, 409]
        left = client.get(f"/api/orgs/{org['id']}/members", headers=a.headers)
        if left.status_code == 404:
            left = client.get(f"/api/orgs/{org['id']}/members", headers=b.headers)
        assert [m["role"] for m in left.get_json()["members"]] == ["owner"]


def test_an_org_keys_x402_payment_credits_and_charges_the_org(app, client, make_account, mod,  # noqa: F811
                                                              ledger_clean, monkeypatch):
    """The x402 rail funds the organisation: an organisation key on an empty organisation
    pays per call in USDC; the payment is the organisation's, the member's balance untouched."""
    from eth_account import Account as EthAccount

    from app.models import Payment
    from tests.api.test_module_call_x402 import PAY_TO, _pay

    monkeypatch.setitem(app.config, "X402_PAY_TO", PAY_TO)
    monkeypatch.setitem(app.config, "X402_NETWORKS", ["base"])
    owner, dev = make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    key = org_key(client, dev, org["id"])
    r402 = call(client, None, {"action": "ok"}, bearer=key["key"])
    assert r402.status_code == 402 and r402.headers["PAYMENT-REQUIRED"]
    # the message names whose balance is short and, for a role that cannot fund, who can
    # (before: "your balance … Add credits with POST /api/wallet/fund", which a developer cannot)
    message = r402.get_json()["message"]
    assert f"the balance of organisation {org['id']} cannot cover it" in message, message
    assert "by an owner or billing member of the organisation (your role: developer)" in message
    r = call(client, None, {"action": "ok"}, bearer=org_key(client, owner, org["id"])["key"])
    assert r.status_code == 402 and "owner or billing member" not in r.get_json()["message"]
    r = call(client, None, {"action": "ok"}, bearer=key["key"],
             headers={"PAYMENT-SIGNATURE": _pay(r402, EthAccount.create())})
    assert r.status_code == 200, r.get_json()
    assert balances(app, org["id"], dev.id) == [0, 1000]
    with app.app_context():
        payment = db.session.execute(select(Payment).where(Payment.method == "x402")).scalar_one()
        assert (payment.account_id, payment.amount_micros) == (org["id"], 30_000)
        db.session.remove()
    ledger_clean()


def test_alerts_watch_an_organisation_with_org_id(app, client, make_account):
    owner, billing, dev = make_account(), make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], billing, "billing")
    join(app, org["id"], dev, "developer")
    body = {"name": "org spend", "metric": "spend_cents", "op": ">", "threshold": 100, "window": "day",
            "channel": "webhook", "target": "https://hooks.example.com/org", "org_id": org["id"]}
    r = client.post("/api/alerts", json=body, headers=dev.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    r = client.post("/api/alerts", json=body, headers=billing.headers)
    assert r.status_code == 201, r.get_json()
    alert_id = r.get_json()["id"]
    assert client.get("/api/alerts", headers=billing.headers).get_json()["alerts"] == []  # not theirs
    listed = client.get(f"/api/alerts?org_id={org['id']}", headers=dev.headers).get_json()["alerts"]
    assert [a["id"] for a in listed] == [alert_id]
    assert client.get(f"/api/alerts/events?org_id={org['id']}", headers=dev.headers).status_code == 200
    assert client.delete(f"/api/alerts/{alert_id}", headers=billing.headers).status_code == 404  # personal
    r = client.delete(f"/api/alerts/{alert_id}?org_id={org['id']}", headers=dev.headers)
    assert r.status_code == 403
    r = client.delete(f"/api/alerts/{alert_id}?org_id={org['id']}", headers=owner.headers)
    assert r.status_code == 200
    assert client.get(f"/api/alerts?org_id={org['id']}", headers=make_account().headers).status_code == 404


def test_every_role_checked_action_has_the_name_its_refusal_reads():
    """``roles.require`` words a refusal with ``ACTION_NAMES[action]``: an action added to
    ``ACTIONS`` without a name would make its 403 a 500."""
    from app.services.orgs import roles

    assert set(roles.ACTION_NAMES) == set(roles.ACTIONS)
