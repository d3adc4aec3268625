"""Errors: the DomainError hierarchy, the error schemas and the one JSON error handler.

Every error is ``{"error": code, "message": text, "request_id": id}`` (SPEC part 7,
DESIGN §4) — except on the chat host, which speaks its provider's convention: OpenAI's
``{"error": {"message", "type", "code", "param"}, "request_id"}`` on the OpenAI routes,
Anthropic's ``{"type": "error", "error": {"type", "message", "code"}, "request_id"}`` on
``/v1/messages`` — and on ``POST /mcp``, whose errors are JSON-RPC error responses
``{"jsonrpc": "2.0", "id", "error": {"code", "message", "data": <the gateway's body>}}``
that MCP clients read (``app.chathost.error_style`` decides; ``error_body`` renders all four).
Services raise ``DomainError`` subclasses; werkzeug ``HTTPException``s (404 unknown route,
405, 413, webargs validation aborts) and unexpected exceptions are converted here too, so
nothing else ever renders an error.
"""
from __future__ import annotations

import logging

import marshmallow as ma
from flask import Flask, current_app, g, has_request_context, jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ErrorSchema(ma.Schema):
    """The error body of every non-2xx response. Some errors add fields beside these three
    (a 402's payment request and price, a spend limit's figures, the roles that may act;
    named in the operation's response): the schema is open, like ``OpenAIErrorSchema``."""

    class Meta:
        unknown = ma.INCLUDE

    error = ma.fields.String(required=True, metadata={"description": "Stable snake_case error code"})
    message = ma.fields.String(metadata={"description": "Human-readable explanation"})
    request_id = ma.fields.String(metadata={"description": "Echoed in the X-Request-Id header"})


class OpenAIErrorDetailSchema(ma.Schema):
    message = ma.fields.String(required=True, metadata={"description": "Human-readable explanation"})
    type = ma.fields.String(required=True, metadata={
        "description": "OpenAI-style error type, by status (docs/chat.md \"Errors\")"})
    code = ma.fields.String(required=True, metadata={"description": "The gateway's stable snake_case error code"})
    param = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "The request field at fault, when known"})


class OpenAIErrorSchema(ma.Schema):
    """The error body on the chat host's OpenAI routes (DESIGN §4); other fields a gateway
    error carries (e.g. a 402's x402 payment request) sit beside ``error``."""

    class Meta:
        unknown = ma.INCLUDE

    error = ma.fields.Nested(OpenAIErrorDetailSchema, required=True)
    request_id = ma.fields.String(required=True, metadata={"description": "Echoed in the X-Request-Id header"})


class AnthropicErrorDetailSchema(ma.Schema):
    type = ma.fields.String(required=True, metadata={
        "description": "Anthropic-style error type, by status (docs/chat.md \"Errors\")"})
    message = ma.fields.String(required=True)
    code = ma.fields.String(required=True, metadata={"description": "The gateway's stable snake_case error code"})


class AnthropicErrorSchema(ma.Schema):
    """The error body of ``/v1/messages`` (Anthropic's shape plus the gateway's code)."""

    class Meta:
        unknown = ma.INCLUDE

    type = ma.fields.String(required=True, metadata={"description": "`error`"})
    error = ma.fields.Nested(AnthropicErrorDetailSchema, required=True)
    request_id = ma.fields.String(required=True)


class McpErrorDetailSchema(ma.Schema):
    class Meta:
        unknown = ma.INCLUDE

    code = ma.fields.Integer(required=True, metadata={
        "description": "JSON-RPC error code: -32600 for a request the gateway refused before MCP "
                       "(credential, input rules, size), -32603 for a server error; the MCP SDK's "
                       "own codes for a message MCP refuses"})
    message = ma.fields.String(required=True)
    data = ma.fields.Raw(metadata={"description": "The gateway's error body `{error, message, request_id, …}` "
                                                  "when the gateway refused the request (the SDK's own errors "
                                                  "may carry other data)"})


