"""Paying over MCP (docs/mcp.md "Paying"): the protocol of x402's own MCP transport
(``x402.mcp``) against a real server — a caller whose balance cannot pay gets the x402
payment request as a tool result (``isError: true``, ``structuredContent`` = the v2
``PaymentRequired``), the paid retry carries the ``PaymentPayload`` in ``_meta
["x402/payment"]`` and the result carries the settlement in ``_meta["x402/payment-response"]``.

The client side is x402's ``x402.mcp.x402MCPSession`` (its detection of the payment
request, its payment creation with the official ``x402Client`` and an eth-account wallet,
its retry, its reading of the settlement) over the ``mcp`` SDK 2.3 ``Client``. x402 2.25's
MCP client is written against mcp 1.x, so it needs a shim (``Mcp1Session``): it reads
``result.isError`` / ``result.structuredContent`` (mcp 2.x's ``CallToolResult`` has
``is_error`` / ``structured_content`` only) and passes ``read_timeout_seconds`` as a
``timedelta`` (mcp 2.x takes seconds as a float). The shim translates those two and
nothing else."""
from __future__ import annotations

import base64
from datetime import timedelta
from types import SimpleNamespace

import pytest
from eth_account import Account as EthAccount
from sqlalchemy import select
from x402 import x402Client
from x402.mcp import MCP_PAYMENT_META_KEY, MCP_PAYMENT_RESPONSE_META_KEY
from x402.mcp.client import x402MCPSession
from x402.mcp.utils import attach_payment_to_meta, convert_mcp_result, extract_payment_required_from_result
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from app.extensions import db
from app.models import LedgerTransaction, Payment, X402Authorization
from app.services.money import ledger
from tests.api.test_mcp import _call, client_for, module_calls, run, server_url  # noqa: F401
from tests.gateway_helpers import balance_cents, mod, provider, provider_server  # noqa: F401
from tests.standins import facilitator_server


class Mcp1Session:
    """The mcp 1.x ``ClientSession`` surface x402.mcp 2.25 uses, over an mcp 2.3 ``Client``."""

    def __init__(self, client):
        self._client = client

    async def initialize(self):  # the mcp 2.3 Client is initialized on entering it
        return None

    async def list_tools(self):
        return await self._client.list_tools()

    async def call_tool(self, name, arguments=None, read_timeout_seconds=None, meta=None):
        if isinstance(read_timeout_seconds, timedelta):
            read_timeout_seconds = read_timeout_seconds.total_seconds()
        r = await self._client.call_tool(name, arguments, read_timeout_seconds=read_timeout_seconds, meta=meta)
        return SimpleNamespace(isError=r.is_error, structuredContent=r.structured_content, content=r.content,
                               meta=r.meta, raw=r)


def payer(wallet) -> x402Client:
    return register_exact_evm_client(x402Client(), EthAccountSigner(wallet))


async def _paid_call(url, bearer, wallet, name, arguments):
    async with client_for(url, bearer) as c:
        return await x402MCPSession(Mcp1Session(c), payer(wallet)).call_tool(name, arguments)


def _x402_rows(app, account_id):
    """(x402 credits, module_call charges, payments) of the account, from the ledger."""
    with app.app_context():
        kinds = db.session.execute(select(LedgerTransaction.kind).where(
            LedgerTransaction.account_id == account_id)).scalars().all()
        pays = db.session.execute(select(Payment.method, Payment.amount_micros, Payment.status)
                                  .where(Payment.account_id == account_id)).all()
        auths = db.session.execute(select(X402Authorization.status).where(
            X402Authorization.account_id == account_id)).scalars().all()
        revenue = ledger.balance(ledger.REVENUE)
        db.session.remove()
    return sorted(kinds), [tuple(p) for p in pays], auths, revenue


