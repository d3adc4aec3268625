"""Agents' module builds, earnings and the leaderboard, and the async agent session
(``AsyncAgentSession``), against the live server."""
from __future__ import annotations

import asyncio
import time

import pytest
from eth_account import Account as EthAccount
from nacl.signing import SigningKey

from app.services.accounts import accounts
from conftest import AGENT_SESSION_TTL
from gateway_client import (AgentSession, AsyncAgentSession, AuthenticationError, Conflict, PaymentRequired,
                            PermissionDenied, agent_pubkey, wallet_pubkey)


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


def test_async_agent_session_signs_in_calls_and_re_signs(app, funded, server):
    """``AsyncAgentSession`` is ``AgentSession`` with await: it signs in, pays its calls from
    the agent's balance, signs in again before the session ends and once on a 401, and its
    chat client reads the current token."""
    _, owner = funded
    sk = SigningKey.generate()
    agent = owner.agents.register("async-session-bot", agent_pubkey(sk))
    ask = [{"role": "user", "content": "async agent"}]

    async def run():
        bot = await AsyncAgentSession.sign_in(server.url, signing_key=sk)
        async with bot:
            assert bot.agent_id == agent.id and bot.api_key.startswith("svc_sess_")
            with pytest.raises(PaymentRequired):
                await bot.call("echo", action="echo", hello="agent")
            with app.app_context():
                accounts.grant_credits(agent.account_id, 100, "funded by owner")
            res = await bot.call("echo", action="echo", hello="agent")
            assert res.ok and res.cost_cents == 1 and res.verify()
            assert (await bot.account()).agent_id == agent.id

            first = bot.api_key
            await asyncio.sleep(AGENT_SESSION_TTL - bot.refresh_margin + 0.2)  # inside the refresh margin
            results = await asyncio.gather(*(bot.call("echo", action="echo", n=n) for n in range(3)))
            assert all(r.ok for r in results) and bot.api_key != first  # re-signed before expiry

            second = bot.api_key
            bot.expires_at = time.monotonic() + 3600  # the client believes its session is fresh
            await asyncio.sleep(AGENT_SESSION_TTL + 0.5)  # but the server expired it: 401 → sign in again
            assert (await bot.call("echo", action="echo", n=4)).ok and bot.api_key != second

            chat = bot.chat_client(max_retries=0)
            answer = await chat.chat.completions.create(model="demo-mini", messages=ask)
            assert answer.choices[0].message.content == "Echo: async agent"

    asyncio.run(run())


def test_a_refused_sign_in_closes_the_sessions_connections(server, monkeypatch):
    """A sign-in the gateway refuses (an unknown key, a disabled agent) raises, and the
    session it was building closes its HTTP client (before: left open, sync and async,
    with no object returned through which the caller could close it)."""
    closed = []

    async def aclose(self):
        closed.append("async")

    monkeypatch.setattr(AgentSession, "close", lambda self: closed.append("sync"))
    monkeypatch.setattr(AsyncAgentSession, "aclose", aclose)
    with pytest.raises(AuthenticationError) as exc:
        AgentSession.sign_in(server.url, signing_key=SigningKey.generate())
    assert exc.value.code == "unknown_agent"
    with pytest.raises(AuthenticationError) as exc:
        asyncio.run(AsyncAgentSession.sign_in(server.url, signing_key=SigningKey.generate()))
    assert exc.value.code == "unknown_agent"
    assert closed == ["sync", "async"]


def test_agent_signs_in_with_its_evm_wallet(funded, server):
    """Sign-In-With-X: an agent registered by its wallet's CAIP-10 account signs the
    challenge's EIP-4361 message and gets the same session, sync and async, and signs in
    again with the wallet; the challenge is bound to the server the client talks to."""
    _, owner = funded
    wallet = EthAccount.create()
    agent = owner.agents.register("evm-bot", wallet_pubkey(wallet))
    assert agent.pubkey == f"eip155:8453:{wallet.address}"
    owner.agents.fund(agent.id, 10)
    with AgentSession.sign_in(server.url, wallet=wallet) as bot:
        assert bot.agent_id == agent.id and bot.api_key.startswith("svc_sess_")
        assert bot.call("text", action="slugify", text="Signed in with X").ok
        first = bot.api_key
        bot.refresh()
        assert bot.api_key != first and bot.account().agent_id == agent.id

    async def run():
        async with await AsyncAgentSession.sign_in(server.url, wallet=wallet) as abot:
            return (await abot.account()).agent_id

    assert asyncio.run(run()) == agent.id
    with pytest.raises(AuthenticationError) as refused:  # registered on Base, not Ethereum
        AgentSession.sign_in(server.url, wallet=wallet, chain_id="eip155:1")
    assert refused.value.code == "unknown_agent"
    with pytest.raises(TypeError):
        AgentSession.sign_in(server.url, wallet=wallet, signing_key=SigningKey.generate())
    with pytest.raises(ValueError):  # a challenge for another origin is not signed
        AgentSession.sign_in(server.url.replace("127.0.0.1", "localhost"), wallet=wallet)
