"""Alert firings, an agent's usage, resuming and cancelling a checkout and connecting a
wallet, sync and async, against the live server."""
from __future__ import annotations

import asyncio

import pytest
from eth_account import Account as EthAccount
from eth_account.messages import encode_defunct
from nacl.signing import SigningKey

from gateway_client import AgentSession, AsyncGateway, AuthenticationError, Conflict, NotFound, agent_pubkey


def test_alert_events(app, funded):
    _, gw = funded
    assert gw.alerts.events() == []
    alert = gw.alerts.create(name="busy", metric="calls", op=">=", threshold=1, window="day",
                             channel="webhook", target="http://127.0.0.1:9/alerts")
    gw.call("text", action="slugify", text="fire")
    with app.app_context():
        from app.extensions import db
        from app.services.billing import alerts

        alerts.evaluate_all(dispatch=False)
        db.session.remove()
    (event,) = gw.alerts.events()
    assert (event.alert_id, event.name, event.metric, event.value, event.channel) == (
        alert.id, "busy", "calls", 1.0, "webhook")
    assert event.delivery_status == "pending" and event.period == event.fired_at[:10]


def test_agent_usage(funded, server):
    _, owner = funded
    sk = SigningKey.generate()
    agent = owner.agents.register("usage-bot", agent_pubkey(sk))
    owner.agents.fund(agent.id, 10)
    assert owner.agents.usage(agent.id).calls == 0
    with AgentSession.sign_in(server.url, signing_key=sk) as bot:
        bot.call("text", action="slugify", text="Agent usage")
        mine = bot.agents.usage(agent.id)
    usage = owner.agents.usage(agent.id)
    assert usage == mine and (usage.agent_id, usage.calls, usage.errors, usage.spend_cents) == (agent.id, 1, 0, 2)
    assert [(u.slug, u.calls) for u in usage.by_module] == [("text", 1)] and usage.by_model == []
    with pytest.raises(NotFound):
        owner.agents.usage("agt_nope")


def test_checkout_resumed_and_cancelled(funded):
    _, gw = funded
    started = gw.pay.checkout(700)
    state = gw.pay.get_checkout(started.payment_id)
    assert (state.payment_id, state.status, state.url) == (started.payment_id, "pending", started.url)
    canceled = gw.pay.cancel_checkout(started.payment_id)
    assert (canceled.id, canceled.status, canceled.amount_cents) == (started.payment_id, "canceled", 700)
    assert gw.pay.get_checkout(started.payment_id).url is None
    with pytest.raises(Conflict):
        gw.pay.cancel_checkout(started.payment_id)
    with pytest.raises(NotFound):
        gw.pay.get_checkout("pay_nope")


def sign(wallet, message: str) -> str:
    """EIP-191 ``personal_sign`` of ``message``, 0x-hex."""
    return "0x" + wallet.sign_message(encode_defunct(text=message)).signature.hex().removeprefix("0x")


def test_wallet_connect(funded, server):
    acct, gw = funded
    wallet = EthAccount.create()
    msg = gw.wallet.connect_message("base", wallet.address)
    assert msg.address == wallet.address and msg.nonce in msg.message
    with pytest.raises(AuthenticationError):  # signed by another key
        gw.wallet.connect("base", wallet.address, sign(EthAccount.create(), msg.message), msg.nonce)

    async def connect():
        async with AsyncGateway(acct.key, server.url) as agw:
            fresh = await agw.wallet.connect_message("base", wallet.address)
            return fresh, await agw.wallet.connect("base", wallet.address, sign(wallet, fresh.message), fresh.nonce)

    fresh, connected = asyncio.run(connect())
    assert (connected.chain, connected.address, connected.connected) == ("base", wallet.address, True)
    with pytest.raises(Conflict):  # the message is single use
        gw.wallet.connect("base", wallet.address, sign(wallet, fresh.message), fresh.nonce)
