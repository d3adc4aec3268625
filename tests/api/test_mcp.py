"""The MCP door (``POST /mcp``, docs/mcp.md) with the official ``mcp`` SDK client over real
HTTP: the test app served by a threaded werkzeug server on loopback, the client's own
Streamable HTTP transport (both protocol eras: the ``server/discover`` probe of 2026-07-28
and the ``initialize`` handshake), a bearer header as an agent framework configures it."""
from __future__ import annotations

import json

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from sqlalchemy import func, select

from app.extensions import db
from app.models import ModuleCall
from tests.gateway_helpers import (PROVIDER, balance_cents, create_module, mod, provider,  # noqa: F401
                                   provider_server)
from tests.chatfakes import live_server
from tests.support.finalize import drain
from tests.support.procs import http


@pytest.fixture(scope="module")
def server_url(app):
    with live_server(app, "mcp-test-server") as base:
        yield base


def run(coro_fn, *args):
    return anyio.run(coro_fn, *args)


def client_for(url: str, bearer: str | None, mode: str = "auto", extra_headers: dict | None = None) -> Client:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    headers.update(extra_headers or {})
    http_client = httpx2.AsyncClient(headers=headers, timeout=30)
    return Client(streamable_http_client(url + "/mcp", http_client=http_client), mode=mode, cache=None)


async def _list(url, bearer, mode="auto"):
    async with client_for(url, bearer, mode) as c:
        return (await c.list_tools()).tools


async def _handshake(url, bearer, mode):
    async with client_for(url, bearer, mode) as c:
        return c.protocol_version, c.server_info.name


async def _call(url, bearer, name, arguments, meta=None, mode="auto", extra_headers=None):
    """The tool result, or the ``MCPError`` a protocol error raised (returned, not raised:
    out of the client's task groups it would come wrapped in exception groups)."""
    async with client_for(url, bearer, mode, extra_headers) as c:
        try:
            return await c.call_tool(name, arguments, meta=meta)
        except MCPError as exc:
            return exc


def module_calls(app, account_id) -> list[tuple[str, int]]:
    drain(app)  # the calls answered so far are finalized (deferred finalize)
    with app.app_context():
        rows = db.session.execute(select(ModuleCall.status, ModuleCall.price_micros)
                                  .where(ModuleCall.account_id == account_id)).all()
        db.session.remove()
    return [tuple(r) for r in rows]


MODES = ["auto", "legacy"]  # 2026-07-28 (server/discover) and the initialize handshake


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_names_every_live_action_with_price_and_schemas(app, server_url, make_account, mod, mode):
    acct = make_account()
    create_module(app, "other", "http://127.0.0.1:9", {"go": (7, "/go")})
    tools = {t.name: t for t in run(_list, server_url, acct.key, mode)}
    assert "svc__ok" in tools and "svc__free" in tools and "other__go" in tools
    t = tools["other__go"]
    assert t.input_schema["type"] == "object"
    assert t.output_schema["required"] == ["ok", "module", "call_id", "cost_cents", "result", "receipt"]
    assert t.meta["gateway/price"]["price_cents"] == 7 and t.meta["gateway/price"]["currency"] == "USD"
    assert t.meta["gateway/module"] == "other" and t.meta["gateway/action"] == "go"
    assert t.meta["gateway/receipt"]["keys"] == "/api/receipts/keys"
    assert "7 cent" in t.description
    version, name = run(_handshake, server_url, acct.key, mode)
    assert name == "metered-api-gateway"
    assert version == ("2026-07-28" if mode == "auto" else "2025-11-25")


