"""Endpoints 9–10 and the review (admin API + CLI) of agent-built modules."""
from __future__ import annotations

import json

import pytest
from standardwebhooks import Webhook

from app.extensions import db
from app.models import Module, ModuleSubmission
from tests.agentkit import Keypair, register, session_headers
from tests.support.standin import recorder

SUB = {"slug": "weather-bot", "price_cents": 5, "actions": ["forecast", "current"]}


@pytest.fixture
def agent(client, account):
    kp = Keypair()
    ag = register(client, account, kp, webhook="http://127.0.0.1:9/agent").get_json()
    return {"kp": kp, "agent": ag, "owner": account, "headers": session_headers(client, kp)}


@pytest.fixture
def admin(make_account):
    return make_account(admin=True)


def _submit(client, agent, **over):
    return client.post("/api/agent/build", json={**SUB, **over}, headers=agent["headers"])


def test_submit_and_list(client, agent, make_account):
    r = _submit(client, agent, webhook="http://127.0.0.1:9/module", description="Forecasts")
    assert r.status_code == 202, r.get_json()
    b = r.get_json()
    assert b["status"] == "pending_review" and b["slug"] == "weather-bot" and b["id"].startswith("bld_")
    assert b["actions"] == ["forecast", "current"] and b["price_cents"] == 5
    assert b["webhook"] == "http://127.0.0.1:9/module" and b["webhook_secret"].startswith("whsec_")
    assert b["review_notes"] is None and b["agent_id"] == agent["agent"]["id"]
    listed = client.get("/api/agent/builds", headers=agent["headers"]).get_json()["builds"]
    assert [x["id"] for x in listed] == [b["id"]]
    # the owner account's key sees its agents' builds; another account sees none
    by_owner = client.get("/api/agent/builds", headers=agent["owner"].headers).get_json()["builds"]
    assert [x["id"] for x in by_owner] == [b["id"]]
    assert client.get("/api/agent/builds", headers=make_account().headers).get_json()["builds"] == []


def test_defaults_to_agent_webhook(client, agent):
    assert _submit(client, agent).get_json()["webhook"] == "http://127.0.0.1:9/agent"


def test_only_agents_submit(client, account):
    r = client.post("/api/agent/build", json=SUB, headers=account.headers)
    assert r.status_code == 403 and r.get_json()["error"] == "forbidden"


@pytest.mark.parametrize("over", [
    {"slug": "Weather"}, {"slug": "-x"}, {"slug": "a" * 65}, {"slug": "with space"}, {"slug": ""},
    {"price_cents": -1}, {"price_cents": 1.5}, {"price_cents": "5"}, {"price_cents": 10**9},
    {"actions": []}, {"actions": ["ok", "ok"]}, {"actions": ["Bad Name"]}, {"actions": "forecast"},
    {"actions": ["v1.search"]},  # no dot: an action is half of an MCP tool name (before: 202)
    {"actions": [1]}, {"webhook": "ftp://x/y"}, {"webhook": "not a url"},
])
def test_submit_validation(client, agent, over):
    r = _submit(client, agent, **over)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", (over, r.get_json())


def test_missing_fields(client, agent):
    for field in ("slug", "price_cents", "actions"):
        body = {k: v for k, v in SUB.items() if k != field}
        assert client.post("/api/agent/build", json=body, headers=agent["headers"]).status_code == 400


def test_submit_webhook_refused_when_private(app, client, agent):
    app.config["ALLOW_PRIVATE_URLS"] = False
    try:
        r = _submit(client, agent, webhook="https://127.0.0.1/m")
        assert r.status_code == 422 and "webhook" in r.get_json()["message"]  # the SSRF guard: 422
    finally:
        app.config["ALLOW_PRIVATE_URLS"] = True


def test_slug_conflicts(app, client, agent, make_account):
    assert _submit(client, agent).status_code == 202
    r = _submit(client, agent)
    assert r.status_code == 409 and "pending" in r.get_json()["message"]
    owner2 = make_account()
    kp2 = Keypair()
    register(client, owner2, kp2, webhook="http://127.0.0.1:9/b")
    other = {"headers": session_headers(client, kp2)}
    assert _submit(client, other).status_code == 409
    with app.app_context():  # a catalog module's slug
        db.session.add(Module(slug="catalog-thing", name="c", upstream_url="http://127.0.0.1:9/"))
        db.session.commit()
    assert _submit(client, agent, slug="catalog-thing").status_code == 409


