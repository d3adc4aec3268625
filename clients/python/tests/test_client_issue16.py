"""Client methods for the agents-and-keys features of issue 16 (spend limits, expiry,
rotation, daily usage, export, agent funding), run against the live server. Each test
is marked ``needs_issue16`` and skipped while the server's OpenAPI document lacks what it
tests; they run by themselves once the server offers it."""
from __future__ import annotations

import csv
from datetime import datetime, timedelta, timezone

import pytest
from nacl.signing import SigningKey

from conftest import needs_issue16
from gateway_client import AgentSession, ApiError, agent_pubkey


@needs_issue16(r"/api/keys", ("KeyCreate", "spend_limit_cents"))
def test_key_spend_limit_refuses_before_charging(funded, gw_factory, ledger_clean):
    _, gw = funded
    made = gw.keys.create("budget", spend_limit_cents=3, spend_limit_period="day")
    assert (made.spend_limit_cents, made.spend_limit_period, made.spent_cents) == (3, "day", 0)
    limited = gw_factory(made.key)
    assert limited.call("text", action="slugify", text="a").cost_cents == 2
    with pytest.raises(ApiError) as exc:
        limited.call("text", action="slugify", text="b")
    assert exc.value.status in (402, 403) and "limit" in exc.value.code
    listed = {k.id: k for k in gw.keys.list()}[made.id]
    assert listed.spent_cents == 2
    assert gw.account().balance_cents == 498
    assert gw.keys.update(made.id, spend_limit_cents=10, spend_limit_period="day").spend_limit_cents == 10
    assert limited.call("text", action="slugify", text="c").ok
    ledger_clean()


@needs_issue16(r"/api/keys", ("KeyUpdate", "rpm_limit"))
def test_key_update_sends_only_what_is_given(funded):
    """``keys.update`` took ``spend_limit_cents`` as a required argument and always sent both
    limit fields: a period alone could not be changed (``spend_limit_cents=None`` with a
    period is a request the server refuses), nor the controls (rpm/tpm limits, allow-lists)."""
    _, gw = funded
    made = gw.keys.create("controls", spend_limit_cents=40, spend_limit_period="day")
    moved = gw.keys.update(made.id, spend_limit_period="week")
    assert (moved.spend_limit_cents, moved.spend_limit_period) == (40, "week")
    limited = gw.keys.update(made.id, rpm_limit=30, allowed_modules=["text"])
    assert (limited.rpm_limit, limited.allowed_modules, limited.spend_limit_cents) == (30, ["text"], 40)
    freed = gw.keys.update(made.id, rpm_limit=None, spend_limit_cents=None)
    assert (freed.rpm_limit, freed.spend_limit_cents, freed.allowed_modules) == (None, None, ["text"])


@needs_issue16(r"/api/keys", ("KeyCreate", "expires_at"))
def test_key_expiry_is_sent_and_shown(funded):
    _, gw = funded
    at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    made = gw.keys.create("short-lived", expires_at=at)
    assert made.expires_at and datetime.fromisoformat(made.expires_at.replace("Z", "+00:00")) == at
    with pytest.raises(ApiError) as exc:
        gw.keys.create("in-the-past", expires_at=at - timedelta(days=1))
    assert exc.value.status == 422  # a rule of the clock, not of the schema (docs/decisions.md)


@needs_issue16(r"/api/keys/\{[^}]+\}/rotate")
def test_key_rotation_keeps_the_old_key_during_the_overlap(funded, gw_factory):
    _, gw = funded
    old = gw.keys.create("rotating", scopes=["account:read", "keys:read"])
    new = gw.keys.rotate(old.id, overlap_seconds=600)
    assert new.id != old.id and new.key != old.key
    assert (new.name, sorted(new.scopes)) == ("rotating", ["account:read", "keys:read"])
    assert gw_factory(old.key).account().id == gw_factory(new.key).account().id


@needs_issue16(r"/api/usage/daily")
def test_usage_daily(funded):
    _, gw = funded
    gw.call("text", action="uppercase", text="daily")
    days = gw.usage.daily(days=7)
    today = datetime.now(timezone.utc).date().isoformat()
    assert len(days) <= 7 and days[-1].date == today
    assert (days[-1].calls, days[-1].spend_cents) == (1, 1)


@needs_issue16(r"/api/usage/export")
def test_usage_export_csv(funded, tmp_path):
    _, gw = funded
    res = gw.call("text", action="uppercase", text="export me")
    now = datetime.now(timezone.utc)
    out = gw.usage.export(str(tmp_path / "calls.csv"), now - timedelta(days=1), now + timedelta(minutes=1))
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["call_id"] for r in rows] == [res.call_id]
    assert rows[0]["module"] == "text" and rows[0]["cost_cents"] == "1"


@needs_issue16(r"/api/agent/\{[^}]+\}/fund")
def test_owner_funds_an_agent_once_per_idempotency_key(funded, server, ledger_clean):
    _, owner = funded
    sk = SigningKey.generate()
    agent = owner.agents.register("funded-bot", agent_pubkey(sk))
    owner.agents.fund(agent.id, 200, idempotency_key="fund-1")
    owner.agents.fund(agent.id, 200, idempotency_key="fund-1")
    assert owner.account().balance_cents == 300
    with AgentSession.sign_in(server.url, signing_key=sk) as bot:
        me = bot.account()
        assert me.agent_id == agent.id and me.balance_cents == 200
        assert bot.call("echo", action="echo").ok and bot.wallet.balance().credits_cents == 199
    with pytest.raises(ApiError) as exc:
        owner.agents.fund(agent.id, 10_000)
    assert exc.value.status == 402
    with pytest.raises(ApiError) as exc:
        owner.agents.fund("agt_not_mine", 1)
    assert exc.value.status == 404
    # disabling it brings the rest back (199 cents, to the micro) and ends its sign-in
    done = owner.agents.disable(agent.id)
    assert done.returned_micros == 1_990_000 and done.owner_balance_cents == 499 and not done.replayed
    with pytest.raises(ApiError) as exc:
        AgentSession.sign_in(server.url, signing_key=sk)
    assert exc.value.status == 401 and exc.value.code == "agent_disabled"
    ledger_clean()