class McpErrorSchema(ma.Schema):
    """The error body of ``POST /mcp``: a JSON-RPC error response, which MCP clients raise
    with its code, message and data (docs/mcp.md "Errors")."""

    class Meta:
        unknown = ma.INCLUDE

    jsonrpc = ma.fields.String(required=True, metadata={"description": "`2.0`"})
    id = ma.fields.Raw(required=True, allow_none=True, metadata={
        "description": "The id of the JSON-RPC request refused (a string or an integer), or null when "
                       "it could not be read"})
    error = ma.fields.Nested(McpErrorDetailSchema, required=True)


class CatalogError(ValueError):
    """A catalog file (modules or chat models, YAML) is invalid; the message names the file
    and field. Raised when a catalog is loaded, never on a request path."""


class DomainError(Exception):
    """Base of all errors raised by services: an error code, its HTTP status and what it
    means. Each stable code is declared by exactly ONE subclass (``status``, ``code``,
    ``description``, default ``message``); subclasses that keep their parent's code refine
    the message only. ``error_codes()`` publishes the table built from them."""

    status = 400
    code = "invalid_request"
    message = "Bad request."
    description = ""

    def __init__(self, message: str | None = None, *, headers: dict | None = None,
                 extra: dict | None = None, param: str | None = None):
        super().__init__(message or self.message)
        self.message = message or self.message
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})
        self.param = param  # the request field at fault, when known (OpenAI's ``param``)


class InvalidRequest(DomainError):
    status, code, message = 400, "invalid_request", "The request is invalid."
    description = "Malformed JSON or a field failed validation; the message names the fields."


class Unprocessable(DomainError):
    """A request the document accepts that a rule JSON Schema cannot state refuses: a relation
    between parameters, the clock, a checksum or a decoded length (docs/decisions.md
    "Schema-valid requests"). Never a 400: a 400 means the request breaks the document."""

    status, code, message = 422, "unprocessable", "The request cannot be processed."
    description = ("Schema-valid, but a rule the OpenAPI schema cannot state refuses it (documented on the "
                   "operation; the message names the fields): e.g. `from` not before `to`, `expires_at` "
                   "not in the future, an EIP-55 checksum, a key that does not decode to 32 bytes.")


class Unauthorized(DomainError):
    status, code, message = 401, "unauthorized", "A valid bearer credential is required."
    description = "Missing, malformed, unknown, expired or revoked credential."

    def __init__(self, message: str | None = None, **kw):
        super().__init__(message, **kw)
        self.headers.setdefault("WWW-Authenticate", 'Bearer realm="api"')


class PaymentRequired(DomainError):
    status, code, message = 402, "payment_required", "Payment required."
    description = "The balance cannot cover the price; pay with X-Payment or fund the wallet."


class InsufficientScope(DomainError):
    status, code, message = 403, "insufficient_scope", "The credential lacks the required scope."
    description = "The credential lacks the scope this route requires."


class Forbidden(DomainError):
    status, code, message = 403, "forbidden", "You are not allowed to do this."
    description = "The account may not use this route (e.g. admin only)."


class NotFound(DomainError):
    status, code, message = 404, "not_found", "Not found."
    description = "No such route or object (another account's objects are reported as not found)."


class Conflict(DomainError):
    status, code, message = 409, "conflict", "Conflict with the current state."
    description = "The request conflicts with the current state (e.g. e-mail or slug taken)."


class RateLimited(DomainError):
    status, code, message = 429, "rate_limited", "Too many requests."
    description = "Too many requests; retry after the Retry-After seconds."


class UpstreamError(DomainError):
    status, code, message = 502, "provider_error", "The upstream provider failed."
    description = "The upstream provider failed; the call was not charged."


class ModuleNotFound(DomainError):
    status, code, message = 404, "module_not_found", "No approved module has this slug."
    description = "No approved module has this slug."


