"""Disabling an agent (``DELETE /api/agent/{id}``; a member's removal): its owner takes back
its identity and its money. Before, a person who held an agent's private key (a member who
left the organisation, say) kept signing in and spending the balance the owner had moved
to it, and the owner had no way to stop it or to get the money back."""
from __future__ import annotations

from sqlalchemy import select

from app.extensions import db
from app.models import Account, Agent, LedgerTransaction
from app.services.money import ledger
from tests.agentkit import Keypair, register, session_headers, sign_in
from tests.orgkit import balances, h, join, make_org, org_key
from tests.support.errors import error_code


def _fund(client, headers, agent_id, cents, **extra):
    r = client.post(f"/api/agent/{agent_id}/fund", json={"amount_cents": cents, **extra}, headers=headers)
    assert r.status_code == 200, r.get_json()


def _credit(app, account_id: str, micros: int) -> None:
    """Money reaching the agent after it was disabled (as a refund of a call in flight does)."""
    with app.app_context():
        ledger.post("test_grant", [("adjust:test", -micros), (ledger.customer(account_id), micros)])
        db.session.commit()
        db.session.remove()


def test_disable_revokes_sessions_refuses_sign_in_and_returns_the_balance(app, client, make_account, ledger_clean):
    owner, stranger = make_account(cents=1000), make_account()
    kp = Keypair()
    r = register(client, owner, kp)
    assert r.status_code == 201, r.get_json()
    agent = r.get_json()
    _fund(client, owner.headers, agent["id"], 300)
    session = session_headers(client, kp)
    assert client.get("/api/account", headers=session).status_code == 200
    assert balances(app, owner.id, agent["account_id"]) == [700, 300]

    # another account's credential: 404, nothing changes
    assert client.delete(f"/api/agent/{agent['id']}", headers=stranger.headers).status_code == 404
    assert client.get("/api/account", headers=session).status_code == 200

    r = client.delete(f"/api/agent/{agent['id']}", headers=owner.headers)
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["agent_id"] == agent["id"] and body["disabled"] is True and body["replayed"] is False
    assert body["revoked_sessions"] == 1 and body["returned_micros"] == 3_000_000
    assert body["owner_balance_cents"] == 1000
    assert balances(app, owner.id, agent["account_id"]) == [1000, 0]

    # the session is refused at once, sign-in and registering the pubkey again too
    assert client.get("/api/account", headers=session).status_code == 401
    r = sign_in(client, kp)
    assert r.status_code == 401 and error_code(r.get_json()) == "agent_disabled"
    assert register(client, owner, kp).status_code == 409

    # a repeat changes nothing
    r = client.delete(f"/api/agent/{agent['id']}", headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["replayed"] is True and r.get_json()["returned_micros"] == 0
    assert r.get_json()["disabled_at"] == body["disabled_at"]

    # what reaches it later goes back to the owner on the job's next pass, to the micro
    _credit(app, agent["account_id"], 12_345)
    from app.tasks.agents import return_disabled_balances

    with app.app_context():
        assert return_disabled_balances() == 1
        assert return_disabled_balances() == 0
        assert db.session.get(Account, owner.id).balance_micros == 10_012_345
        kinds = list(db.session.execute(select(LedgerTransaction.kind).where(
            LedgerTransaction.account_id == agent["account_id"]).order_by(LedgerTransaction.id)).scalars())
        db.session.remove()
    assert kinds == ["agent_return", "agent_return"]
    # the usage and earnings stay readable
    assert client.get(f"/api/agent/{agent['id']}/usage", headers=owner.headers).status_code == 200
    ledger_clean()


def test_disable_refusals_change_nothing(app, client, make_account):
    owner = make_account()
    kp = Keypair()
    agent = register(client, owner, kp).get_json()
    for bad in ("agt_nope", "x" * 40):
        r = client.delete(f"/api/agent/{bad}", headers=owner.headers)
        assert r.status_code == 404 and error_code(r.get_json()) == "not_found", r.get_json()
    # the agent's own session cannot disable it (it owns no agent)
    assert client.delete(f"/api/agent/{agent['id']}", headers=session_headers(client, kp)).status_code == 404
    # the owner's test key does not reach its live agent
    test_owner = make_account(test_key=True)
    live = register(client, test_owner, Keypair()).get_json()
    assert client.delete(f"/api/agent/{live['id']}", headers=h(test_owner.test_key)).status_code == 404
    with app.app_context():
        assert [db.session.get(Agent, a["id"]).disabled_at for a in (agent, live)] == [None, None]
        db.session.remove()
    assert sign_in(client, kp).status_code == 200


def test_organisation_agents_disabled_by_role_and_by_removing_their_member(app, client, make_account, ledger_clean):
    from tests.api.test_orgs import _pay_checkout

    owner, admin, dev, dev2, viewer = (make_account(plan="scale") for _ in range(5))
    org = make_org(client, owner)
    oid = org["id"]
    for acct, role in ((admin, "admin"), (dev, "developer"), (dev2, "developer"), (viewer, "viewer")):
        join(app, oid, acct, role)
    _pay_checkout(client, owner, 1000, org_id=oid)
    dev_key = org_key(client, dev, oid)
    kp1, kp2, kp3 = Keypair(), Keypair(), Keypair()
    a1, a2, a3 = (client.post("/api/agent/register", json={"name": "bot", "pubkey": kp.pubkey},
                              headers=h(dev_key["key"])).get_json() for kp in (kp1, kp2, kp3))
    mine = register(client, dev, Keypair()).get_json()  # the developer's own agent stays theirs
    for a in (a1, a2, a3):
        _fund(client, owner.headers, a["id"], 100, org_id=oid)
    session = session_headers(client, kp2)
    assert balances(app, oid) == [700]

    # a viewer may not; another developer sees none of dev's agents; dev disables its own
    r = client.delete(f"/api/agent/{a1['id']}", query_string={"org_id": oid}, headers=viewer.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    assert client.delete(f"/api/agent/{a1['id']}", query_string={"org_id": oid},
                         headers=dev2.headers).status_code == 404
    r = client.delete(f"/api/agent/{a1['id']}", headers=h(dev_key["key"]))
    assert r.status_code == 200 and r.get_json()["returned_micros"] == 1_000_000, r.get_json()
    assert balances(app, oid) == [800]

    # the owner removes the developer: their org key is revoked, their other org agents
    # disabled, their balances back with the organisation; their own agent untouched
    r = client.delete(f"/api/orgs/{oid}/members/{dev.id}", headers=admin.headers)
    assert r.status_code == 200, r.get_json()
    assert sorted(r.get_json()["disabled_agents"]) == sorted([a2["id"], a3["id"]])
    assert r.get_json()["revoked_keys"] == [dev_key["id"]]
    assert balances(app, oid) == [1000]
    assert client.get("/api/account", headers=session).status_code == 401
    for kp in (kp2, kp3):
        assert error_code(sign_in(client, kp).get_json()) == "agent_disabled"
    with app.app_context():
        assert db.session.get(Agent, mine["id"]).disabled_at is None
        db.session.remove()

    log = client.get(f"/api/orgs/{oid}/audit", headers=owner.headers).get_json()["entries"]
    disabled = sorted((e["target"], e["actor_account_id"]) for e in log if e["action"] == "agent.disable")
    assert disabled == sorted([(a1["id"], dev.id), (a2["id"], admin.id), (a3["id"], admin.id)])
    removal = next(e for e in log if e["action"] == "member.remove")
    assert sorted(removal["after"]["disabled_agents"]) == sorted([a2["id"], a3["id"]])
    ledger_clean()


def test_a_role_that_may_not_register_agents_keeps_none(app, client, make_account, ledger_clean):
    """Lowering a developer to `viewer` (or `billing`) disables the agents they registered for
    the organisation, as removing them does: a read-only member kept signing in as the
    organisation's agent and spending what the organisation had funded it with. Moves
    between roles that may register agents (developer ↔ admin) disable nothing."""
    from tests.api.test_orgs import _pay_checkout

    owner, dev = make_account(plan="scale"), make_account(plan="scale")
    oid = make_org(client, owner)["id"]
    join(app, oid, dev, "developer")
    _pay_checkout(client, owner, 1000, org_id=oid)
    dev_key = org_key(client, dev, oid)
    kp = Keypair()
    agent = client.post("/api/agent/register", json={"name": "bot", "pubkey": kp.pubkey},
                        headers=h(dev_key["key"])).get_json()
    _fund(client, owner.headers, agent["id"], 100, org_id=oid)
    session = session_headers(client, kp)
    assert balances(app, oid) == [900]

    member = f"/api/orgs/{oid}/members/{dev.id}"
    r = client.patch(member, json={"role": "admin"}, headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["disabled_agents"] == [], r.get_json()
    r = client.patch(member, json={"role": "developer"}, headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["disabled_agents"] == []
    assert client.get("/api/account", headers=session).status_code == 200

    r = client.patch(member, json={"role": "viewer"}, headers=owner.headers)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["role"] == "viewer" and r.get_json()["disabled_agents"] == [agent["id"]]
    assert balances(app, oid) == [1000]  # the agent's balance is back with the organisation
    assert client.get("/api/account", headers=session).status_code == 401
    assert error_code(sign_in(client, kp).get_json()) == "agent_disabled"
    # back to developer: the agent stays disabled, nothing more moves
    r = client.patch(member, json={"role": "developer"}, headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["disabled_agents"] == []
    log = client.get(f"/api/orgs/{oid}/audit", headers=owner.headers).get_json()["entries"]
    change = [e for e in log if e["action"] == "member.update" and e["after"].get("role") == "viewer"]
    assert change and change[0]["after"]["disabled_agents"] == [agent["id"]]
    ledger_clean()


def test_a_disabled_agent_takes_no_more_funding(app, client, make_account, ledger_clean):
    """Funding a disabled agent is 409 ``agent_not_fundable`` and moves nothing; before, the
    transfer went through and the return job moved it back a minute later (two postings
    for nothing, and an owner told the money had arrived). A replay of a funding made before
    the disabling still answers that funding."""
    owner = make_account(cents=1000)
    agent = register(client, owner, Keypair()).get_json()
    headers = {**owner.headers, "Idempotency-Key": "fund-before"}
    first = client.post(f"/api/agent/{agent['id']}/fund", json={"amount_cents": 100}, headers=headers)
    assert first.status_code == 200, first.get_json()
    assert client.delete(f"/api/agent/{agent['id']}", headers=owner.headers).status_code == 200
    r = client.post(f"/api/agent/{agent['id']}/fund", json={"amount_cents": 100}, headers=owner.headers)
    assert r.status_code == 409 and error_code(r.get_json()) == "agent_not_fundable", r.get_json()
    replay = client.post(f"/api/agent/{agent['id']}/fund", json={"amount_cents": 100}, headers=headers)
    assert replay.status_code == 200 and replay.get_json()["transaction_id"] == first.get_json()["transaction_id"]
    with app.app_context():
        funds = db.session.execute(select(LedgerTransaction).where(
            LedgerTransaction.kind == "agent_fund")).scalars().all()
        assert len(funds) == 1
        assert ledger.balance(ledger.customer(owner.id)) == 1000 * 10_000  # all of it back home
        db.session.remove()
    ledger_clean()



def test_a_disabled_agents_webhook_receives_no_more_events(app, client, make_account):
    """A disabled agent's webhook still received its events: the review of a build it had
    submitted, its settlements, and the retries of an event that had failed before. As a
    disabled Stripe endpoint, it receives nothing from then on: what was waiting is
    cancelled (never re-armed by ``flask outbox redeliver --all-failed``) and no new event is
    queued for it (docs/decisions.md, "A disabled agent's webhook")."""
    from sqlalchemy import update

    from app.models import OutboxMessage
    from app.services.platform import outbox
    from tests.support.standin import recorder

    owner, admin = make_account(cents=1000), make_account(admin=True)
    kp, rec = Keypair(), recorder([500])
    with rec as url:
        agent = register(client, owner, kp, webhook=url + "/events").get_json()
        session = session_headers(client, kp)
        for slug in ("first-bot", "second-bot"):
            r = client.post("/api/agent/build", json={"slug": slug, "price_cents": 1, "actions": ["go"]},
                            headers=session)
            assert r.status_code == 202, r.get_json()
        # an event whose delivery failed, waiting for its retry
        assert client.post("/api/admin/modules/first-bot/reject", json={"reason": "no"},
                           headers=admin.headers).status_code == 200
        assert len(rec.requests) == 1
        assert client.delete(f"/api/agent/{agent['id']}", headers=owner.headers).status_code == 200
        assert client.post("/api/admin/modules/second-bot/reject", json={"reason": "no"},
                           headers=admin.headers).status_code == 200
        rec.statuses = [200]
        with app.app_context():
            rows = db.session.execute(select(OutboxMessage).where(
                OutboxMessage.account_id == agent["account_id"])).scalars().all()
            assert [(m.status, m.source.split(":")[0]) for m in rows] == [("cancelled", "submission")], \
                [(m.status, m.source, m.last_error) for m in rows]
            assert "disabled" in rows[0].last_error
            db.session.execute(update(OutboxMessage).where(OutboxMessage.id == rows[0].id)
                               .values(next_attempt_at=OutboxMessage.created_at))
            db.session.commit()
            outbox.redeliver(all_failed=True)
            outbox.sweep()
            db.session.remove()
        assert len(rec.requests) == 1  # nothing more reached the disabled agent's webhook
