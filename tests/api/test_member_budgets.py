"""Issue 37 item 4: a member's monthly budget over all their organisation keys, enforced by
the money engine in the statement of the debit (``gw_spend_reserve``): parallel calls stop
exactly at the budget, two keys share it, refunds and unused chat holds give the room back
to the month the charge was counted in, owners without a budget are unaffected, and bad
input changes nothing."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from app.extensions import db
from app.models import ChatCompletion, LedgerTransaction, MemberSpend, ModuleCall, OrgAuditEntry, OrgMember
from app.services.money import spend
from tests.chatfakes import fakes, upstreams  # noqa: F401
from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401
from tests.orgkit import balances, fund, h, join, make_org, org_key
from tests.support.errors import error_code
from tests.support.finalize import drain

NOW = datetime.now(timezone.utc)


def _team(app, client, make_account, cents=100, plan="enterprise"):
    """An organisation funded with ``cents`` (on ``plan``), its owner and a developer."""
    owner, dev = make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    fund(app, org["id"], cents, plan)
    return org, owner, dev


def _budget(client, owner, org_id, member_id, cents):
    return client.patch(f"/api/orgs/{org_id}/members/{member_id}", json={"monthly_budget_cents": cents},
                        headers=owner.headers)


def _members(client, acct, org_id) -> dict:
    r = client.get(f"/api/orgs/{org_id}/members", headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return {m["member_id"]: m for m in r.get_json()["members"]}


def _spent_micros(app, org_id, member_id, at=NOW) -> int:
    with app.app_context():
        out = spend.member_spent(org_id, [member_id], at).get(member_id, 0)
        db.session.remove()
    return out


def _charges(app, org_id) -> int:
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(LedgerTransaction).where(
            LedgerTransaction.account_id == org_id, LedgerTransaction.kind == "module_call")).scalar_one()
        db.session.remove()
    return n


def test_twelve_parallel_calls_on_three_calls_of_budget_exactly_three(app, client, make_account, mod,  # noqa: F811
                                                                       ledger_clean):
    org, owner, dev = _team(app, client, make_account)
    key = org_key(client, dev, org["id"])
    r = _budget(client, owner, org["id"], dev.id, 9)  # "ok" costs 3 cents: three calls' worth
    assert r.status_code == 200, r.get_json()
    assert (r.get_json()["monthly_budget_cents"], r.get_json()["spent_this_month_cents"]) == (9, 0)

    def one(_):
        resp = app.test_client().post("/v1/module/svc/call", json={"action": "ok"}, headers=h(key["key"]))
        return resp.status_code, resp.get_json().get("error")

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(one, range(12)))
    assert answers.count((200, None)) == 3, answers
    assert answers.count((402, "member_budget_exceeded")) == 9, answers
    assert balances(app, org["id"], dev.id) == [91, 1000]  # three charges, the member's own untouched
    assert _charges(app, org["id"]) == 3
    drain(app)
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(ModuleCall)
                                  .where(ModuleCall.account_id == org["id"])).scalar_one() == 3
        db.session.remove()
    me = _members(client, owner, org["id"])[dev.id]
    assert (me["monthly_budget_cents"], me["spent_this_month_cents"]) == (9, 9)
    refused = client.post("/v1/module/svc/call", json={"action": "ok"}, headers=h(key["key"])).get_json()
    assert (refused["budget_cents"], refused["spent_cents"], refused["member_id"], refused["org_id"]) == \
        (9, 9, dev.id, org["id"])
    assert refused["resets_at"].endswith("-01T00:00:00Z") and "Nothing was charged" in refused["message"]
    ledger_clean()


def test_the_budget_spans_the_members_keys_lowering_refuses_and_null_removes(app, client, make_account,
                                                                             mod, ledger_clean):  # noqa: F811
    org, owner, dev = _team(app, client, make_account)
    first = org_key(client, dev, org["id"])
    second = org_key(client, dev, org["id"], spend_limit_cents=50)  # a key limit of its own, too
    owner_key = org_key(client, owner, org["id"])
    assert _budget(client, owner, org["id"], dev.id, 6).status_code == 200
    assert call(client, None, {"action": "ok"}, bearer=first["key"]).status_code == 200
    assert call(client, None, {"action": "ok"}, bearer=second["key"]).status_code == 200
    for key in (first, second):  # 6 of 6 spent, by the two keys together
        r = call(client, None, {"action": "ok"}, bearer=key["key"])
        assert r.status_code == 402 and r.get_json()["error"] == "member_budget_exceeded"
    keys = {k["id"]: k for k in client.get("/api/keys", headers=h(owner_key["key"])).get_json()["keys"]}
    assert keys[second["id"]]["spent_cents"] == 3  # the budget's refusal left the key's count alone
    # the owner has no budget: unaffected (their spend is counted all the same)
    for _ in range(3):
        assert call(client, None, {"action": "ok"}, bearer=owner_key["key"]).status_code == 200
    members = _members(client, dev, org["id"])
    assert (members[owner.id]["monthly_budget_cents"], members[owner.id]["spent_this_month_cents"]) == (None, 9)
    assert balances(app, org["id"])[0] == 100 - 6 - 9
    # null removes the budget; lowered below what is spent, it refuses again; 0 refuses all
    assert _budget(client, owner, org["id"], dev.id, None).get_json()["monthly_budget_cents"] is None
    assert call(client, None, {"action": "ok"}, bearer=first["key"]).status_code == 200
    assert _budget(client, owner, org["id"], dev.id, 4).get_json()["spent_this_month_cents"] == 9
    assert call(client, None, {"action": "list"}, bearer=first["key"]).status_code == 402
    assert _budget(client, owner, org["id"], dev.id, 0).status_code == 200
    assert _budget(client, owner, org["id"], owner.id, 0).status_code == 200
    assert call(client, None, {"action": "list"}, bearer=owner_key["key"]).status_code == 402
    assert balances(app, org["id"])[0] == 100 - 6 - 9 - 3
    with app.app_context():
        updates = [(e.before, e.after) for e in db.session.execute(select(OrgAuditEntry).where(
            OrgAuditEntry.org_id == org["id"], OrgAuditEntry.action == "member.update")
            .order_by(OrgAuditEntry.id)).scalars()]
        db.session.remove()
    assert updates[:3] == [({"monthly_budget_cents": None}, {"monthly_budget_cents": 6}),
                           ({"monthly_budget_cents": 6}, {"monthly_budget_cents": None}),
                           ({"monthly_budget_cents": None}, {"monthly_budget_cents": 4})]
    ledger_clean()


def test_a_refund_gives_the_room_back_to_the_month_it_was_taken_in(app, client, make_account, mod,  # noqa: F811
                                                                   monkeypatch, ledger_clean):
    from app.services.money import charging

    org, owner, dev = _team(app, client, make_account)
    key = org_key(client, dev, org["id"])
    assert _budget(client, owner, org["id"], dev.id, 6).status_code == 200
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 200  # this month: 3
    last_month = NOW.replace(day=1, hour=12, minute=0, second=0, microsecond=0) - timedelta(days=3)
    monkeypatch.setattr(charging, "utcnow", lambda: last_month)
    # opened (and counted) in last month's period, refunded now: back to LAST month
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 200
    assert call(client, None, {"action": "boom"}, bearer=key["key"]).status_code == 502
    monkeypatch.undo()
    assert _spent_micros(app, org["id"], dev.id, last_month) == 30_000
    assert _spent_micros(app, org["id"], dev.id) == 30_000
    # this month's refund gives back to this month
    assert call(client, None, {"action": "boom"}, bearer=key["key"]).status_code == 502
    assert _spent_micros(app, org["id"], dev.id) == 30_000
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 200
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 402
    drain(app)
    with app.app_context():
        rows = db.session.execute(select(ModuleCall.status, ModuleCall.budget_member_id)
                                  .where(ModuleCall.account_id == org["id"])).all()
        db.session.remove()
    assert sorted(rows) == [("refunded", dev.id)] * 2 + [("succeeded", dev.id)] * 3
    ledger_clean()


def test_the_sweep_gives_the_room_back_too(app, client, make_account, mod):  # noqa: F811
    """A call left pending by a dead process: the sweep's refund releases the budget."""
    from app.services.gateway import calls as gateway
    from app.services.gateway.catalog import get_action, get_module
    from app.services.money import refunds

    org, owner, dev = _team(app, client, make_account)
    key = org_key(client, dev, org["id"])
    assert _budget(client, owner, org["id"], dev.id, 3).status_code == 200
    with app.test_request_context():
        module = get_module("svc")
        opened = gateway.open_call(account_id=org["id"], mode="live", mod=module, act=get_action(module, "ok"),
                                   body={"action": "ok"}, key_id=key["id"], actor=key["id"])
        db.session.remove()
    assert _spent_micros(app, org["id"], dev.id) == 30_000
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 402
    with app.app_context():
        db.session.execute(ModuleCall.__table__.update().where(ModuleCall.id == str(opened))
                           .values(deadline_at=NOW - timedelta(seconds=1)))
        db.session.commit()
        assert refunds.sweep_pending() == 1
        db.session.remove()
    assert _spent_micros(app, org["id"], dev.id) == 0
    assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 200


