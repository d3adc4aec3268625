"""Endpoints 11–13: agent usage, earnings and the leaderboard; visibility (BOLA)."""
from __future__ import annotations

from datetime import timedelta

import pytest

from app.extensions import db
from app.models.base import utcnow
from app.services.agents import earnings
from app.services.billing import usage
from tests import usage_seed
from tests.agentkit import Keypair, charge, refund, register, session_headers


@pytest.fixture
def two_agents(client, make_account):
    out = []
    for name in ("alpha", "beta"):
        owner = make_account(cents=500)
        kp = Keypair()
        ag = register(client, owner, kp, name=name).get_json()
        out.append({"owner": owner, "agent": ag, "headers": session_headers(client, kp)})
    return out


def test_bola_on_every_id_endpoint(client, two_agents, make_account):
    a, b = two_agents
    stranger = make_account()
    for suffix in ("usage", "earnings"):
        url = f"/api/agent/{a['agent']['id']}/{suffix}"
        assert client.get(url, headers=a["headers"]).status_code == 200       # the agent itself
        assert client.get(url, headers=a["owner"].headers).status_code == 200  # its owner account
        for headers in (b["headers"], b["owner"].headers, stranger.headers):
            r = client.get(url, headers=headers)
            assert r.status_code == 404 and r.get_json()["error"] == "not_found"
        r = client.get(f"/api/agent/agt_doesnotexist/{suffix}", headers=a["headers"])
        assert r.status_code == 404
        r = client.get(f"/api/agent/{'x' * 300}/{suffix}", headers=a["headers"])
        assert r.status_code == 404