class UnknownAction(DomainError):
    status, code, message = 404, "unknown_action", "The module has no such action."
    description = ("The module has no such action (catalog data a schema cannot enumerate per slug: "
                   "the action, like the module, is not found).")


class ProviderTimeout(UpstreamError):
    status, code, message = 504, "provider_timeout", "The upstream provider timed out."
    description = "The upstream provider timed out; the call was not charged."


class ServiceUnavailable(DomainError):
    status, code, message = 503, "service_unavailable", "Temporarily unavailable."
    description = "A dependency is temporarily unavailable."


class MethodNotAllowed(DomainError):
    status, code, message = 405, "method_not_allowed", "Method not allowed."
    description = "The route does not accept this HTTP method."


class PayloadTooLarge(DomainError):
    status, code, message = 413, "payload_too_large", "The request body is too large."
    description = "The request body exceeds the size limit."


class UriTooLong(DomainError):
    status, code, message = 414, "uri_too_long", "The request URL is too long."
    description = ("The request line (path and query string) exceeds the server's limit "
                   "(8 KiB behind nginx).")


class UnsupportedMediaType(DomainError):
    status, code, message = 415, "unsupported_media_type", "The request body must be JSON."
    description = "The request body must be JSON."


class InternalError(DomainError):
    status, code, message = 500, "internal_error", "Internal server error."
    description = "Unexpected server error (details are logged, never returned)."


# werkzeug HTTPExceptions (unknown route, 405, 413, webargs aborts …) by status: the class
# whose code they are answered with.
_HTTP_ERRORS: dict[int, type[DomainError]] = {cls.status: cls for cls in (
    InvalidRequest, Unauthorized, Forbidden, NotFound, MethodNotAllowed, Conflict, PayloadTooLarge,
    UriTooLong, UnsupportedMediaType, RateLimited, ServiceUnavailable)}


def error_classes() -> list[type[DomainError]]:
    """Every DomainError subclass defined so far (import the services first: see
    ``error_codes``)."""
    out, todo = [], [DomainError]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out


def _import_all(package: str = "app") -> None:
    """Import every module of ``package`` so that all DomainError subclasses exist."""
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        importlib.import_module(info.name)


def error_codes() -> dict[str, tuple[int, str]]:
    """code -> (status, description) of every stable error code: the table published in
    the OpenAPI document (``x-error-codes``), generated from the DomainError subclasses
    that declare a code (all modules under ``app/`` are imported first)."""
    _import_all()
    table = {cls.code: (cls.status, cls.description) for cls in error_classes() if "code" in vars(cls)}
    return dict(sorted(table.items(), key=lambda kv: (kv[1][0], kv[0])))


_NOT_AN_OBJECT = "Invalid input type."  # marshmallow's message for a body that is not an object


def _flatten_messages(messages, prefix: str = "") -> list[str]:
    """Turn webargs/marshmallow nested error messages into 'field: reason' strings."""
    out: list[str] = []
    if isinstance(messages, dict):
        for key, value in messages.items():
            # webargs nests by location ("json", "query", "headers"); keep the field path only
            if prefix == "" and key in ("json", "query", "headers", "form", "path", "files"):
                out.extend(_flatten_messages(value, ""))
                continue
            name = f"{prefix}.{key}" if prefix else str(key)
            out.extend(_flatten_messages(value, name))
    elif isinstance(messages, (list, tuple)):
        if all(isinstance(m, str) for m in messages):
            text = " ".join(messages)
            if prefix == "_schema" and text == _NOT_AN_OBJECT:  # the body is null, a list, a string…
                out.append("the body must be a JSON object.")
                return out
            out.append(f"{prefix}: {text}" if prefix else text)
        else:
            for m in messages:
                out.extend(_flatten_messages(m, prefix))
    else:
        out.append(f"{prefix}: {messages}" if prefix else str(messages))
    return out