def test_chat_completions_count_against_the_budget(app, client, make_account, fakes, ledger_clean):  # noqa: F811
    org, owner, dev = _team(app, client, make_account, cents=500)
    key = org_key(client, dev, org["id"])
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    assert _budget(client, owner, org["id"], dev.id, 0).status_code == 200
    r = client.post("/v1/chat/completions", headers=h(key["key"]), json=body)
    assert r.status_code == 402 and error_code(r.get_json()) == "member_budget_exceeded", r.get_json()
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(ChatCompletion)).scalar_one() == 0
        db.session.remove()
    assert balances(app, org["id"]) == [500]
    assert _budget(client, owner, org["id"], dev.id, 100).status_code == 200
    r = client.post("/v1/chat/completions", headers=h(key["key"]), json=body)
    assert r.status_code == 200, r.get_json()
    with app.app_context():
        row = db.session.execute(select(ChatCompletion)).scalar_one()
        assert (row.status, row.budget_member_id) == ("settled", dev.id)
        cost, hold = row.cost_micros, row.hold_micros
        db.session.remove()
    assert 0 < cost < hold  # the unused part of the hold went back to the budget
    assert _spent_micros(app, org["id"], dev.id) == cost
    ledger_clean()


def test_a_released_chat_hold_gives_the_budget_back(app, client, make_account, fakes):  # noqa: F811
    from app.services.money import holds

    org, owner, dev = _team(app, client, make_account, cents=500)
    key = org_key(client, dev, org["id"])
    assert _budget(client, owner, org["id"], dev.id, 100).status_code == 200
    with app.app_context():
        held_at = holds.hold("chatcmpl-budget1", org["id"], "auto", 70_000, False, key_id=key["id"], actor=key["id"])
        db.session.remove()
    assert _spent_micros(app, org["id"], dev.id) == 70_000
    with app.app_context():
        assert holds.release("chatcmpl-budget1", error="test", created_at=held_at)
        db.session.remove()
    assert _spent_micros(app, org["id"], dev.id) == 0