def test_tools_list_follows_the_keys_module_allow_list(app, client, server_url, make_account, mod):
    """A key with `allowed_modules` lists the tools of those modules only (before: every
    tool, each of the others then 403 `module_not_allowed` when called)."""
    acct = make_account()
    create_module(app, "other", "http://127.0.0.1:9", {"go": (7, "/go")})
    r = client.post("/api/keys", json={"name": "svc only", "allowed_modules": ["svc"]}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    names = {t.name for t in run(_list, server_url, r.get_json()["key"])}
    assert "svc__ok" in names and not any(n.startswith("other__") for n in names), names
    assert "other__go" in {t.name for t in run(_list, server_url, acct.key)}


@pytest.mark.parametrize("mode", MODES)
def test_call_is_the_metered_call_with_a_receipt_that_verifies(app, client, server_url, make_account, mod,
                                                               ledger_clean, mode):
    from app.services.gateway import receipts

    acct = make_account(cents=100)
    res = run(_call, server_url, acct.key, "svc__ok", {"text": "hi", "n": [1, 2]}, None, mode)
    assert res.is_error is False
    sc = res.structured_content
    assert set(sc) == {"ok", "module", "call_id", "cost_cents", "result", "receipt"}
    assert sc["ok"] is True and sc["module"] == "svc" and sc["cost_cents"] == 3
    assert sc["result"]["echo"] == {"text": "hi", "n": [1, 2], "action": "ok"}
    assert json.loads(res.content[0].text) == sc["result"]  # the module's result as text JSON
    keys = client.get("/api/receipts/keys").get_json()["keys"]
    facts = receipts.verify_response(sc, {k["kid"]: k["public_key"] for k in keys})
    assert facts["call_id"] == sc["call_id"] and facts["cost_cents"] == 3
    assert balance_cents(app, acct.id) == 97
    assert module_calls(app, acct.id) == [("succeeded", 30_000)]
    ledger_clean()


def test_provider_4xx_is_a_charged_tool_error(app, server_url, make_account, mod):
    """The provider refused the arguments: an error that originates from the tool, which MCP
    says is a result with ``isError: true`` so the model sees it failed and corrects its
    input (it was ``isError: false``: a host read the refusal as a success). Still charged:
    ``structuredContent`` is the whole call response, ``ok: false``, cost and receipt."""
    acct = make_account(cents=10)
    res = run(_call, server_url, acct.key, "svc__bad", {})
    assert res.is_error is True and res.structured_content["ok"] is False
    assert res.structured_content["cost_cents"] == 2 and res.structured_content["receipt"]["sig"]
    assert json.loads(res.content[0].text) == {"error": "bad_input", "field": "text"}
    assert res.structured_content["result"] == {"error": "bad_input", "field": "text"}
    assert balance_cents(app, acct.id) == 8


def test_unknown_tool_is_a_protocol_error_and_changes_nothing(app, server_url, make_account, mod):
    acct = make_account(cents=10)
    for name in ("svc__nope", "nosuch__ok", "no-separator", "Bad__ok"):
        err = run(_call, server_url, acct.key, name, {})
        assert isinstance(err, MCPError), err
        assert err.code == -32602 and "Unknown tool" in err.message and err.data == {"error": "unknown_tool"}
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 10


def test_bad_arguments_are_tool_errors_with_the_api_code(app, server_url, make_account, mod):
    acct = make_account(cents=10)
    res = run(_call, server_url, acct.key, "svc__ok", {"action": "bad"})  # another action than the tool's
    assert res.is_error is True
    assert res.structured_content["error"] == "invalid_request"
    assert json.loads(res.content[0].text)["error"] == "invalid_request"
    deep: dict = {}
    node = deep
    for _ in range(40):
        node["a"] = {}
        node = node["a"]
    # JSON nested deeper than the input policy allows is refused before the SDK reads it
    # (HTTP 400 invalid_request, as on every route): a protocol error, not a tool result
    res = run(_call, server_url, acct.key, "svc__ok", deep)
    assert isinstance(res, MCPError), res
    # so is an integer beyond 64 bits, which would reach the provider rounded
    res = run(_call, server_url, acct.key, "svc__ok", {"n": 10 ** 30})
    assert isinstance(res, MCPError), res
    res = run(_call, server_url, acct.key, "svc__ok", {}, {"gateway/idempotency-key": "x" * 129})
    assert res.is_error is True and res.structured_content["error"] == "invalid_request"
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 10


def test_arguments_that_are_not_an_object_are_invalid_params(server_url, make_account, mod):
    acct = make_account(cents=10)
    status, body = http(server_url + "/mcp", method="POST", headers={
        "Authorization": f"Bearer {acct.key}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"},
        body=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "svc__ok", "arguments": [1, 2]}}).encode())
    doc = json.loads(body)
    assert status == 200 and doc["error"]["code"] == -32602, doc