# The error ``type`` on the chat host, by HTTP status (docs/chat.md "Errors", docs/decisions.md):
# what the openai / anthropic SDKs and LiteLLM read. LiteLLM maps any error whose text says
# ``invalid_request_error`` to BadRequestError and any that says "rate limit" to
# RateLimitError, whatever the status: so those words appear on 400-class request errors
# and on 429 only.
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "insufficient_quota",
                403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 504: "timeout_error"}


def error_type(style: str, status: int) -> str:
    """The OpenAI / Anthropic error ``type`` of an HTTP status (other 4xx: an invalid
    request; 5xx: a server error)."""
    table = ANTHROPIC_TYPES if style == "anthropic" else OPENAI_TYPES
    if status in table:
        return table[status]
    if status < 500:
        return "invalid_request_error"
    return "api_error" if style == "anthropic" else "server_error"


def error_style() -> str:
    """The error convention of the current request (``app.chathost.error_style``), decided
    once per request and kept in ``g.error_style`` (the thin WSGI entry sets it itself);
    ``gateway`` outside a request."""
    style = g.get("error_style")
    if style is None:
        style = "gateway"
        if has_request_context():
            from app.chathost import error_style as style_of

            style = style_of(request.path, request.host, current_app.config.get("CHAT_HOST"))
        g.error_style = style
    return style


def error_body(style: str, code: str, message: str, status: int, request_id: str,
               extra: dict | None = None, param: str | None = None) -> dict:
    """An error's JSON body in ``style``: the gateway's ``{error, message, request_id}``,
    OpenAI's ``{error: {message, type, code, param}, request_id}`` or Anthropic's
    ``{type: "error", error: {type, message, code}, request_id}``; ``extra`` fields (a 402's
    payment request, a price …) beside them in every style. ``mcp``: the gateway's body as
    the ``data`` of a JSON-RPC error response, with the id of the request refused."""
    if style == "openai":
        body = {"error": {"message": message, "type": error_type(style, status), "code": code,
                          "param": param}, "request_id": request_id}
    elif style == "anthropic":
        body = {"type": "error", "error": {"type": error_type(style, status), "message": message,
                                           "code": code}, "request_id": request_id}
    else:
        body = {"error": code, "message": message, "request_id": request_id}
    if extra:
        body.update((k, v) for k, v in extra.items() if k not in body)
    if style == "mcp":  # the gateway's body as the data of a JSON-RPC error response
        body = {"jsonrpc": "2.0", "id": _jsonrpc_id(), "error": {
            "code": -32603 if status >= 500 else -32600, "message": message, "data": body}}
    return body


def _jsonrpc_id():
    """The id of the JSON-RPC request being refused (a string or an integer, as MCP's ids
    are), or None: no request context, no body read yet that parses, a notification, a
    batch, a body too large to read."""
    if not has_request_context():
        return None
    try:
        doc = request.get_json(silent=True)
    except Exception:  # noqa: BLE001 - e.g. 413: the body is not read again to name the id
        return None
    rid = doc.get("id") if isinstance(doc, dict) else None
    return rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None


def _first_field(messages) -> str | None:
    """The dotted path of the first field named in webargs/marshmallow error messages
    (OpenAI's ``param``), or None (a message about the whole body)."""
    path: list[str] = []
    while isinstance(messages, dict) and messages:
        key, messages = next(iter(messages.items()))
        if not path and key in ("json", "query", "headers", "form", "path", "files"):
            continue
        if key == "_schema":
            break
        path.append(str(key))
    return ".".join(path) or None


def error_response(code: str, message: str, status: int, headers: dict | None = None,
                   extra: dict | None = None, param: str | None = None):
    import secrets

    if "request_id" not in g:
        g.request_id = "req_" + secrets.token_hex(12)
    style = error_style()
    resp = jsonify(error_body(style, code, message, status, g.request_id, extra, param))
    resp.status_code = status
    if style == "anthropic":  # Anthropic's header (its SDK's ``request_id``), on every error in its shape
        resp.headers["request-id"] = g.request_id
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def handle_domain_error(err: DomainError):
    return error_response(err.code, err.message, err.status, err.headers, err.extra, err.param)


