"""Keys, usage, alerts, wallet, checkout, agents (sign-in and re-sign), the async client
and the OpenAI chat client, all against the live server."""
from __future__ import annotations

import asyncio
import time

import pytest
from nacl.signing import SigningKey

from app.services.accounts import accounts
from conftest import AGENT_SESSION_TTL
from gateway_client import (AgentSession, AsyncGateway, AuthenticationError, InvalidRequest,
                            NotFound, PaymentRequired, agent_pubkey)


def test_keys_create_list_revoke(funded, gw_factory):
    _, gw = funded
    made = gw.keys.create("ci", scopes=["call:write", "account:read"])
    assert made.key.startswith("svc_live_") and sorted(made.scopes) == ["account:read", "call:write"]
    assert made.id in [k.id for k in gw.keys.list()]
    scoped = gw_factory(made.key)
    assert scoped.account().id == gw.account().id
    assert gw.keys.revoke(made.id) is True
    assert made.id not in [k.id for k in gw.keys.list()]
    with pytest.raises(AuthenticationError):
        scoped.account()
    with pytest.raises(NotFound):
        gw.keys.revoke("key_does_not_exist")
    with pytest.raises(InvalidRequest):
        gw.keys.create("")


def test_usage_alerts_wallet_and_checkout(funded):
    _, gw = funded
    gw.call("text", action="slugify", text="usage")
    gw.call("weather", action="current", city="Oslo")
    cur = gw.usage.current()
    assert (cur.calls, cur.spend_cents, cur.plan_cents) == (2, 4, 2000)
    assert {(u.slug, u.calls, u.spend_cents) for u in gw.usage.by_module()} == {("text", 1, 2), ("weather", 1, 2)}

    alert = gw.alerts.create(name="spend", metric="spend_cents", op=">=", threshold=100,
                             window="day", channel="email", target="ops@example.com")
    assert alert.id and alert.secret is None
    assert alert.status == "pending_verification"  # the e-mail target confirms first (before: not readable)
    assert [a.id for a in gw.alerts.list()] == [alert.id]
    assert gw.alerts.delete(alert.id) is True and gw.alerts.list() == []

    bal = gw.wallet.balance()
    assert bal.credits_cents == 496 and bal.connected is False and bal.usdc == "0.000000"
    page = gw.wallet.transactions(limit=2)
    assert len(page.transactions) == 2 and page.next_cursor
    assert all(t.amount_cents < 0 for t in page.transactions)
    co = gw.pay.checkout(500, product="credits")
    assert co.url.startswith("http") and co.status == "pending" and co.payment_id
    with pytest.raises(InvalidRequest):
        gw.pay.checkout(5)


def test_agent_sign_in_call_and_re_sign(app, funded, server):
    owner_acct, owner = funded
    sk = SigningKey.generate()
    agent = owner.agents.register("client-bot", agent_pubkey(sk))
    assert agent.pubkey == agent_pubkey(sk)
    with AgentSession.sign_in(server.url, signing_key=sk) as bot:
        assert bot.agent_id == agent.id and bot.api_key.startswith("svc_sess_")
        with pytest.raises(PaymentRequired):
            bot.call("echo", action="echo", hello="agent")
        with app.app_context():
            accounts.grant_credits(agent.account_id, 10, "funded by owner")
        res = bot.call("echo", action="echo", hello="agent")
        assert res.ok and res.cost_cents == 1 and res.verify()

        first = bot.api_key
        time.sleep(AGENT_SESSION_TTL - bot.refresh_margin + 0.2)  # inside the refresh margin
        assert bot.call("echo", action="echo", n=2).ok
        assert bot.api_key != first  # re-signed before expiry

        second = bot.api_key
        bot.expires_at = time.monotonic() + 3600  # the client believes its session is fresh
        time.sleep(AGENT_SESSION_TTL + 0.5)  # but the server expired it: 401 → sign in again
        assert bot.call("echo", action="echo", n=3).ok and bot.api_key != second


def test_async_client(funded, server):
    acct, _ = funded

    async def run():
        async with AsyncGateway(acct.key, server.url) as agw:
            me, mods = await asyncio.gather(agw.account(), agw.modules.list())
            res = await agw.call("text", action="uppercase", text="async")
            usage = await agw.usage.current()
            key = await agw.keys.create("async-key")
            listed = await agw.keys.list()
            revoked = await agw.keys.revoke(key.id)
            return me, mods, res, usage, key, listed, revoked

    me, mods, res, usage, key, listed, revoked = asyncio.run(run())
    assert me.id == acct.id and "text" in [m.slug for m in mods]
    assert res.result == {"text": "ASYNC"} and res.verify()
    assert usage.calls == 1 and key.id in [k.id for k in listed] and revoked