def test_empty_balance_is_payment_required_and_charges_nothing(app, server_url, make_account, mod):
    acct = make_account(cents=0)
    res = run(_call, server_url, acct.key, "svc__ok", {"text": "hi"})
    assert res.is_error is True
    sc = res.structured_content
    assert sc["error"] == "payment_required" and sc["request_id"].startswith("req_")
    assert sc["price_cents"] == 3  # the 402 body's extra facts travel along
    assert module_calls(app, acct.id) == []


def test_idempotent_replay_charges_once(app, server_url, make_account, mod, ledger_clean):
    acct = make_account(cents=100)
    first = run(_call, server_url, acct.key, "svc__counter", {}, {"gateway/idempotency-key": "k-1"})
    again = run(_call, server_url, acct.key, "svc__counter", {}, {"gateway/idempotency-key": "k-1"})
    assert first.is_error is False and again.structured_content == first.structured_content
    # the HTTP header works too, and names the same record
    header = run(_call, server_url, acct.key, "svc__counter", {}, None, "auto", {"Idempotency-Key": "k-1"})
    assert header.structured_content == first.structured_content
    assert balance_cents(app, acct.id) == 99
    assert module_calls(app, acct.id) == [("succeeded", 10_000)]
    # the same key with another request is the API's conflict, as a tool error
    other = run(_call, server_url, acct.key, "svc__counter", {"x": 1}, {"gateway/idempotency-key": "k-1"})
    assert other.is_error is True and other.structured_content["error"] == "idempotency_key_reused"
    ledger_clean()


def test_scope_is_checked_on_call(app, server_url, make_account, mod):
    acct = make_account(cents=10, scopes=("usage:read",))
    assert any(t.name == "svc__ok" for t in run(_list, server_url, acct.key))  # listing needs no scope
    res = run(_call, server_url, acct.key, "svc__ok", {})
    assert res.is_error is True and res.structured_content["error"] == "insufficient_scope"
    assert module_calls(app, acct.id) == []


def test_no_or_revoked_credential_is_401_with_www_authenticate(app, client, server_url, make_account, mod):
    """The 401 keeps its status and ``WWW-Authenticate`` and its body is a JSON-RPC error
    whose ``data`` is the API's error body. Before, the body was ``{"error": "unauthorized"}``
    alone, which the SDK client cannot read: an agent with a wrong or revoked key got
    ``MCPError(-32603, "Server returned an error response")``, the same as a crash."""
    acct = make_account(cents=10)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    r = client.post("/mcp", data=body, headers=hdrs)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    doc = r.get_json()
    assert doc["jsonrpc"] == "2.0" and doc["id"] == 1 and doc["error"]["code"] == -32600
    assert doc["error"]["data"]["error"] == "unauthorized"
    assert doc["error"]["data"]["request_id"] == r.headers["X-Request-Id"]
    assert doc["error"]["message"] == doc["error"]["data"]["message"]
    # revoke the key through the API, then the SDK client is refused at the HTTP level
    key_id = client.get("/api/keys", headers=acct.headers).get_json()["keys"][0]["id"]
    assert client.delete(f"/api/keys/{key_id}", headers=acct.headers).status_code in (200, 204)
    status, raw = http(server_url + "/mcp", method="POST", body=body,
                       headers={**hdrs, "Authorization": f"Bearer {acct.key}"})
    assert status == 401 and json.loads(raw)["error"]["data"]["error"] == "unauthorized"
    for mode in MODES:  # the SDK client raises the error the server sent, in both eras
        for bearer in (acct.key, None, "svc_live_not_a_key"):
            err = run(_list_error, server_url, bearer, mode)
            assert isinstance(err, MCPError) and err.error.data["error"] == "unauthorized", (mode, err)
            assert "credential" in err.error.message
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 10