def test_personal_keys_and_members_without_org_keys_are_unaffected(app, client, make_account, mod):  # noqa: F811
    org, owner, dev = _team(app, client, make_account)
    assert _budget(client, owner, org["id"], dev.id, 0).status_code == 200
    assert call(client, dev, {"action": "ok"}).status_code == 200  # personal key: personal money, no budget
    assert balances(app, dev.id) == [997]
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(MemberSpend)).scalar_one() == 0
        db.session.remove()


@pytest.mark.parametrize("body", [{"monthly_budget_cents": -1}, {"monthly_budget_cents": "5"},
                                  {"monthly_budget_cents": True}, {"monthly_budget_cents": 1.5},
                                  {"monthly_budget_cents": 100_000_001}, {},
                                  {"role": "boss", "monthly_budget_cents": 5}])
def test_bad_budget_input_is_400_and_changes_nothing(app, client, make_account, body):
    org, owner, dev = _team(app, client, make_account)
    r = client.patch(f"/api/orgs/{org['id']}/members/{dev.id}", json=body, headers=owner.headers)
    assert r.status_code == 400, r.get_json()
    _nothing_changed(app, org["id"], dev.id)


def test_other_orgs_members_unknown_orgs_and_roles_without_the_right(app, client, make_account):
    org, owner, dev = _team(app, client, make_account)
    other, other_owner, stranger = _team(app, client, make_account)
    assert _budget(client, owner, org["id"], stranger.id, 5).status_code == 404  # another org's member
    assert _budget(client, owner, other["id"], stranger.id, 5).status_code == 404  # not my org
    assert _budget(client, owner, "acct_nope", dev.id, 5).status_code == 404
    r = _budget(client, dev, org["id"], dev.id, 500)  # a developer cannot raise their own budget
    assert r.status_code == 403 and r.get_json()["error"] == "org_role_required"
    admin = make_account()
    join(app, org["id"], admin, "admin")
    assert _budget(client, admin, org["id"], owner.id, 5).status_code == 403  # only owners touch owners
    for org_id, member in ((org["id"], dev.id), (org["id"], owner.id), (other["id"], stranger.id)):
        _nothing_changed(app, org_id, member)
    with app.app_context():
        entries = db.session.execute(select(func.count()).select_from(OrgAuditEntry).where(
            OrgAuditEntry.action == "member.update")).scalar_one()
        db.session.remove()
    assert entries == 0