def test_admin_api_requires_admin(client, agent, account):
    _submit(client, agent)
    for method, url in (("get", "/api/admin/modules/pending"),
                        ("post", "/api/admin/modules/weather-bot/approve"),
                        ("post", "/api/admin/modules/weather-bot/reject")):
        r = getattr(client, method)(url, json={"reason": "x"}, headers=account.headers)
        assert r.status_code == 403 and r.get_json()["error"] == "forbidden"
        r = getattr(client, method)(url, json={"reason": "x"}, headers=agent["headers"])
        assert r.status_code == 403


def test_approve_makes_module(app, client, agent, admin):
    rec = recorder([200])
    with rec as url:
        with app.app_context():  # point the agent's event webhook at the recorder
            from app.models import Agent
            db.session.get(Agent, agent["agent"]["id"]).webhook = url + "/events"
            db.session.commit()
        sub = _submit(client, agent, webhook="http://127.0.0.1:9/module").get_json()
        pending = client.get("/api/admin/modules/pending", headers=admin.headers).get_json()["pending"]
        assert [p["slug"] for p in pending] == ["weather-bot"] and "webhook_secret" not in pending[0]
        r = client.post("/api/admin/modules/weather-bot/approve", json={"notes": "Looks good"},
                        headers=admin.headers)
        assert r.status_code == 200 and r.get_json()["status"] == "approved"
        event = rec.requests[0]
        payload = Webhook(agent["agent"]["webhook_secret"]).verify(
            event.body, {k.lower(): v for k, v in event.headers.items()})
        assert payload["type"] == "module.approved" and payload["data"]["slug"] == "weather-bot"
    with app.app_context():
        mod = db.session.query(Module).filter_by(slug="weather-bot").one()
        assert mod.status == "approved" and mod.source == "agent"
        assert mod.owner_agent_id == agent["agent"]["id"] and mod.upstream_url == "http://127.0.0.1:9/module"
        assert mod.provider_auth == {"type": "standard_webhooks", "secret": sub["webhook_secret"]}
        assert sorted((a.name, a.price_cents, a.active) for a in mod.actions) == [
            ("current", 5, True), ("forecast", 5, True)]
    listed = client.get("/api/agent/builds", headers=agent["headers"]).get_json()["builds"]
    assert listed[0]["status"] == "approved" and listed[0]["review_notes"] == "Looks good"
    assert client.get("/api/admin/modules/pending", headers=admin.headers).get_json()["pending"] == []
    r = client.post("/api/admin/modules/weather-bot/approve", json={}, headers=admin.headers)
    assert r.status_code == 404

    # resubmission by the owner changes price and actions on approval
    assert _submit(client, agent, price_cents=9, actions=["forecast"]).status_code == 202
    with app.app_context():
        mod = db.session.query(Module).filter_by(slug="weather-bot").one()
        assert {a.price_cents for a in mod.actions} == {5}  # unchanged until approved
    r = client.post("/api/admin/modules/weather-bot/approve", headers=admin.headers)  # no body: documented optional
    assert r.status_code == 200 and r.get_json()["review_notes"] is None
    with app.app_context():
        mod = db.session.query(Module).filter_by(slug="weather-bot").one()
        assert sorted((a.name, a.price_cents, a.active) for a in mod.actions) == [
            ("current", 5, False), ("forecast", 9, True)]


def test_reject(app, client, agent, admin):
    _submit(client, agent)
    r = client.post("/api/admin/modules/weather-bot/reject", json={}, headers=admin.headers)
    assert r.status_code == 400
    r = client.post("/api/admin/modules/weather-bot/reject", json={"reason": "Spammy"}, headers=admin.headers)
    assert r.status_code == 200 and r.get_json()["status"] == "rejected"
    b = client.get("/api/agent/builds", headers=agent["headers"]).get_json()["builds"][0]
    assert b["status"] == "rejected" and b["review_notes"] == "Spammy"
    with app.app_context():
        assert db.session.query(Module).filter_by(slug="weather-bot").count() == 0
    # the slug is free again after a rejection
    assert _submit(client, agent).status_code == 202
    assert client.post("/api/admin/modules/nope/reject", json={"reason": "x"},
                       headers=admin.headers).status_code == 404