def test_x402_mcp_client_is_incompatible_with_mcp_2_without_the_shim(server_url, make_account, mod):
    """Why the shim exists: x402 2.25's MCP client on an mcp 2.3 ``Client`` fails before
    paying (``CallToolResult`` has no ``isError``). If this starts passing, drop the shim."""
    acct = make_account(cents=0)

    async def bare():
        async with client_for(server_url, acct.key) as c:
            return await x402MCPSession(c, payer(EthAccount.create())).call_tool(
                "svc__ok", {"text": "hi"}, read_timeout_seconds=30.0)

    with pytest.raises(BaseException) as info:
        run(bare)
    assert "isError" in repr(info.value) or "isError" in str(info.value.__cause__)


def test_payment_request_is_x402_mcp_shaped(app, server_url, make_account, mod):
    acct = make_account(cents=0)
    res = run(_call, server_url, acct.key, "svc__ok", {"text": "hi"})
    assert res.is_error is True
    sc = res.structured_content
    # the API's error body ...
    assert sc["error"] == "payment_required" and sc["price_cents"] == 3 and sc["request_id"].startswith("req_")
    # the message tells an MCP client (or the model reading it) how to pay here: no HTTP header
    assert "X-Payment" not in sc["message"] and '_meta["x402/payment"]' in sc["message"]
    assert "/api/wallet/fund" in sc["message"]
    # ... is x402's v2 PaymentRequired for the tool, as x402.mcp's server wrapper writes it
    assert sc["x402Version"] == 2 and sc["resource"]["url"] == "mcp://tool/svc__ok"
    req = sc["accepts"][0]
    assert (req["scheme"], req["network"], req["amount"]) == ("exact", "eip155:8453", "30000")
    pr = extract_payment_required_from_result(convert_mcp_result(SimpleNamespace(
        content=[c.model_dump() for c in res.content], isError=True, structuredContent=sc)))
    assert pr is not None and pr.x402_version == 2 and pr.accepts[0].amount == "30000"
    # the Bazaar metadata of the tool (type mcp) validates with the package's checkers
    from x402.extensions.bazaar import validate_discovery_extension, validate_discovery_extension_spec

    ext = sc["extensions"]["bazaar"]
    assert ext["info"]["input"]["type"] == "mcp" and ext["info"]["input"]["toolName"] == "svc__ok"
    assert ext["info"]["input"]["transport"] == "streamable-http"
    assert validate_discovery_extension(ext).valid and validate_discovery_extension_spec(ext).valid
    assert module_calls(app, acct.id) == []


def test_x402_mcp_client_pays_and_gets_result_and_receipt(app, client, server_url, make_account, mod,
                                                        ledger_clean):
    from app.services.gateway import receipts

    acct = make_account(cents=0)
    wallet = EthAccount.create()
    seen = {}
    session_cls_call = Mcp1Session.call_tool

    async def spy(self, name, arguments=None, read_timeout_seconds=None, meta=None):
        if meta:
            seen["meta"] = meta
        return await session_cls_call(self, name, arguments, read_timeout_seconds, meta)

    Mcp1Session.call_tool = spy
    try:
        res = run(_paid_call, server_url, acct.key, wallet, "svc__ok", {"text": "hi"})
    finally:
        Mcp1Session.call_tool = session_cls_call
    assert res.payment_made is True and res.is_error is False, res.content
    sc = res.raw_result.raw.structured_content
    assert sc["ok"] is True and sc["cost_cents"] == 3 and sc["result"]["echo"]["text"] == "hi"
    keys = client.get("/api/receipts/keys").get_json()["keys"]
    facts = receipts.verify_response(sc, {k["kid"]: k["public_key"] for k in keys})
    assert facts["cost_cents"] == 3
    # the settlement, in the result's _meta as x402.mcp reads it (a SettleResponse)
    settle = res.payment_response
    assert settle.success is True and settle.payer == wallet.address and settle.network == "eip155:8453"
    assert settle.amount == "30000" and len(settle.transaction) == 66
    assert MCP_PAYMENT_RESPONSE_META_KEY in res.raw_result.meta
    # exactly one x402 credit and one charge; the payment is spent, the balance is empty
    kinds, pays, auths, revenue = _x402_rows(app, acct.id)
    assert kinds.count("x402_payment") == 1 and kinds.count("module_call") == 1
    assert pays == [("x402", 30_000, "succeeded")] and auths == ["settled"] and revenue == 30_000
    assert balance_cents(app, acct.id) == 0
    assert module_calls(app, acct.id) == [("succeeded", 30_000)]

    # the same payment replayed (the _meta the client sent): refused, changes nothing
    async def replay():
        async with client_for(server_url, acct.key) as c:
            return await c.call_tool("svc__ok", {"text": "hi"}, meta=seen["meta"])

    again = run(replay)
    assert again.is_error is True
    assert again.structured_content["error"] == "payment_invalid"
    assert again.structured_content["reason"] == "replayed"
    assert again.structured_content["x402Version"] == 2 and again.structured_content["accepts"]
    assert _x402_rows(app, acct.id) == (kinds, pays, auths, revenue)
    assert module_calls(app, acct.id) == [("succeeded", 30_000)]
    ledger_clean()


