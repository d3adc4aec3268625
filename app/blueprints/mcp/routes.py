"""``POST /mcp``: the MCP server (Streamable HTTP, stateless, JSON responses) — the module
catalog as tools, each call a metered module call (docs/mcp.md, ``server.py``)."""
from __future__ import annotations

from flask import Response, current_app, g, request
from flask.views import MethodView

from app.auth import authenticated, principal
from app.errors import McpErrorSchema
from app.jsonutil import INTEGER_RANGE_DOC
from app.blueprints.mcp.server import Bridge
from app.blueprints.mcp.schemas import McpHeadersSchema, McpMessageSchema, ServerCardSchema, X402DiscoverySchema
from app.blueprints.routing import document_errors, endpoint
from app.extensions import Blueprint
from app.services.gateway import discovery

blp = Blueprint("mcp", __name__, url_prefix="",
                description="The agents' door: the module catalog as an MCP server (docs/mcp.md).")

# Request headers the SDK is not given: the credential (checked here, passed on as the
# principal), cookies, and Accept (this endpoint answers JSON whatever the client accepts:
# the SDK is told the client takes both of Streamable HTTP's types). Everything else
# reaches it (Content-Type, MCP-Protocol-Version, Mcp-Method, Mcp-Name, Origin, …).
_WITHHELD = ("authorization", "cookie", "accept")
_ACCEPT = (b"accept", b"application/json, text/event-stream")
def _bridge() -> Bridge:
    bridge = current_app.extensions.get("mcp_bridge")
    if bridge is None:
        bridge = current_app.extensions.setdefault("mcp_bridge", Bridge(current_app._get_current_object()))
    return bridge


@blp.route("/mcp")
class McpView(MethodView):
    @authenticated(rate_limit=False)
    @blp.arguments(McpHeadersSchema, location="headers", as_kwargs=True)
    @blp.arguments(McpMessageSchema)
    @blp.doc(responses={200: {"description": "The JSON-RPC response: a result or a JSON-RPC error. A tool "
                                             "that failed is a result with `isError: true` whose "
                                             "`structuredContent` is the API error body "
                                             "(`{error, message, request_id}`), or, when the provider "
                                             "refused the arguments (4xx, charged), the call response "
                                             "with `ok: false`. Paying (the HTTP route's 402 and 503 "
                                             "arrive here as such tool errors): `payment_required` / "
                                             "`payment_invalid` carry x402's v2 payment request for the "
                                             "tool (`x402Version`, `accepts`, `resource`), a refused "
                                             "settlement also `x402/payment-response`; "
                                             "`facilitator_unavailable` / `settlement_unavailable` (the "
                                             "facilitator gave no verdict, nothing charged) carry "
                                             "`retry_after` (the seconds of the route's `Retry-After`) "
                                             "and no payment request: after `settlement_unavailable` "
                                             "do not pay again. A paid call's result has the settlement "
                                             "in `_meta` `x402/payment-response`.",
                              "content": {"application/json": {"schema": {
                                  "type": "object", "description": "A JSON-RPC 2.0 response.",
                                  "required": ["jsonrpc"], "additionalProperties": True,
                                  "properties": {"jsonrpc": {"type": "string", "enum": ["2.0"]}}}}}},
                        202: {"description": "A notification or response was accepted (no body)."}})
    @blp.alt_response(400, schema=McpErrorSchema, description=(
        "`invalid_request` (in `error.data`): a body that is not a JSON object with "
        "`jsonrpc: \"2.0\"`, a request whose `id` is not a string or an integer, or a header outside "
        "its rules. A JSON-RPC message that MCP does not accept: the MCP SDK's own JSON-RPC error. "
        "Every error of this endpoint is a JSON-RPC error response (`McpError`) whose `data` is "
        "the API's error body when the gateway refused the request."))
    @document_errors(blp, {413: "`payload_too_large`", 422: INTEGER_RANGE_DOC})
    def post(self, message, accept=None, mcp_protocol_version=None, idempotency_key=None):
        """The MCP endpoint (Streamable HTTP transport, stateless, JSON responses).

        Every request needs a bearer credential (`svc_live_`, `svc_test_`, `svc_sess_`);
        without a valid one the answer is 401 with `WWW-Authenticate: Bearer`. `tools/list`
        lists one tool per live action of every approved module, named `<slug>__<action>`,
        with its price in `_meta`. `tools/call` is the metered call of
        `POST /v1/module/{slug}/call` (scope `call:write`, the plan rate limit, the same
        charge, idempotency and signed receipt): the result's `structuredContent` is the
        gateway's call response. A call the balance cannot cover is answered with x402's payment
        request for the tool (the protocol of `x402.mcp`); calling again with the payment payload
        in `_meta` `x402/payment` pays it, and the result's `_meta` `x402/payment-response` holds
        the settlement. No `Mcp-Session-Id` is issued; GET (a server stream) and
        DELETE (ending a session) are answered 405. See docs/mcp.md."""
        p = principal()
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                   for k, v in request.headers.items() if k.lower() not in _WITHHELD] + [_ACCEPT]
        environ = request.environ
        server = (environ.get("SERVER_NAME", ""), int(environ.get("SERVER_PORT") or 0))
        client = (request.remote_addr or "", 0)
        status, out_headers, body = _bridge().handle(
            method="POST", path="/mcp", query=request.query_string, headers=headers,
            body=request.get_data(cache=False), client=client, scheme=request.scheme, server=server,
            state={"principal": p, "request_id": g.get("request_id"),
                   "idempotency_key": idempotency_key})
        resp = Response(body, status)
        for k, v in out_headers:
            name = k.decode("latin-1")
            if name.lower() not in ("content-length", "date", "server"):
                resp.headers[name] = v.decode("latin-1")
        return resp


discovery_blp = Blueprint("discovery", __name__, url_prefix="/.well-known",
                          description="Discovery for agents: paid resources (x402) and the MCP server card.")


@endpoint(discovery_blp, "/x402", "get", public=True, ok=X402DiscoverySchema, name="X402DiscoveryView")
def x402_discovery():
    """Every paid module action with its price (public).

    The x402 Bazaar discovery list: one item per action whose price is above zero, with the
    call URL, the `exact` payment requirements of its price (empty when x402 is not
    offered), the Bazaar extension's input/output metadata and the action's MCP tool name."""
    return discovery.x402_resources()


@endpoint(discovery_blp, "/mcp/server-card.json", "get", public=True, ok=ServerCardSchema,
          name="McpServerCardView")
def mcp_server_card():
    """The MCP server card (public): where the MCP endpoint is, its transport and protocol
    versions, and the bearer header it needs."""
    return discovery.server_card()
