"""The MCP server behind ``POST /mcp``: the official ``mcp`` SDK's low-level ``Server``
(``tools/list``, ``tools/call``) served by its ``StreamableHTTPSessionManager`` in
stateless JSON-response mode, bridged into this WSGI app.

How a request flows (docs/mcp.md has the contract):

1. The Flask route (``routes.McpView``) authenticates the bearer credential as every
   route does (``@authenticated``: 401 with ``WWW-Authenticate`` before the SDK sees
   anything) and hands the raw request to ``Bridge.handle``.
2. ``Bridge`` runs the SDK's ASGI entry on this process's event loop: one daemon thread
   per process (started on first use, again after a fork) running ``anyio`` with the
   session manager's task group open and a ``BlockingPortal`` the request threads call
   into. The request thread waits for the whole answer (JSON mode: one body, no SSE),
   then Flask writes it. Stateless: no ``Mcp-Session-Id``, nothing kept between
   requests, so any worker of any node answers any request.
3. The SDK parses and answers the JSON-RPC; ``tools/call`` comes to ``_call_tool``,
   which runs the metered call on an ``anyio`` worker thread inside an app context of
   its own (``_run_call``): scope ``call:write`` (``auth.check_scopes``), the plan rate
   limit (``ratelimits.per_credential``), the body rules of the HTTP route
   (``ModuleCallRequestSchema`` / ``ModuleCallHeadersSchema``), then
   ``gateway.calls.call`` — the one metered call, with its charge, idempotency,
   refunds and signed receipt. No other charging path exists here.

Paying (x402's MCP transport, the ``x402.mcp`` package's protocol; docs/mcp.md "Paying"):
a call the balance cannot cover is a tool result with ``isError: true`` whose
``structuredContent`` (and text) is the API's 402 body merged with x402's v2
``PaymentRequired`` for the tool (``x402Version: 2``, ``accepts``, ``resource``
``mcp://tool/<name>``, ``extensions.bazaar`` of type ``mcp``). The client retries with the
``PaymentPayload`` in the request's ``_meta["x402/payment"]``; ``_run_call`` turns it into
the ``PAYMENT-SIGNATURE`` header form and the call pays exactly as the HTTP route does
(``gateway.calls.call(payment=…)``: verify, reserve once, settle, book the credit, open the
call as any other). The result then carries the ``SettleResponse`` in ``_meta["x402/payment-response"]``.
A refused payment (replayed, under-valued, …) is the API's 402 ``payment_invalid`` with its
``reason`` and a fresh payment request, in the same shape; a settlement the facilitator
refused also carries its ``SettleResponse`` (``success: false``) under
``x402/payment-response``, in ``structuredContent`` and in the result's ``_meta``. A
facilitator that gives no verdict is the route's 503 body (``facilitator_unavailable`` /
``settlement_unavailable``) with ``retry_after`` and no payment request.

A provider's 4xx answer (``ok: false``: charged, with its receipt) is a result with
``isError: true``: the tool refused the arguments, which MCP reports in the result so the
model can correct them; its text is the provider's answer.

Errors: a tool name that names no live module action is the JSON-RPC error -32602
(``Unknown tool``), as the MCP specification's tools page shows; everything the call
raises (``DomainError``) becomes a tool result with ``isError: true`` whose text and
``structuredContent`` are the API's error body ``{error, message, request_id, …}``.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

import anyio
import orjson
from anyio.from_thread import BlockingPortal

from app.services.gateway.tools import INSTRUCTIONS, SERVER_NAME

log = logging.getLogger(__name__)

IDEMPOTENCY_META_KEY = "gateway/idempotency-key"
# x402's MCP transport (the ``x402.mcp`` package, ``x402.mcp.constants``): the request's
# ``_meta`` key carrying the payment payload, and the result's carrying the settlement.
PAYMENT_META_KEY = "x402/payment"
PAYMENT_RESPONSE_META_KEY = "x402/payment-response"
# Where an MCP client sends the payment, for the messages that name it: the 402's x402
# alternative and 400 ``invalid_payment`` (the HTTP route's name the payment header).
PAYMENT_META_PLACE = f'_meta["{PAYMENT_META_KEY}"]'
MCP_X402_RETRY = f"call the tool again with the x402 payment payload in {PAYMENT_META_PLACE}"

class ToolCallError(Exception):
    """An API error to return as a tool result with ``isError: true``; ``settled``: the
    ``SettleResponse`` of an x402 payment the call took before it failed (the payment
    stays as account credit), for the result's ``_meta["x402/payment-response"]``."""

    def __init__(self, body: dict, settled: dict | None = None):
        super().__init__(body.get("error"))
        self.body = body
        self.settled = settled