def test_undervalued_payment_is_refused_and_changes_nothing(app, server_url, make_account, mod, ledger_clean):
    """A correctly signed payment for less than the price (the client signed a 1-cent request
    for a 3-cent tool): refused with the API's code and a fresh payment request."""
    acct = make_account(cents=0)
    wallet = EthAccount.create()

    async def underpay():
        async with client_for(server_url, acct.key) as c:
            first = await c.call_tool("svc__ok", {"text": "hi"})
            pr = extract_payment_required_from_result(convert_mcp_result(SimpleNamespace(
                content=[x.model_dump() for x in first.content], isError=True,
                structuredContent=first.structured_content)))
            pr.accepts[0].amount = "10000"
            payload = await payer(wallet).create_payment_payload(pr)
            params = attach_payment_to_meta({"name": "svc__ok", "arguments": {"text": "hi"}}, payload)
            return await c.call_tool("svc__ok", {"text": "hi"}, meta=params["_meta"])

    res = run(underpay)
    assert res.is_error is True
    sc = res.structured_content
    assert sc["error"] == "payment_invalid" and sc["reason"] == "insufficient_amount"
    assert sc["accepts"][0]["amount"] == "30000"  # what it should have paid
    assert sc["price_cents"] == 3  # as docs/mcp.md says of payment_required and payment_invalid
    assert _x402_rows(app, acct.id)[:3] == ([], [], [])
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 0
    ledger_clean()


def test_refused_settlement_is_a_tool_error_carrying_the_failed_settlement(app, server_url, make_account, mod,
                                                                          monkeypatch, ledger_clean):
    """The facilitator refuses to settle a verified payment: the tool error is x402.mcp's
    settlement failure — the payment request again, with ``x402/payment-response``
    ``{success: false, errorReason, transaction: "", network}`` in ``structuredContent``
    (where x402's own MCP server puts it) and in the result's ``_meta`` — so x402's client
    reports a failed payment instead of none. Nothing is credited or charged."""
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        monkeypatch.setitem(app.config, "X402_FACILITATOR_URL", fac.url)
        fac.settle = {"success": False, "errorReason": "insufficient_funds", "transaction": "",
                      "network": "eip155:8453"}
        res = run(_paid_call, server_url, acct.key, EthAccount.create(), "svc__ok", {})
    assert res.payment_made is True and res.is_error is True
    sc = res.raw_result.raw.structured_content
    assert sc["error"] == "payment_invalid" and sc["reason"] == "insufficient_funds"
    assert sc["x402Version"] == 2 and sc["accepts"][0]["amount"] == "30000"
    failed = sc[MCP_PAYMENT_RESPONSE_META_KEY]
    assert failed["success"] is False and failed["errorReason"] == "insufficient_funds"
    assert failed["transaction"] == "" and failed["network"] == "eip155:8453"
    assert res.payment_response is not None and res.payment_response.success is False
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 0
    assert _x402_rows(app, acct.id)[:3] == ([], [], ["failed"])
    ledger_clean()


