"""Metered calls through the client against the live server: results, receipts verified
offline (and tampering detected), idempotent replays charged once, and every error family."""
from __future__ import annotations

import dataclasses

import pytest

from gateway_client import (ApiError, AuthenticationError, Conflict, InvalidRequest, NotFound,
                            PaymentRequired, PermissionDenied, RateLimited, ReceiptInvalid,
                            __version__)


def test_account_modules_and_a_verified_call(funded, ledger_clean):
    acct, gw = funded
    me = gw.account()
    assert (me.id, me.plan, me.balance_cents, me.agent_id) == (acct.id, "starter", 500, None)
    mods = {m.slug: m for m in gw.modules.list()}
    assert {"echo", "text", "weather"} <= set(mods)
    prices = {a.name: a.price_cents for a in mods["text"].actions}
    assert prices == {"word_count": 1, "uppercase": 1, "slugify": 2}
    assert gw.modules.get("text").name == mods["text"].name

    res = gw.call("text", action="slugify", text="Hello Client World")
    assert res.ok and res.module == "text" and res.cost_cents == 2
    assert res.result["slug"] == "hello-client-world" and res.call_id
    assert res.receipt.kid and res.receipt.mode == "live" and not res.replayed
    assert res.idempotency_key and res.idempotency_key.startswith("gwc_")
    assert res.verify() is True and gw.receipts.verify(res.raw) is True
    assert gw.account().balance_cents == 498
    ledger_clean()


def test_a_module_field_named_slug_reaches_the_module(funded):
    """Every body property is the module's (SPEC part 4, rule 1): a field called ``slug``
    (a URL shortener's, a blog's) is sent like any other, sync and async (before:
    TypeError "got multiple values for argument 'slug'", the module's slug being a keyword
    parameter of ``call``)."""
    import asyncio

    from gateway_client import AsyncGateway

    acct, gw = funded
    res = gw.call("echo", action="echo", slug="my-first-post", text="hi")
    assert res.result == {"echo": {"action": "echo", "slug": "my-first-post", "text": "hi"}}

    async def run():
        async with AsyncGateway(acct.key, gw.base_url) as agw:
            return await agw.call("echo", action="echo", slug="async-post")

    assert asyncio.run(run()).result == {"echo": {"action": "echo", "slug": "async-post"}}


def test_receipt_tampering_is_detected(funded):
    _, gw = funded
    res = gw.call("weather", action="current", city="Paris")
    assert res.verify()
    for change in ({"cost_cents": 0}, {"result": {**res.result, "temp_c": 99.9}},
                   {"module": "echo"}, {"ok": not res.ok}):
        with pytest.raises(ReceiptInvalid):
            dataclasses.replace(res, **change).verify()
    forged = dataclasses.replace(res.receipt, sig=res.receipt.sig[::-1])
    with pytest.raises(ReceiptInvalid, match="signature"):
        dataclasses.replace(res, receipt=forged).verify()
    with pytest.raises(ReceiptInvalid):  # the key id is signed too
        gw.receipts.verify({**res.raw, "receipt": {**res.raw["receipt"], "kid": "k_0000000000000000"}})


def test_a_saved_response_must_hold_the_signed_values_not_lookalikes(funded):
    """A saved response is what an auditor reads: ``"ok": "false"`` or ``"cost_cents": 2.9``
    are not the signed ``true`` and ``2`` (before: coerced with bool() and int() first, so
    such a tampered response verified)."""
    _, gw = funded
    res = gw.call("text", action="slugify", text="audit me")
    assert res.ok is True and res.cost_cents == 2 and gw.receipts.verify(res.raw)
    for change in ({"ok": "false"}, {"ok": 1}, {"cost_cents": 2.9}, {"cost_cents": "2"}, {"cost_cents": True}):
        with pytest.raises(ReceiptInvalid):
            gw.receipts.verify({**res.raw, **change})


def test_same_idempotency_key_is_replayed_and_charged_once(funded, ledger_clean):
    _, gw = funded
    first = gw.call("text", action="uppercase", text="once", idempotency_key="order-42")
    again = gw.call("text", action="uppercase", text="once", idempotency_key="order-42")
    assert again.replayed and again.call_id == first.call_id and again.result == {"text": "ONCE"}
    assert gw.account().balance_cents == 499
    with pytest.raises(Conflict) as exc:
        gw.call("text", action="uppercase", text="other", idempotency_key="order-42")
    assert exc.value.code == "idempotency_key_reused" and exc.value.status == 409
    ledger_clean()