def _error_body(err, request_id: str | None, tool: str | None = None) -> dict:
    from app.services.gateway.calls import X402_RETRY

    message = err.message.replace(X402_RETRY, MCP_X402_RETRY) if err.status == 402 else err.message
    if err.code == "invalid_payment":  # decoded from _meta, not from a header
        message = message.replace("The payment header", f"The payment in {PAYMENT_META_PLACE}")
    body = {"error": err.code, "message": message, "request_id": request_id}
    body.update(err.extra or {})
    retry = (err.headers or {}).get("Retry-After")  # a tool result has no headers: say it here
    if retry is not None and str(retry).isdigit():
        body.setdefault("retry_after", int(retry))
    required = (err.headers or {}).get("PAYMENT-REQUIRED") if err.status == 402 else None
    if required and tool:
        body.update(_mcp_payment_required(required, tool))
        failed = _payment_response(err.headers)  # a settlement the facilitator refused
        if failed is not None and not failed.get("success"):
            body[PAYMENT_RESPONSE_META_KEY] = failed  # where x402.mcp's server puts it
    return body


def _mcp_payment_required(header: str, tool: str) -> dict:
    """The x402 payment request of a 402 as ``x402.mcp`` defines it for a tool: the v2
    ``PaymentRequired`` (``x402Version: 2``, ``accepts``, ``resource``, ``extensions``) whose
    resource is the tool (``mcp://tool/<name>``, ``x402.mcp.utils.create_tool_resource_url``)
    and whose Bazaar metadata describes the tool (``type: mcp``). Merged into the API error
    body, which keeps its ``error`` code, ``message`` and facts."""
    from x402.http.utils import decode_payment_required_header
    from x402.schemas import ResourceInfo

    from app.services.billing.x402 import ATOMIC_PER_CENT
    from app.services.gateway import discovery, tools

    req = decode_payment_required_header(header)
    parsed = tools.parse_tool_name(tool)
    ext = dict(req.extensions or {})
    if parsed is not None and req.accepts:
        cents = int(req.accepts[0].amount) // ATOMIC_PER_CENT
        ext.update(discovery.mcp_tool_extension(parsed[0], parsed[1], cents,
                                                req.resource.description if req.resource else None))
    req = req.model_copy(update={
        "resource": ResourceInfo(url=f"mcp://tool/{tool}", mime_type="application/json",
                                 description=req.resource.description if req.resource else None),
        "extensions": ext or None})
    out = req.model_dump(by_alias=True, exclude_none=True)
    out.pop("error", None)  # the API error code stays in ``error``; the message is ``message``
    return out


def _payment_header(value) -> str | None:
    """``_meta["x402/payment"]`` (x402.mcp sends the ``PaymentPayload`` as a JSON object; a
    JSON string or the header's base64 form are taken too) in the header form
    ``gateway.calls.call`` reads: base64 JSON without nulls, as x402's
    ``encode_payment_signature_header`` writes it."""
    import base64

    from app.services.billing.x402 import MAX_HEADER_BYTES, InvalidPayment

    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text.startswith("{"):
            return text  # already the header's form; decoded and bounded by the call
        if len(text) > MAX_HEADER_BYTES:
            raise InvalidPayment(f"The payment in {PAYMENT_META_PLACE} is too large.")
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise InvalidPayment(f"The payment in {PAYMENT_META_PLACE} is not JSON.") from None
    if not isinstance(value, dict):
        raise InvalidPayment(f"The payment in {PAYMENT_META_PLACE} must be an x402 PaymentPayload object.")

    def bare(node):
        if isinstance(node, dict):
            return {k: bare(v) for k, v in node.items() if v is not None}
        if isinstance(node, list):
            return [bare(v) for v in node]
        return node

    return base64.b64encode(orjson.dumps(bare(value))).decode()