def test_scope_agent_read_required(client, two_agents, make_account):
    a = two_agents[0]
    from app.services.accounts import keys
    from flask import current_app  # noqa: F401
    with client.application.app_context():
        _, secret = keys.mint(a["owner"].id, "no-agent", ["call:read"])
    for url in (f"/api/agent/{a['agent']['id']}/usage", f"/api/agent/{a['agent']['id']}/earnings",
                "/api/agent/leaderboard", "/api/agent/builds"):
        r = client.get(url, headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"


def test_usage_current_period(app, client, two_agents):
    a = two_agents[0]
    with app.app_context():
        acct = a["agent"]["account_id"]
        usage_seed.record(acct, "weather", spend_micros=50_000)
        usage_seed.record(acct, "weather", spend_micros=50_000, error=True)
        usage_seed.record(acct, "search", spend_micros=12_345)
        usage_seed.record(acct, "search", spend_micros=99_999, mode="test")
        usage_seed.record(acct, "weather", spend_micros=10**6, at=utcnow() - timedelta(days=40))
        db.session.commit()
    body = client.get(f"/api/agent/{a['agent']['id']}/usage", headers=a["headers"]).get_json()
    assert body["calls"] == 3 and body["errors"] == 1 and body["spend_cents"] == 11
    assert body["by_module"] == [{"slug": "weather", "calls": 2, "spend_cents": 10},
                                 {"slug": "search", "calls": 1, "spend_cents": 1}]
    start, end = usage.billing_period()
    assert body["period_start"].startswith(start.strftime("%Y-%m-%dT00:00:00"))


def test_earnings_accrue_and_refunds(app, client, two_agents, ledger_clean):
    a, b = two_agents
    with app.app_context():
        charge(b["owner"].id, a["agent"]["id"], 10)   # 3 cents to alpha
        charge(b["owner"].id, a["agent"]["id"], 7)    # 2.1 cents
        charge(b["owner"].id, None, 50)               # catalog module: nothing for agents
        refund(b["owner"].id, a["agent"]["id"], 7)
    body = client.get(f"/api/agent/{a['agent']['id']}/earnings", headers=a["owner"].headers).get_json()
    assert body["accrued_cents"] == 3 and body["accrued_micros"] == 30_000
    assert body["settled_cents"] == 0 and body["lifetime_cents"] == 3 and body["share_pct"] == 30
    assert body["settlements"] == []
    ledger_clean()


def test_leaderboard(app, client, two_agents, make_account, ledger_clean):
    a, b = two_agents
    payer = make_account(cents=10_000)
    week_start, _ = earnings.iso_week()
    with app.app_context():
        charge(payer.id, a["agent"]["id"], 100)                     # alpha: 30
        charge(payer.id, b["agent"]["id"], 200)                     # beta: 60
        charge(payer.id, a["agent"]["id"], 1000, at=week_start - timedelta(seconds=1))  # last week
    r = client.get("/api/agent/leaderboard", headers=payer.headers)
    assert r.status_code == 200
    body = r.get_json()
    assert body["limit"] == 10 and body["week_start"].startswith(week_start.strftime("%Y-%m-%dT00:00:00"))
    assert body["entries"] == [
        {"rank": 1, "agent_id": b["agent"]["id"], "name": "beta", "earnings_cents": 60},
        {"rank": 2, "agent_id": a["agent"]["id"], "name": "alpha", "earnings_cents": 30},
    ]
    one = client.get("/api/agent/leaderboard?limit=1", headers=a["headers"]).get_json()["entries"]
    assert [e["agent_id"] for e in one] == [b["agent"]["id"]]
    for bad in ("0", "101", "x"):
        assert client.get(f"/api/agent/leaderboard?limit={bad}", headers=payer.headers).status_code == 400
    ledger_clean()


def test_iso_week_boundaries():
    from datetime import datetime, timezone
    sunday = datetime(2026, 11, 22, 23, 59, tzinfo=timezone.utc)
    assert earnings.iso_week(sunday)[0] == datetime(2026, 11, 16, tzinfo=timezone.utc)
    monday = datetime(2026, 11, 23, 0, 0, tzinfo=timezone.utc)
    assert earnings.iso_week(monday) == (monday, monday + timedelta(days=7))


def test_a_test_mode_agents_usage_counts_its_test_calls(app, client, make_account):
    """A test-mode agent (registered with a svc_test_ key) acts in test mode: its sessions'
    calls are test calls, so its usage is those (until 2026-11-29 it counted live calls
    only and read 0 whatever the agent called); a live agent's stays live (above)."""
    owner = make_account(test_key=True)
    kp = Keypair()
    ag = client.post("/api/agent/register", json={"name": "sandbox-bot", "pubkey": kp.pubkey},
                     headers={"Authorization": f"Bearer {owner.test_key}"}).get_json()
    with app.app_context():
        usage_seed.record(ag["account_id"], "weather", spend_micros=20_000, mode="test", calls=2)
        usage_seed.record(ag["account_id"], "echo", spend_micros=10_000, mode="test", error=True)
        usage_seed.record(ag["account_id"], "weather", spend_micros=990_000)  # live: not this agent's mode
        db.session.commit()
    for headers in (session_headers(client, kp), {"Authorization": f"Bearer {owner.test_key}"}):
        body = client.get(f"/api/agent/{ag['id']}/usage", headers=headers).get_json()
        assert (body["calls"], body["errors"], body["spend_cents"]) == (3, 1, 3), body
        assert body["by_module"] == [{"slug": "weather", "calls": 2, "spend_cents": 2},
                                     {"slug": "echo", "calls": 1, "spend_cents": 1}]


def test_lifetime_is_exact_in_micros_and_each_cents_field_is_its_floor(app, client, two_agents, ledger_clean):
    """Earnings in sub-cent amounts: 2.7 cents settled (last month) and 2.7 accrued (this
    month). Every `_cents` field is the floor of its `_micros`, so lifetime_cents is 5
    while accrued_cents + settled_cents is 4: the sum holds exactly in micros, and
    `lifetime_micros` states it (there was none, and lifetime_cents was documented as the
    sum of the two cents fields)."""
    from app.services.money import settlement

    a, b = two_agents
    now = utcnow()
    last_month = now.replace(day=1) - timedelta(days=1)
    with app.app_context():
        charge(b["owner"].id, a["agent"]["id"], 9, at=last_month)  # 2.7 cents to alpha
        settlement.settle_month(f"{last_month.year:04d}-{last_month.month:02d}",  # past the grace hour
                                now=now.replace(day=1, hour=2, minute=0, second=0, microsecond=0))
        db.session.commit()
        charge(b["owner"].id, a["agent"]["id"], 9)                  # 2.7 cents, not settled
    body = client.get(f"/api/agent/{a['agent']['id']}/earnings", headers=a["headers"]).get_json()
    assert (body["accrued_micros"], body["settled_micros"], body["lifetime_micros"]) == (27_000, 27_000, 54_000)
    assert (body["accrued_cents"], body["settled_cents"], body["lifetime_cents"]) == (2, 2, 5)
    [statement] = body["settlements"]
    assert (statement["amount_micros"], statement["amount_cents"]) == (27_000, 2)
    ledger_clean()


def test_an_agents_chat_completions_are_by_model_not_modules(app, client, two_agents):
    """An agent's session may use the chat host; its completions are usage product
    `chat:<model>`, which the agent's usage listed in `by_module` as if `chat:demo-mini`
    were a module slug. They are `by_model`, as on `GET /api/usage/by-module`; the totals
    count both."""
    a = two_agents[0]
    with app.app_context():
        acct = a["agent"]["account_id"]
        usage_seed.record(acct, "weather", spend_micros=20_000)
        usage_seed.record(acct, "chat:demo-mini", spend_micros=15_001, calls=3)
        db.session.commit()
    body = client.get(f"/api/agent/{a['agent']['id']}/usage", headers=a["headers"]).get_json()
    assert (body["calls"], body["spend_cents"]) == (4, 3)
    assert body["by_module"] == [{"slug": "weather", "calls": 1, "spend_cents": 2}]
    assert body["by_model"] == [{"model": "demo-mini", "calls": 3, "spend_cents": 1, "spend_micros": 15_001}]
