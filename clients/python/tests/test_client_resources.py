"""Keys, usage, alerts, wallet, checkout, agents (sign-in and re-sign), the async client
and the OpenAI chat client, all against the live server."""
from __future__ import annotations

import asyncio
import inspect
import time

import pytest
from nacl.signing import SigningKey

from app.services.accounts import accounts
from conftest import AGENT_SESSION_TTL
from gateway_client import (AgentSession, AsyncGateway, AuthenticationError, Gateway, InvalidRequest,
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


def test_an_id_or_slug_is_one_path_segment(funded, gw_factory):
    """Ids and slugs are sent as one path segment, whatever they hold: an application
    passing a user's input as an alert id cannot make ``alerts.delete`` revoke an API key
    (before: ``"../keys/<id>"`` became ``DELETE /api/keys/<id>``), nor a module slug reach
    another route."""
    acct, gw = funded
    victim = gw.keys.create("keep-me", scopes=["account:read"])
    with pytest.raises(NotFound):
        gw.alerts.delete("../keys/" + victim.id)
    with pytest.raises(NotFound):
        gw.modules.get("../account")
    with pytest.raises(NotFound):
        gw.call("../../api/keys?", action="x", name="made-by-a-slug")
    assert gw_factory(victim.key).account().id == acct.id  # still a working key
    assert "made-by-a-slug" not in [k.name for k in gw.keys.list()]


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


def test_an_agents_chat_client_outlives_its_session(app, funded, server):
    """The OpenAI client of an ``AgentSession`` sends the session's current token, signing
    in again as the session does before its end, so it keeps working past the first
    session's life (before: it kept the first session's token: 401 once that session
    ended, though the README says a long-lived AgentSession keeps working)."""
    _, owner = funded
    sk = SigningKey.generate()
    agent = owner.agents.register("chat-bot", agent_pubkey(sk))
    with app.app_context():
        accounts.grant_credits(agent.account_id, 100, "funded by owner")
    ask = [{"role": "user", "content": "still there?"}]
    with AgentSession.sign_in(server.url, signing_key=sk) as bot:
        chat = bot.chat_client(max_retries=0)
        first = bot.api_key
        assert chat.chat.completions.create(model="demo-mini", messages=ask).choices[0].message.content
        time.sleep(AGENT_SESSION_TTL + 0.5)  # the first session has ended
        assert chat.chat.completions.create(model="demo-mini", messages=ask).choices[0].message.content
        assert bot.api_key != first


RESOURCES = ("modules", "keys", "usage", "alerts", "wallet", "pay", "receipts", "agents", "builds", "invoices",
             "payment_methods", "auto_topup", "payouts")


def test_async_client_has_every_method_of_the_sync_client():
    """The README promises the async client is "the same with await": every resource and
    method of ``Gateway`` is there, awaitable (before: no ``pay``, ``receipts``, ``agents``,
    ``modules.get``, ``keys.update``, ``wallet.transactions``: AttributeError)."""
    with Gateway("svc_live_x") as sync_gw:
        surface = {name: [m for m in dir(getattr(sync_gw, name)) if not m.startswith("_")]
                   for name in RESOURCES}
    agw = AsyncGateway("svc_live_x")
    missing = [f"{name}.{m}" for name, methods in surface.items() for m in methods
               if not inspect.iscoroutinefunction(getattr(getattr(agw, name, None), m, None))]
    assert missing == []
    asyncio.run(agw.aclose())


def test_async_client_pay_receipts_agents_wallet(funded, server):
    acct, gw = funded
    sk = SigningKey.generate()

    async def run():
        async with AsyncGateway(acct.key, server.url) as agw:
            text = await agw.modules.get("text")
            res = await agw.call("text", action="slugify", text="async pay")
            keys = await agw.receipts.keys()
            verified = await agw.receipts.verify(res.raw)
            page = await agw.wallet.transactions(limit=1)
            co = await agw.pay.checkout(500, product="credits")
            history = await agw.pay.history()
            made = await agw.keys.create("async-limited", spend_limit_cents=100, spend_limit_period="day")
            updated = await agw.keys.update(made.id, spend_limit_cents=300)
            agent = await agw.agents.register("async-bot", agent_pubkey(sk))
            funding = await agw.agents.fund(agent.id, 50)
            disabled = await agw.agents.disable(agent.id)
            return text, res, keys, verified, page, co, history, updated, agent, funding, disabled

    text, res, keys, verified, page, co, history, updated, agent, funding, disabled = asyncio.run(run())
    assert text.slug == "text" and res.cost_cents == 2 and verified is True
    assert res.receipt.kid in [k.kid for k in keys]
    assert len(page.transactions) == 1 and page.transactions[0].call_id == res.call_id and page.next_cursor
    assert co.payment_id in [p.id for p in history] and co.status == "pending"
    assert (updated.spend_limit_cents, updated.spend_limit_period) == (300, "day")
    assert funding.amount_cents == 50 and disabled.agent_id == agent.id
    assert gw.account().balance_cents == 500 - 2 - 50 + disabled.returned_micros // 10_000


def test_async_client_verifies_receipts_after_the_gateway_rotates_its_key(app, funded, server):
    """A long-lived ``AsyncGateway`` learns the receipt key the gateway rotated to (before:
    the keys were fetched once, and every later receipt raised ReceiptInvalid "unknown
    receipt key id" though it was genuine)."""
    from app.services.gateway import receipts as server_receipts

    acct, _ = funded

    async def run():
        async with AsyncGateway(acct.key, server.url) as agw:
            before = await agw.call("text", action="uppercase", text="old key")
            assert before.verify()
            with app.app_context():
                new_kid = server_receipts.rotate_key()
            for _ in range(40):  # the server's workers reload the keyring within 5 seconds
                after = await agw.call("text", action="uppercase", text="new key")
                if after.receipt.kid == new_kid:
                    break
                await asyncio.sleep(0.25)
            assert after.receipt.kid == new_kid != before.receipt.kid
            assert after.verify() is True and before.verify() is True
            return await agw.receipts.verify(before.raw)

    assert asyncio.run(run()) is True


def test_chat_client_is_the_openai_sdk(funded):
    _, gw = funded
    chat = gw.chat_client(max_retries=0)
    resp = chat.chat.completions.create(model="demo-mini",
                                        messages=[{"role": "user", "content": "hello client"}])
    assert resp.choices[0].message.content == "Echo: hello client"
    assert "auto" in [m.id for m in chat.models.list()]


def test_chat_client_takes_the_openai_clients_own_options(funded):
    """``chat_client(**kwargs)`` passes the OpenAI client's options on: headers of one's own
    are added to the client's User-Agent, a ``base_url`` replaces the derived one (before:
    TypeError "got multiple values for keyword argument", sync and async)."""
    from gateway_client import __version__

    acct, gw = funded
    chat = gw.chat_client(max_retries=0, default_headers={"X-Trace": "t1"}, base_url=gw.base_url + "/v1/")
    assert chat.default_headers["X-Trace"] == "t1"
    assert chat.default_headers["User-Agent"].startswith(f"gateway-client-python/{__version__} ")
    resp = chat.chat.completions.create(model="demo-mini", messages=[{"role": "user", "content": "own headers"}])
    assert resp.choices[0].message.content == "Echo: own headers"
    achat = AsyncGateway(acct.key, gw.base_url).chat_client(default_headers={"X-Trace": "t2"})
    assert achat.default_headers["X-Trace"] == "t2" and str(achat.base_url) == gw.base_url + "/v1/"


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


def test_an_organisations_billing_usage_alerts_and_agents_with_org_id(app, funded, gw_factory, server):
    """``org_id`` reaches the organisation's balance, payments, usage (and its filters),
    alerts and agents from the person's own key, as the OpenAPI document offers (before:
    only the key methods took it; the others always acted on the person's own account)."""
    import httpx

    from test_client_billing import paid_checkout

    acct, gw = funded
    org = httpx.post(f"{server.url}/api/orgs", json={"name": "Billing Org"},
                     headers={"Authorization": f"Bearer {acct.key}"}).json()["id"]
    assert gw.wallet.balance(org_id=org).credits_cents == 0
    payment_id = paid_checkout(app, gw, 500, org_id=org)
    assert [p.id for p in gw.pay.history(org_id=org)] == [payment_id]
    assert payment_id not in [p.id for p in gw.pay.history()]
    assert gw.wallet.balance(org_id=org).credits_cents == 500 and gw.account().balance_cents == 500

    key = gw.keys.create("org calls", org_id=org, scopes=["call:write"])
    gw_factory(key.key).call("text", action="uppercase", text="org")
    assert gw.usage.current(org_id=org).calls == 1 and gw.usage.current().calls == 0
    assert gw.usage.current(org_id=org, key_id=key.id).calls == 1
    assert gw.usage.current(org_id=org, module="weather").calls == 0
    assert [(u.slug, u.calls) for u in gw.usage.by_module(org_id=org, member_id=acct.id)] == [("text", 1)]
    assert gw.usage.daily(days=1, org_id=org)[-1].calls == 1
    assert gw.wallet.transactions(limit=1, org_id=org).transactions[0].amount_cents == -1

    alert = gw.alerts.create(org_id=org, name="org spend", metric="spend_cents", op=">=", threshold=100,
                             window="day", channel="email", target="ops@example.com")
    assert [a.id for a in gw.alerts.list(org_id=org)] == [alert.id] and gw.alerts.list() == []
    assert gw.alerts.delete(alert.id, org_id=org) is True

    agent = gw.agents.register("org-bot", agent_pubkey(SigningKey.generate()), org_id=org)
    assert gw.agents.fund(agent.id, 100, org_id=org).amount_cents == 100
    assert gw.wallet.balance(org_id=org).credits_cents == 399
    assert gw.agents.disable(agent.id, org_id=org).owner_balance_cents == 499