def test_cli_review(app, client, agent):
    runner = app.test_cli_runner()
    _submit(client, agent)
    out = runner.invoke(args=["modules", "pending"])
    assert out.exit_code == 0 and json.loads(out.output.splitlines()[0])["slug"] == "weather-bot"
    out = runner.invoke(args=["modules", "reject", "weather-bot"])
    assert out.exit_code != 0  # --reason is required
    out = runner.invoke(args=["modules", "approve", "weather-bot", "--notes", "ok"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["status"] == "approved"
    out = runner.invoke(args=["modules", "approve", "weather-bot"])
    assert out.exit_code == 1 and "not_found" in out.output
    _submit(client, agent, price_cents=7)
    out = runner.invoke(args=["modules", "reject", "weather-bot", "--reason", "price too high"])
    assert out.exit_code == 0 and json.loads(out.output)["review_notes"] == "price too high"
    with app.app_context():
        assert [s.status for s in db.session.query(ModuleSubmission).order_by(ModuleSubmission.created_at)] \
            == ["approved", "rejected"]


def test_an_action_refusal_states_the_rule_it_applies(app, agent):
    """The service's refusal of an action name states the rule it applies (no dot), as the
    schema's pattern does; it named a pattern with a dot (the schema refuses first on the
    API, so only a direct caller of the service read it)."""
    from app.errors import InvalidRequest
    from app.services.agents import builds

    with app.app_context(), pytest.raises(InvalidRequest) as err:
        builds.submit(agent["agent"]["id"], slug="dot-bot", price_cents=1, actions=["v1.search"])
    assert builds.ACTION_RE.pattern in str(err.value) and "_.-" not in str(err.value)


def test_a_build_webhook_is_refused_at_submission_when_no_module_can_hold_it(app, client, agent, admin):
    """Approval copies a build's `webhook` to the module's upstream URL (at most 500
    characters). A longer one was accepted (202, up to 2,000) and its approval failed (500):
    the build could never be approved. Now it is refused when submitted: 400 when sent, 409
    when it is the agent's own (stored) webhook; 500 characters are approved."""
    base = "http://127.0.0.1:9/module?q="
    assert _submit(client, agent, slug="long-hook", webhook=base + "q" * (501 - len(base))).status_code == 400
    with app.app_context():
        from app.models import Agent
        db.session.get(Agent, agent["agent"]["id"]).webhook = base + "a" * (600 - len(base))
        db.session.commit()
    r = _submit(client, agent, slug="long-hook")
    assert r.status_code == 409 and r.get_json()["error"] == "conflict", r.get_json()
    fits = base + "q" * (500 - len(base))
    assert _submit(client, agent, slug="long-hook", webhook=fits).status_code == 202
    r = client.post("/api/admin/modules/long-hook/approve", headers=admin.headers)
    assert r.status_code == 200 and r.get_json()["status"] == "approved", r.get_json()
    with app.app_context():
        assert db.session.query(Module).filter_by(slug="long-hook").one().upstream_url == fits


def test_a_disabled_agents_pending_build_is_not_approved(app, client, agent, admin):
    """Disabling an agent says its key is no longer trusted; a build it submitted before
    (its webhook, possibly the leaker's server) was still approvable and went live. Now the
    approval is 409 and changes nothing; rejecting it still works."""
    assert _submit(client, agent, webhook="http://127.0.0.1:9/module").status_code == 202
    owner = agent["owner"]
    assert client.delete(f"/api/agent/{agent['agent']['id']}", headers=owner.headers).status_code == 200
    r = client.post("/api/admin/modules/weather-bot/approve", json={}, headers=admin.headers)
    assert r.status_code == 409 and "disabled" in r.get_json()["message"], r.get_json()
    with app.app_context():
        assert db.session.query(Module).filter_by(slug="weather-bot").one_or_none() is None
        db.session.remove()
    r = client.post("/api/admin/modules/weather-bot/reject", json={"reason": "agent disabled"}, headers=admin.headers)
    assert r.status_code == 200 and r.get_json()["status"] == "rejected"


def test_listing_names_the_owner_agent_by_its_current_name(app, client, agent, admin):
    """The module listing kept the agent's name from approval time: an agent renamed since
    (registering its pubkey again with another name) was listed under its old name."""
    assert _submit(client, agent).status_code == 202
    assert client.post("/api/admin/modules/weather-bot/approve", json={}, headers=admin.headers).status_code == 200
    r = register(client, agent["owner"], agent["kp"], name="forecaster", webhook="http://127.0.0.1:9/agent")
    assert r.status_code in (200, 201) and r.get_json()["name"] == "forecaster", r.get_json()
    listed = {m["slug"]: m for m in client.get("/api/modules").get_json()["modules"]}
    assert listed["weather-bot"]["owner"] == "forecaster"
    assert listed["weather-bot"]["description"] == "Agent-built module by forecaster."  # no description sent
    assert client.get("/api/modules/weather-bot").get_json()["owner"] == "forecaster"
    with app.app_context():  # as approved before 2026-11-29: the text stored with the name of then
        db.session.query(Module).filter_by(slug="weather-bot").update({"description": "Agent-built module by bot."})
        db.session.commit()
    assert client.get("/api/modules/weather-bot").get_json()["description"] == "Agent-built module by forecaster."