def test_chat_client_is_the_openai_sdk(funded):
    _, gw = funded
    chat = gw.chat_client(max_retries=0)
    resp = chat.chat.completions.create(model="demo-mini",
                                        messages=[{"role": "user", "content": "hello client"}])
    assert resp.choices[0].message.content == "Echo: hello client"
    assert "auto" in [m.id for m in chat.models.list()]


def test_errors_in_the_chat_hosts_shape_are_read():
    """The chat host answers OpenAI's / Anthropic's error shape (issue 39): code, message
    and request id are read from it as from the gateway's."""
    from gateway_client.errors import PaymentRequired, error_for

    err = error_for(402, {"error": {"message": "Fund it.", "type": "insufficient_quota", "code": "payment_required",
                                    "param": None}, "request_id": "req_1", "price_cents": 1}, {})
    assert isinstance(err, PaymentRequired) and (err.code, err.message, err.request_id) == (
        "payment_required", "Fund it.", "req_1")
    err = error_for(404, {"type": "error", "error": {"type": "not_found_error", "message": "No.",
                                                     "code": "model_not_found"}}, {"X-Request-Id": "req_2"})
    assert (err.code, err.message, err.request_id) == ("model_not_found", "No.", "req_2")
    err = error_for(401, {"error": "unauthorized", "message": "Key?", "request_id": "req_3"}, {})
    assert (err.code, err.message) == ("unauthorized", "Key?")


def test_organisation_keys_with_org_id(funded, server):
    """``keys.create(org_id=…)`` makes an organisation key; ``list``, ``rotate`` and
    ``revoke`` reach the organisation's keys with ``org_id``, from the person's own key."""
    import httpx

    acct, gw = funded
    org = httpx.post(f"{server.url}/api/orgs", json={"name": "Client Org"},
                     headers={"Authorization": f"Bearer {acct.key}"}).json()
    made = gw.keys.create("org key", org_id=org["id"], scopes=["call:write"])
    assert (made.org_id, made.member_id) == (org["id"], acct.id) and made.key
    assert made.id not in [k.id for k in gw.keys.list()]  # the person's own keys
    assert [k.id for k in gw.keys.list(org_id=org["id"])] == [made.id]
    new = gw.keys.rotate(made.id, overlap_seconds=0, org_id=org["id"])
    assert new.org_id == org["id"] and new.id != made.id
    assert gw.keys.revoke(new.id, org_id=org["id"]) is True
    assert gw.keys.list(org_id=org["id"]) == []


def test_payment_history_shows_refunds_and_disputes(app, funded):
    """``pay.history()``: a payment's refunded and disputed amounts and the dispute's status
    are attributes, as the server answers them (before, only in ``raw``: a partially
    refunded payment read as its full amount, ``partially_refunded``, and no number)."""
    from app.extensions import db
    from app.services.billing import sandbox_checkout

    _, gw = funded
    co = gw.pay.checkout(500, product="credits")
    with app.app_context():
        sandbox_checkout.sandbox_checkout_action(co.url.rsplit("/", 1)[1], "pay", "pm_card_visa")
        sandbox_checkout.sandbox_refund(co.payment_id, 200)
        db.session.remove()
    (paid,) = [p for p in gw.pay.history() if p.id == co.payment_id]
    assert (paid.amount_cents, paid.refunded_cents, paid.disputed_cents, paid.status) == \
        (500, 200, 0, "partially_refunded")
    assert (paid.dispute_status, paid.product, paid.failure_code) == (None, "credits", None)
    assert paid.raw["refunded_cents"] == paid.refunded_cents


def test_a_checkout_can_save_the_card_it_is_paid_with(app, funded):
    """Issue 41's saved cards from the client: ``pay.checkout(save_method=True)`` (the client
    could not ask for it)."""
    from app.extensions import db
    from app.models import SavedMethod
    from app.services.billing import sandbox_checkout

    acct, gw = funded
    co = gw.pay.checkout(500, save_method=True)
    with app.app_context():
        sandbox_checkout.sandbox_checkout_action(co.url.rsplit("/", 1)[1], "pay", "pm_card_mastercard")
        saved = db.session.query(SavedMethod.payment_method_id).filter_by(account_id=acct.id).all()
        db.session.remove()
    assert [s for (s,) in saved] == ["pm_card_mastercard"]
