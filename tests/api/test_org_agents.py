"""Issue 37 item 7: agents belong to organisations. An agent registered with an organisation
key, or with ``org_id``, is owned by the organisation: the organisation funds it (its owners
and billing members) and reads its usage and earnings; the registration is in the
organisation's audit log. Refusals create nothing."""
from __future__ import annotations

from sqlalchemy import func, select

from app.extensions import db
from app.models import Account, Agent
from tests.agentkit import Keypair
from tests.orgkit import balances, h, join, make_org, org_key
from tests.support.errors import error_code


def _register(client, headers, **extra):
    return client.post("/api/agent/register", json={"name": "bot", "pubkey": Keypair().pubkey, **extra},
                       headers=headers)


def _agents(app) -> int:
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(Agent)).scalar_one()
        db.session.remove()
    return n


def test_agents_registered_in_an_organisation_belong_to_it(app, client, make_account, ledger_clean):
    from tests.api.test_orgs import _pay_checkout

    owner, billing, dev, viewer, stranger = (make_account(plan="scale") for _ in range(5))
    org = make_org(client, owner)
    oid = org["id"]
    for acct, role in ((billing, "billing"), (dev, "developer"), (viewer, "viewer")):
        join(app, oid, acct, role)
    _pay_checkout(client, owner, 1000, org_id=oid)
    dev_key, owner_key = (org_key(client, a, oid) for a in (dev, owner))

    by_key = _register(client, h(dev_key["key"]))  # an organisation key: the organisation's agent
    assert by_key.status_code == 201, by_key.get_json()
    by_org_id = _register(client, dev.headers, org_id=oid)  # a personal key with org_id
    assert by_org_id.status_code == 201, by_org_id.get_json()
    mine = _register(client, dev.headers)  # without: the person's own, as before
    with app.app_context():
        owners = [db.session.get(Account, r.get_json()["account_id"]).owner_account_id
                  for r in (by_key, by_org_id, mine)]
        db.session.remove()
    assert owners == [oid, oid, dev.id]

    # the organisation funds it (owner and billing roles), from its balance
    agent_id = by_org_id.get_json()["id"]
    r = client.post(f"/api/agent/{agent_id}/fund", json={"amount_cents": 100}, headers=h(owner_key["key"]))
    assert r.status_code == 200 and r.get_json()["owner_balance_cents"] == 900, r.get_json()
    r = client.post(f"/api/agent/{agent_id}/fund", json={"amount_cents": 50, "org_id": oid},
                    headers=billing.headers)  # a billing member (who has no organisation key) with org_id
    assert r.status_code == 200 and r.get_json()["agent_balance_cents"] == 150, r.get_json()
    r = client.post(f"/api/agent/{agent_id}/fund", json={"amount_cents": 50}, headers=h(dev_key["key"]))
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    r = client.post(f"/api/agent/{agent_id}/fund", json={"amount_cents": 50, "org_id": oid}, headers=dev.headers)
    assert r.status_code == 403 and r.get_json()["roles"] == ["owner", "billing"]
    assert client.post(f"/api/agent/{agent_id}/fund", json={"amount_cents": 50},
                       headers=dev.headers).status_code == 404  # the person owns no such agent
    assert client.post(f"/api/agent/{agent_id}/fund", json={"amount_cents": 50, "org_id": oid},
                       headers=stranger.headers).status_code == 404
    assert balances(app, oid, dev.id) == [850, 1000]
    # its usage and earnings are the organisation's to read
    for path in ("usage", "earnings"):
        assert client.get(f"/api/agent/{agent_id}/{path}", headers=h(dev_key["key"])).status_code == 200
        assert client.get(f"/api/agent/{agent_id}/{path}", headers=dev.headers).status_code == 404

    log = client.get(f"/api/orgs/{oid}/audit", headers=owner.headers).get_json()["entries"]
    registered = [(e["actor_account_id"], e["target"]) for e in log if e["action"] == "agent.register"]
    assert sorted(registered) == sorted([(dev.id, by_key.get_json()["id"]), (dev.id, agent_id)])
    assert [e["after"]["amount_micros"] for e in log if e["action"] == "agent.fund"] == [500_000, 1_000_000]

    # refusals: a role without agent:write, not a member, an unknown or another organisation
    count = _agents(app)
    other = make_org(client, stranger, "Other")
    r = _register(client, viewer.headers, org_id=oid)
    assert r.status_code == 403 and "owner, admin or developer" in r.get_json()["message"]
    assert _register(client, stranger.headers, org_id=oid).status_code == 404
    assert _register(client, dev.headers, org_id="acct_unknown").status_code == 404
    assert _register(client, dev.headers, org_id=other["id"]).status_code == 404
    assert _register(client, h(dev_key["key"]), org_id=other["id"]).status_code == 404
    assert _register(client, dev.headers, org_id="").status_code == 400
    assert _agents(app) == count
    ledger_clean()