def test_an_admin_cannot_lift_their_own_budget(app, client, make_account):
    """A budget is a limit an owner or admin sets on a member; before, an admin could PATCH
    it away on themselves (200). An owner may change their own."""
    org, owner, _ = _team(app, client, make_account)
    admin, admin2 = make_account(), make_account()
    join(app, org["id"], admin, "admin")
    join(app, org["id"], admin2, "admin")
    assert _budget(client, owner, org["id"], admin.id, 5).status_code == 200
    for cents in (None, 500, 0):
        r = _budget(client, admin, org["id"], admin.id, cents)
        assert r.status_code == 403 and r.get_json()["roles"] == ["owner"], r.get_json()
        assert "your own monthly budget" in r.get_json()["message"]
    assert _members(client, owner, org["id"])[admin.id]["monthly_budget_cents"] == 5
    # another admin may (admins manage members), and an owner its own
    assert _budget(client, admin2, org["id"], admin.id, 7).status_code == 200
    assert _budget(client, owner, org["id"], owner.id, 9).status_code == 200
    # the budget sent unchanged with a role (as the console's form does) is no change
    r = client.patch(f"/api/orgs/{org['id']}/members/{admin.id}",
                     json={"role": "developer", "monthly_budget_cents": 7}, headers=admin.headers)
    assert r.status_code == 200 and r.get_json()["role"] == "developer", r.get_json()


def test_the_service_signature_the_console_calls(app, make_account, client):
    """``update_member(principal, actor, org_id, member_id, role=None, *,
    monthly_budget_cents=UNSET)``: a budget alone, a role alone, both; bad input 400."""
    from app.auth import Principal
    from app.errors import InvalidRequest
    from app.services.orgs import orgs
    from app.services.orgs.audit import Actor

    org, owner, dev = _team(app, client, make_account)
    me = Principal(account_id=owner.id, credential_id=None, credential_hash=None, kind="session", mode="live",
                   scopes=frozenset())
    with app.app_context():
        view = orgs.update_member(me, Actor(owner.id), org["id"], dev.id, monthly_budget_cents=25)
        assert (view["role"], view["monthly_budget_cents"]) == ("developer", 25)
        view = orgs.update_member(me, Actor(owner.id), org["id"], dev.id, "viewer")
        assert (view["role"], view["monthly_budget_cents"]) == ("viewer", 25)
        view = orgs.update_member(me, Actor(owner.id), org["id"], dev.id, "developer", monthly_budget_cents=None)
        assert (view["role"], view["monthly_budget_cents"]) == ("developer", None)
        for bad in (-5, "7", 2.0, False):
            with pytest.raises(InvalidRequest):
                orgs.update_member(me, Actor(owner.id), org["id"], dev.id, monthly_budget_cents=bad)
        with pytest.raises(InvalidRequest):
            orgs.update_member(me, Actor(owner.id), org["id"], dev.id)
        db.session.remove()


def _nothing_changed(app, org_id, member_id):
    with app.app_context():
        row = db.session.get(OrgMember, (org_id, member_id))
        assert row is None or row.monthly_budget_micros is None
        assert row is None or row.role in ("owner", "developer")
        assert db.session.execute(select(func.count()).select_from(OrgAuditEntry).where(
            OrgAuditEntry.org_id == org_id, OrgAuditEntry.action == "member.update")).scalar_one() == 0
        db.session.remove()