def test_payment_meta_that_is_not_a_payment_is_invalid_payment(app, server_url, make_account, mod):
    acct = make_account(cents=0)
    for bad in ({"x402Version": 2}, "{not json", 42, base64.b64encode(b"[]").decode(), "!!not base64"):
        res = run(_call, server_url, acct.key, "svc__ok", {}, {MCP_PAYMENT_META_KEY: bad})
        assert res.is_error is True and res.structured_content["error"] == "invalid_payment", (bad, res)
        # the message names where the payment was sent: an MCP client sends no payment header
        message = res.structured_content["message"]
        assert "header" not in message and '_meta["x402/payment"]' in message, (bad, message)
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 0


def test_payment_is_not_used_when_the_balance_covers_the_call(app, server_url, make_account, mod):
    acct = make_account(cents=10)
    res = run(_paid_call, server_url, acct.key, EthAccount.create(), "svc__ok", {})
    assert res.payment_made is False and res.is_error is False
    assert balance_cents(app, acct.id) == 7 and _x402_rows(app, acct.id)[1] == []


def test_provider_failure_after_payment_says_the_payment_was_settled(app, server_url, make_account, mod,
                                                                     ledger_clean):
    """The provider fails after the payment settled: the tool error (provider_error, the call
    refunded) still carries the settlement in ``_meta["x402/payment-response"]``, so x402's
    client reports the payment it made; the money stays as account credit."""
    acct = make_account(cents=0)
    res = run(_paid_call, server_url, acct.key, EthAccount.create(), "svc__boom", {})
    assert res.payment_made is True and res.is_error is True
    assert res.raw_result.raw.structured_content["error"] == "provider_error"
    assert res.payment_response is not None and res.payment_response.success is True
    assert res.payment_response.amount == "30000"
    assert balance_cents(app, acct.id) == 3
    ledger_clean()


@pytest.mark.parametrize("where", ["verify", "settle"])
def test_facilitator_without_verdict_is_a_retryable_tool_error_without_payment_request(
        app, server_url, make_account, mod, monkeypatch, ledger_clean, where):
    acct = make_account(cents=0)
    with facilitator_server() as fac:
        monkeypatch.setitem(app.config, "X402_FACILITATOR_URL", fac.url)
        setattr(fac, f"{where}_status", 503)
        setattr(fac, where, {"error": "down"})
        res = run(_paid_call, server_url, acct.key, EthAccount.create(), "svc__ok", {})
    assert res.payment_made is True and res.is_error is True and res.payment_response is None
    sc = res.raw_result.raw.structured_content
    # the facilitator's outage, not a refusal: a retry hint and no fresh payment request
    code = "facilitator_unavailable" if where == "verify" else "settlement_unavailable"
    assert sc["error"] == code and sc["reason"] == code and sc["retry_after"] > 0
    assert "accepts" not in sc and "x402Version" not in sc and MCP_PAYMENT_RESPONSE_META_KEY not in sc
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 0
    ledger_clean()


def test_openapi_says_what_a_tool_answers_when_the_facilitator_gives_no_verdict(client):
    """An outage reaches an MCP client inside a 200 (a tool error), not as the HTTP 503 the
    paid routes document: /mcp's document says which codes and where the retry hint is."""
    text = client.get("/openapi.json").get_json()["paths"]["/mcp"]["post"]["responses"]["200"]["description"]
    for word in ("payment_required", "facilitator_unavailable", "settlement_unavailable", "retry_after",
                 "x402/payment-response"):
        assert word in text, word