async def _list_error(url, bearer, mode):
    """The ``MCPError`` of listing tools (the client is made inside, so an error while
    connecting is caught too), or None."""
    try:
        async with client_for(url, bearer, mode) as c:
            await c.list_tools()
    except BaseException as exc:  # noqa: BLE001 - unwrapped from the client's task groups
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        return exc
    return None


def test_an_oversized_number_reaches_the_sdk_as_a_json_rpc_error(app, server_url, make_account, mod):
    """A body the gateway refuses before MCP (here an integer beyond 64 bits, 422) is a
    JSON-RPC error the SDK raises with the API's code in ``data``, not the SDK's opaque
    "Server returned an error response"."""
    acct = make_account(cents=10)

    async def call():
        async with client_for(server_url, acct.key) as c:
            try:
                await c.call_tool("svc__ok", {"n": 10 ** 30})
            except MCPError as exc:
                return exc

    err = run(call)
    assert isinstance(err, MCPError) and err.error.data["error"] == "unprocessable", err
    assert module_calls(app, acct.id) == [] and balance_cents(app, acct.id) == 10


def test_a_body_over_the_limit_is_a_json_rpc_413(client, make_account):
    """413 before MCP: the body is not read again to find the id (null), and the error is
    still one an MCP client reads."""
    acct = make_account()
    big = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                      "params": {"name": "svc__ok", "arguments": {"x": "a" * (1024 * 1024)}}})
    r = client.post("/mcp", data=big, headers={**acct.headers, "Content-Type": "application/json"})
    assert r.status_code == 413
    doc = r.get_json()
    assert doc["jsonrpc"] == "2.0" and doc["id"] is None and doc["error"]["data"]["error"] == "payload_too_large"


@pytest.mark.parametrize("bad_id", [None, 1.5, True, [1], {"a": 1}])
def test_request_id_that_is_not_a_string_or_integer_is_400(client, make_account, bad_id):
    """MCP request ids are strings or integers. Before, the SDK read such a request as a
    notification and answered 202 with no body: the client waited for an answer forever."""
    acct = make_account()
    r = client.post("/mcp", json={"jsonrpc": "2.0", "id": bad_id, "method": "ping"},
                    headers={**acct.headers, "Accept": "application/json, text/event-stream"})
    assert r.status_code == 400, r.data
    doc = r.get_json()  # a JSON-RPC error whose data is the API's error body
    assert doc["jsonrpc"] == "2.0" and doc["id"] is None and doc["error"]["code"] == -32600
    assert doc["error"]["data"]["error"] == "invalid_request" and "id" in doc["error"]["message"]
    for good in ("a", 7):
        r = client.post("/mcp", json={"jsonrpc": "2.0", "id": good, "method": "ping"}, headers=acct.headers)
        assert r.status_code == 200 and r.get_json() == {"jsonrpc": "2.0", "id": good, "result": {}}


def test_get_and_delete_are_405_no_sessions(server_url, make_account):
    acct = make_account()
    for method in ("GET", "DELETE"):
        status, _ = http(server_url + "/mcp", method=method, headers={"Authorization": f"Bearer {acct.key}"})
        assert status == 405


def test_test_key_calls_the_sandbox_free(app, server_url, make_account, mod):
    acct = make_account(cents=0, test_key=True)
    res = run(_call, server_url, acct.test_key, "svc__ok", {"a": 1})
    assert res.is_error is False and res.structured_content["receipt"]["mode"] == "test"
    assert balance_cents(app, acct.id) == 0