def _payment_response(headers: dict) -> dict | None:
    """The settlement of an x402-paid call (its ``PAYMENT-RESPONSE`` / ``X-PAYMENT-RESPONSE``
    header) as ``x402.mcp`` puts it in the result's ``_meta``: a ``SettleResponse`` object."""
    from x402.http.utils import decode_payment_response_header

    value = (headers or {}).get("PAYMENT-RESPONSE") or (headers or {}).get("X-PAYMENT-RESPONSE")
    if not value:
        return None
    return decode_payment_response_header(value).model_dump(by_alias=True, exclude_none=True)


def _run_call(app, principal, request_id: str | None, name: str, arguments: dict | None,
              meta: dict | None, header_key: str | None) -> tuple[bytes, dict]:
    """The metered call of one ``tools/call``, on a worker thread: the gateway's response
    body (bytes) and headers (``PAYMENT-RESPONSE`` of an x402-paid call). Raises
    ``LookupError`` for an unknown tool, ``ToolCallError`` for an API error (a 402's body
    is also x402.mcp's payment request). ``_meta["x402/payment"]`` pays the call as the
    ``PAYMENT-SIGNATURE`` header pays ``POST /v1/module/{slug}/call``."""
    from flask import g

    from app import auth, ratelimits
    from app.blueprints.gateway.schemas import ModuleCallHeadersSchema, ModuleCallRequestSchema
    from app.errors import DomainError, InvalidRequest, ModuleNotFound, UnknownAction
    from app.extensions import db
    from app.services.gateway import calls as gateway
    from app.services.gateway import tools

    with app.app_context():
        g.request_id, g.principal, g.account_id = request_id, principal, principal.account_id
        try:
            parsed = tools.parse_tool_name(name)
            if parsed is None:
                raise LookupError(name)
            slug, action = parsed
            auth.check_scopes(principal, ("call:write",))
            body = dict(arguments or {})
            if body.get("action", action) != action:
                raise InvalidRequest(f"arguments.action: the tool {name} calls action '{action}'; "
                                     "leave action out.")
            body["action"] = action
            loaded = ModuleCallRequestSchema().fast_load(body)
            if loaded is None:
                try:
                    loaded = ModuleCallRequestSchema().load(body)
                except Exception as exc:  # marshmallow ValidationError: the route's 400
                    raise InvalidRequest(f"Invalid arguments: {getattr(exc, 'messages', exc)}") from None
            key = (meta or {}).get(IDEMPOTENCY_META_KEY, header_key)
            if header_key is not None and key != header_key:
                raise InvalidRequest("The Idempotency-Key header and _meta gateway/idempotency-key differ.")
            if key is not None:
                checked = ModuleCallHeadersSchema().fast_load({"Idempotency-Key": key}) \
                    if isinstance(key, str) else None
                if checked is None:
                    raise InvalidRequest("Idempotency key: 1 to 128 characters of text.")
                key = checked["idempotency_key"]
            payment = _payment_header((meta or {}).get(PAYMENT_META_KEY))
            ratelimits.per_credential(principal)
            res = gateway.call(account_id=principal.account_id, mode=principal.mode, slug=slug,
                               body=loaded, idempotency_key=key, payment=payment,
                               request_id=request_id, key_id=auth.key_of(principal),
                               actor=principal.credential_id, controls=auth.controls_of(principal),
                               actor_account=auth.person_of(principal))
            return res.body, res.headers
        except (ModuleNotFound, UnknownAction):
            raise LookupError(name) from None
        except DomainError as err:
            raise ToolCallError(_error_body(err, request_id, name), _payment_response(err.headers)) from None
        except (LookupError, ToolCallError):
            raise
        except Exception:  # rendered like the API's 500: logged, no details out
            log.exception("mcp tools/call failed", extra={"request_id": request_id})
            raise ToolCallError({"error": "internal_error", "message": "Internal server error.",
                                 "request_id": request_id}) from None
        finally:
            db.session.remove()


def _list_tools(app, principal) -> list[dict]:
    """Every tool the credential can call: for a key with a module allow-list
    (``allowed_modules``) the tools of those modules only (the others would answer 403
    ``module_not_allowed``), for a test-mode credential those of modules with a sandbox."""
    from app.auth import controls_of
    from app.extensions import db
    from app.services.gateway import tools

    controls = controls_of(principal) if principal is not None else None
    allowed = controls.modules if controls is not None else None
    with app.app_context():
        try:
            found = tools.list_tools(principal.mode if principal is not None else "live")
        finally:
            db.session.remove()
    if allowed is None:
        return found
    return [t for t in found if tools.parse_tool_name(t["name"])[0] in allowed]