def handle_http_exception(err: HTTPException):
    status = err.code or 500
    if status >= 500:
        return handle_unexpected(err)
    data = getattr(err, "data", None) or {}
    headers = dict(data.get("headers") or {})
    code = _HTTP_ERRORS.get(status, InvalidRequest).code
    message = data.get("message")
    messages = data.get("messages") or data.get("errors")
    param = None
    if status in (400, 422):
        status, code = 400, InvalidRequest.code
        if messages:
            message = "Invalid request: " + "; ".join(_flatten_messages(messages))
            param = _first_field(messages)
    if status == 429:
        # a 429 raised as an HTTPException: keep the Retry-After and RateLimit headers it carries
        message = message or f"Rate limit exceeded ({err.description})."
        if hasattr(err, "get_headers"):
            for k, v in err.get_headers():
                if k.lower() != "content-type":
                    headers.setdefault(k, v)
    if status == 405 and hasattr(err, "valid_methods") and err.valid_methods:
        headers["Allow"] = ", ".join(err.valid_methods)
    if status == 413:
        message = message or "The request body is too large."
    if status == 404 and not message and _has_control_chars(request.path):
        # no route matched because a path segment broke the input policy (app/converters.py)
        message = "Not found: a path segment contains control characters (never part of a valid URL here)."
    if status == 404 and not message and error_style() in ("openai", "anthropic"):
        # in the provider's shape, which its SDK reads (e.code, e.message); without a dedicated
        # chat host the same host serves the module calls, so the message names them too
        message = (f"{request.path} is not served here: the chat host serves POST /v1/chat/completions, "
                   "POST /v1/messages, POST /v1/messages/count_tokens and GET /v1/models.")
        if not current_app.config.get("CHAT_HOST"):
            message = (f"{request.path} is not a route of this gateway. OpenAI- and Anthropic-compatible: "
                       "POST /v1/chat/completions, POST /v1/messages, POST /v1/messages/count_tokens, "
                       "GET /v1/models; module calls: POST /v1/module/{slug}/call; "
                       "GET /openapi.json lists every route.")
    if not message:
        message = err.description or err.name
    return error_response(code, message, status, headers, param=param)


def _has_control_chars(text: str) -> bool:
    return any(ord(ch) < 0x20 or 0x7f <= ord(ch) <= 0x9f for ch in text)


def handle_unexpected(err: Exception):
    if database_busy(err):
        # The process's pool had no connection free within DB_POOL_TIMEOUT, or PostgreSQL
        # (or PgBouncer) refused a new one: nothing was done, the client may retry.
        log.warning("database busy: %s", err, extra={"request_id": getattr(g, "request_id", None)})
        return error_response(ServiceUnavailable.code, "The database is busy; retry shortly.",
                              ServiceUnavailable.status, {"Retry-After": "1"})
    log.exception("unhandled error", extra={"request_id": getattr(g, "request_id", None)})
    return error_response(InternalError.code, InternalError.message, InternalError.status)


# PostgreSQL's SQLSTATEs for "no connection for you now": too_many_connections,
# cannot_connect_now (starting up / shutting down)
_BUSY_SQLSTATES = frozenset({"53300", "57P03"})


def database_busy(err: BaseException) -> bool:
    """``err`` means no database connection could be had in time (pool checkout timed
    out, the server refused a connection for its limit): a 503, not a 500."""
    from sqlalchemy.exc import DBAPIError, TimeoutError as PoolTimeout

    if isinstance(err, PoolTimeout):
        return True
    return isinstance(err, DBAPIError) and getattr(err.orig, "sqlstate", None) in _BUSY_SQLSTATES


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(DomainError, handle_domain_error)
    app.register_error_handler(HTTPException, handle_http_exception)
    app.register_error_handler(Exception, handle_unexpected)