def test_error_families(server, make_account, gw_factory):
    broke = make_account(cents=0)
    with pytest.raises(AuthenticationError) as e401:
        gw_factory("svc_live_not_a_real_key").account()
    assert e401.value.status == 401 and e401.value.code == "unauthorized" and e401.value.request_id

    reader = make_account(scopes=["account:read"])
    with pytest.raises(PermissionDenied) as e403:
        gw_factory(reader.key).call("echo", action="echo")
    assert e403.value.code == "insufficient_scope"

    gw = gw_factory(broke.key)
    with pytest.raises(NotFound) as e404:
        gw.call("no-such-module", action="x")
    assert e404.value.code == "module_not_found"
    with pytest.raises(NotFound) as e404:
        gw.call("text", action="no_such_action")
    assert e404.value.code == "unknown_action" and isinstance(e404.value, ApiError)

    with pytest.raises(PaymentRequired) as e402:
        gw.call("text", action="slugify", text="x")
    err = e402.value
    assert err.code == "payment_required" and err.price_cents == 2
    assert err.pay_to and err.pay_to.lower() == server.env["X402_PAY_TO"].lower()
    assert err.nonce and err.accepts and err.accepts[0]["scheme"] == "exact"
    assert gw.account().balance_cents == 0


def test_rate_limited_and_retry_after_honoured(make_account, gw_factory):
    acct = make_account(cents=100)  # starter plan: 10 requests/second per key
    impatient = gw_factory(acct.key, max_retries=0)
    with pytest.raises(RateLimited) as exc:
        for _ in range(30):
            impatient.usage.current()
    assert exc.value.status == 429 and exc.value.retry_after is not None and exc.value.retry_after >= 0
    patient = gw_factory(acct.key, max_retries=4)
    assert len([patient.usage.current() for _ in range(25)]) == 25  # waits out each 429


def test_a_module_call_waits_as_long_as_an_action_may_run(funded, gw_factory):
    """A catalog action may run up to 120 s before the gateway answers (504 after its
    ``timeout_seconds``); a module call waits that long, other requests 30 s (before: 30 s
    for a call too, so a slow action's answer was lost, the retries met 409
    ``idempotency_key_in_use`` and the caller got an error for a call that was charged).
    A ``timeout`` given by the caller applies to every request, sync and async."""
    import asyncio

    from gateway_client import AsyncGateway

    acct, gw = funded
    seen = []
    gw._http.event_hooks["request"].append(lambda req: seen.append((req.url.path, req.extensions["timeout"])))
    gw.call("text", action="uppercase", text="slow or not")
    gw.account()
    call_timeout, account_timeout = seen[0][1], seen[-1][1]
    assert seen[0][0] == "/v1/module/text/call" and call_timeout["read"] >= 125
    assert call_timeout["connect"] == account_timeout["connect"] == account_timeout["read"] == 30.0

    mine = gw_factory(acct.key, timeout=7.0)
    mine._http.event_hooks["request"].append(lambda req: seen.append((req.url.path, req.extensions["timeout"])))
    mine.call("text", action="uppercase", text="my timeout")
    assert seen[-1][1]["read"] == 7.0

    async def run():
        async with AsyncGateway(acct.key, gw.base_url) as agw:
            agw._http.event_hooks["request"].append(
                lambda req: asyncio.sleep(0, seen.append((req.url.path, req.extensions["timeout"]))))
            await agw.call("text", action="uppercase", text="async")
    asyncio.run(run())
    assert [t["read"] for p, t in seen[-2:] if p.endswith("/call")] == [call_timeout["read"]]


def test_user_agent_names_the_client_version(funded, server):
    _, gw = funded
    seen = []
    gw._http.event_hooks["request"].append(lambda req: seen.append(req.headers["User-Agent"]))
    gw.account()
    assert seen == [f"gateway-client-python/{__version__} " + seen[0].split(" ", 1)[1]]
    assert seen[0].startswith(f"gateway-client-python/{__version__} httpx/")


def test_the_projects_per_test_cleanup_leaves_the_server_its_catalog(funded):
    """`make test` runs this directory's tests in any order beside the project's, on the
    same worker; each of those empties the project's test database (DATABASE_URL) after
    itself. The server's catalog, loaded once for the session, must survive that."""
    import os

    import psycopg
    from sqlalchemy.engine import make_url

    _, gw = funded
    assert gw.call("text", action="uppercase", text="before").result == {"text": "BEFORE"}
    project_db = make_url(os.environ["DATABASE_URL"]).set(drivername="postgresql")
    with psycopg.connect(project_db.render_as_string(hide_password=False), autocommit=True) as conn:
        tables = [t for (t,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename <> 'alembic_version'")]
        with conn.transaction():  # as tests/conftest.py's _empty_tables: no trigger, no FK check
            conn.execute("SET LOCAL session_replication_role = replica")
            for table in tables:
                conn.execute(f'DELETE FROM "{table}"')
    assert {"echo", "text", "weather"} <= {m.slug for m in gw.modules.list()}
    assert gw.call("text", action="uppercase", text="after").result == {"text": "AFTER"}