def test_test_key_lists_only_tools_it_can_call(app, server_url, make_account, mod, provider):
    """A module without a sandbox (every agent-built one) answers a test key
    ``invalid_request`` ("has no sandbox"), so its tools are not in a test key's
    ``tools/list`` — as a key's module allow-list hides the tools it would refuse. Before,
    they were listed and every call to them failed. Live keys still see them."""
    create_module(app, "live-only", provider, {"ok": (1, "/ok")})
    acct = make_account(cents=0, test_key=True)
    test_names = {t.name for t in run(_list, server_url, acct.test_key)}
    assert "svc__ok" in test_names and "live-only__ok" not in test_names
    assert "live-only__ok" in {t.name for t in run(_list, server_url, acct.key)}


# --- discovery -------------------------------------------------------------------------

def test_module_listing_links_each_module_to_its_mcp_tools(client, mod):
    create_module_doc = client.get("/api/modules/svc").get_json()
    assert "svc__ok" in create_module_doc["mcp_tools"] and "svc__free" in create_module_doc["mcp_tools"]
    listed = {m["slug"]: m for m in client.get("/api/modules").get_json()["modules"]}
    assert listed["svc"]["mcp_tools"] == sorted(f"svc__{a['name']}" for a in listed["svc"]["actions"])


def test_x402_discovery_lists_every_paid_action_with_its_price(app, client, mod):
    doc = client.get("/.well-known/x402").get_json()
    assert doc["x402Version"] == 2 and doc["mcp"]["url"].endswith("/mcp")
    items = {i["mcpTool"]: i for i in doc["items"]}
    assert "svc__free" not in items  # price 0: not a paid resource
    ok = items["svc__ok"]
    assert ok["priceCents"] == 3 and ok["action"] == "ok" and ok["resource"].endswith("/v1/module/svc/call")
    assert ok["extensions"]["bazaar"]["info"]["input"] == {"type": "http", "method": "POST", "bodyType": "json",
                                                           "body": {"action": "ok"}}
    # the payment requirements are the 402's: exact, USDC atomic units of the price
    assert ok["accepts"] and all(a["scheme"] == "exact" and a["amount"] == "30000" for a in ok["accepts"])
    # the Bazaar extension validates with the x402 package's own checker
    from x402.extensions.bazaar import validate_discovery_extension
    from x402.extensions.bazaar.types import parse_discovery_extension

    assert validate_discovery_extension(parse_discovery_extension(ok["extensions"]["bazaar"])).valid
    assert doc["pagination"]["total"] == len(doc["items"])


def test_mcp_server_card_names_the_endpoint(client):
    card = client.get("/.well-known/mcp/server-card.json").get_json()
    assert card["$schema"].endswith("server-card.schema.json")
    remote = card["remotes"][0]
    assert remote["type"] == "streamable-http" and remote["url"].endswith("/mcp")
    assert remote["headers"][0]["name"] == "Authorization" and remote["headers"][0]["isSecret"] is True
    assert "2025-11-25" in remote["supportedProtocolVersions"]
    assert card["_meta"]["gateway/x402-discovery"].endswith("/.well-known/x402")


def test_key_controls_apply_to_tool_calls(app, client, server_url, make_account, mod):
    """The key's allowed modules and requests per minute hold on the agents' door too."""
    acct = make_account(cents=10)
    r = client.post("/api/keys", json={"name": "only-text", "allowed_modules": ["text"]}, headers=acct.headers)
    res = run(_call, server_url, r.get_json()["key"], "svc__ok", {})
    assert res.is_error is True and res.structured_content["error"] == "module_not_allowed"
    r = client.post("/api/keys", json={"name": "slow", "rpm_limit": 1}, headers=acct.headers)
    assert run(_call, server_url, r.get_json()["key"], "svc__ok", {}).is_error is False
    res = run(_call, server_url, r.get_json()["key"], "svc__ok", {})
    assert res.is_error is True and res.structured_content["error"] == "rate_limited"
    # the HTTP route's Retry-After, which a tool result cannot carry, as a number in the body
    assert isinstance(res.structured_content["retry_after"], int) and 1 <= res.structured_content["retry_after"] <= 60
    drain(app)
    assert module_calls(app, acct.id) == [("succeeded", 30_000)] and balance_cents(app, acct.id) == 7  # one 3-cent call