def build_server(app):
    """The SDK's low-level ``Server`` with the gateway's two tool handlers."""
    import mcp_types as types
    from mcp.server import Server
    from mcp.shared.exceptions import MCPError

    async def list_tools(ctx, params) -> types.ListToolsResult:
        state = ctx.request.scope["state"] if ctx.request is not None else {}
        found = await anyio.to_thread.run_sync(_list_tools, app, state.get("principal"))
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in found])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        state = ctx.request.scope["state"] if ctx.request is not None else {}
        principal = state.get("principal")
        if principal is None:  # the route always sets it; never reached in service
            raise MCPError(types.INVALID_REQUEST, "No credential.")
        try:
            raw, headers = await anyio.to_thread.run_sync(
                _run_call, app, principal, state.get("request_id"), params.name, params.arguments,
                params.meta, state.get("idempotency_key"))
        except LookupError:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {str(params.name)[:140]}",
                           {"error": "unknown_tool"}) from None
        except ToolCallError as exc:
            text = orjson.dumps(exc.body).decode()
            return types.CallToolResult(content=[types.TextContent(text=text)],
                                        structured_content=exc.body, is_error=True,
                                        _meta={PAYMENT_RESPONSE_META_KEY: exc.settled} if exc.settled else None)
        response = orjson.loads(raw)
        settled = _payment_response(headers)
        return types.CallToolResult(  # a provider's 4xx (ok: false) is the tool's error, charged
            content=[types.TextContent(text=orjson.dumps(response.get("result")).decode())],
            structured_content=response, is_error=response.get("ok") is False,
            _meta={PAYMENT_RESPONSE_META_KEY: settled} if settled else None)

    return Server(SERVER_NAME, version="1.0.0", title="Metered API Gateway",
                  description="The module catalog as tools, charged per call, with signed receipts.",
                  instructions=INSTRUCTIONS, on_list_tools=list_tools, on_call_tool=call_tool)


class Bridge:
    """This process's MCP server on its own event-loop thread; ``handle`` serves one HTTP
    request from a WSGI thread (see the module docstring)."""

    def __init__(self, app):
        self.app = app
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._portal: BlockingPortal | None = None
        self._manager = None

    def _start(self) -> None:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        manager = StreamableHTTPSessionManager(
            app=build_server(self.app), json_response=True, stateless=True,
            max_request_body_size=int(self.app.config.get("MAX_CONTENT_LENGTH") or 1024 * 1024))
        ready: queue.Queue = queue.Queue()

        async def main() -> None:
            async with BlockingPortal() as portal, manager.run():
                ready.put(portal)
                await portal.sleep_until_stopped()

        def loop() -> None:
            try:
                anyio.run(main)
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                ready.put(exc)
                raise

        threading.Thread(target=loop, name="mcp-loop", daemon=True).start()
        got = ready.get(timeout=30)
        if isinstance(got, BaseException):
            raise RuntimeError("the MCP event loop did not start") from got
        self._portal, self._manager = got, manager

    def _ensure(self) -> BlockingPortal:
        pid = os.getpid()
        if self._pid != pid:  # first use, or a forked worker (the loop thread is not forked)
            with self._lock:
                if self._pid != pid:
                    self._start()
                    self._pid = pid
        assert self._portal is not None
        return self._portal

    def handle(self, *, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]],
               body: bytes, client: tuple[str, int] | None, scheme: str, server: tuple[str, int] | None,
               state: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Serve one HTTP request with the SDK; returns (status, headers, body)."""
        portal = self._ensure()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": scheme, "path": path, "raw_path": path.encode(),
                 "root_path": "", "query_string": query, "headers": headers,
                 "client": client, "server": server, "state": state}
        return portal.call(self._asgi, scope, body)

    async def _asgi(self, scope: dict, body: bytes):
        done = anyio.Event()
        out: dict = {"status": 500, "headers": [], "chunks": []}
        sent = False

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()  # the client stays connected until the answer is complete
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                out["status"], out["headers"] = message["status"], list(message.get("headers") or [])
            elif message["type"] == "http.response.body":
                out["chunks"].append(message.get("body", b""))
                if not message.get("more_body"):
                    done.set()

        try:
            await self._manager.handle_request(scope, receive, send)
        finally:
            done.set()
        return out["status"], out["headers"], b"".join(out["chunks"])
