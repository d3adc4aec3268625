"""Agents' module builds, earnings and the leaderboard, against the live server."""
from __future__ import annotations

import pytest
from nacl.signing import SigningKey

from gateway_client import AgentSession, Conflict, PermissionDenied, agent_pubkey


def test_builds_earnings_and_leaderboard(funded, server):
    _, owner = funded
    sk = SigningKey.generate()
    agent = owner.agents.register("builder-bot", agent_pubkey(sk), webhook="http://127.0.0.1:9/agent")
    slug = f"client-build-{agent.id[-8:].lower()}"
    with AgentSession.sign_in(server.url, signing_key=sk) as bot:
        built = bot.builds.submit(slug, 3, ["forecast", "current"], description="Forecasts")
        assert (built.slug, built.status, built.actions, built.price_cents) == (
            slug, "pending_review", ["forecast", "current"], 3)
        assert built.agent_id == agent.id and built.webhook == "http://127.0.0.1:9/agent"
        assert built.webhook_secret and built.webhook_secret.startswith("whsec_")
        with pytest.raises(Conflict):  # pending review already
            bot.builds.submit(slug, 3, ["forecast"])
        assert [b.id for b in bot.builds.list()] == [built.id]
        mine = bot.agents.earnings(agent.id)
    with pytest.raises(PermissionDenied):  # only an agent's session submits
        owner.builds.submit(slug + "-x", 1, ["a"])
    (listed,) = [b for b in owner.builds.list() if b.id == built.id]
    assert listed.webhook_secret is None and listed.description == "Forecasts"

    earned = owner.agents.earnings(agent.id)
    assert earned == mine and (earned.agent_id, earned.share_pct, earned.lifetime_cents) == (agent.id, 30, 0)
    assert earned.settlements == []
    board = owner.agents.leaderboard(limit=5)
    assert board.limit == 5 and len(board.entries) <= 5 and board.week_start < board.week_end
    assert [e.rank for e in board.entries] == list(range(1, len(board.entries) + 1))
