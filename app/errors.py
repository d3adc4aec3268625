"""Errors: the DomainError hierarchy, the error schema and the one JSON error handler.

Every error on every path is ``{"error": code, "message": text, "request_id": id}``
(SPEC part 7, DESIGN §4). Services raise ``DomainError`` subclasses; werkzeug
``HTTPException``s (404 unknown route, 405, 413, webargs validation aborts) and
unexpected exceptions are converted here too, so nothing else ever renders an error.
"""
from __future__ import annotations

import logging

import marshmallow as ma
from flask import Flask, g, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ErrorSchema(ma.Schema):
    """The error body of every non-2xx response."""

    error = ma.fields.String(required=True, metadata={"description": "Stable snake_case error code"})
    message = ma.fields.String(metadata={"description": "Human-readable explanation"})
    request_id = ma.fields.String(metadata={"description": "Echoed in the X-Request-Id header"})


# code -> (status, description): the catalogue of stable error codes, published in
# the OpenAPI document (x-error-codes) and the README.
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "Malformed JSON or a field failed validation; the message names the fields."),
    "unknown_action": (400, "The module has no such action."),
    "invalid_payment": (400, "The X-Payment header could not be decoded."),
    "payment_method_invalid": (400, "The payment method id is unknown to the processor or cannot be used."),
    "no_payment_method": (400, "No saved default payment method fits (save one with POST /api/pay/method)."),
    "wallet_not_connected": (400, "The operation needs a connected wallet (POST /api/wallet/connect)."),
    "nonce_invalid": (400, "The wallet-connect message is unknown, expired, already used or for another chain/address."),
    "webhook_signature_invalid": (400, "The webhook's Stripe-Signature is missing, forged or stale (300 s tolerance)."),
    "signature_invalid": (401, "The wallet signature does not verify for the address."),
    "card_declined": (402, "The processor declined the charge; the message carries the decline reason."),
    "unauthorized": (401, "Missing, malformed, unknown, expired or revoked credential."),
    "malformed_signin": (401, "Agent sign-in: pubkey, signature or nonce is not in the expected form."),
    "invalid_signature": (401, "Agent sign-in: the signature does not verify for this pubkey and nonce."),
    "unknown_agent": (401, "Agent sign-in: no agent is registered with this pubkey."),
    "unknown_nonce": (401, "Agent sign-in: the nonce was never issued."),
    "nonce_used": (401, "Agent sign-in: the nonce was already used (replay or concurrent use)."),
    "nonce_expired": (401, "Agent sign-in: the nonce expired (nonces live 5 minutes)."),
    "payment_required": (402, "The balance cannot cover the price; pay with X-Payment or fund the wallet."),
    "payment_invalid": (402, "The X-Payment authorization was refused (amount, recipient, expiry, replay)."),
    "insufficient_scope": (403, "The credential lacks the scope this route requires."),
    "forbidden": (403, "The account may not use this route (e.g. admin only)."),
    "not_found": (404, "No such route or object (another account's objects are reported as not found)."),
    "invalid_token": (404, "The e-mailed confirmation token is unknown, expired or already used."),
    "module_not_found": (404, "No approved module has this slug."),
    "method_not_allowed": (405, "The route does not accept this HTTP method."),
    "conflict": (409, "The request conflicts with the current state (e.g. e-mail or slug taken)."),
    "alert_limit_reached": (409, "The account already has the maximum number of alerts (50)."),
    "idempotency_key_in_use": (409, "A request with this Idempotency-Key is still in flight."),
    "idempotency_key_reused": (409, "The Idempotency-Key was used with a different request."),
    "payload_too_large": (413, "The request body exceeds the size limit."),
    "no_matching_model": (400, "Chat: no available model supports what the request needs (tools, JSON mode, images, context)."),
    "context_length_exceeded": (400, "Chat: the messages exceed the named model's context window."),
    "model_not_found": (404, "Chat: no available model has this id (GET /v1/models lists them)."),
    "unsupported_media_type": (415, "The request body must be JSON."),
    "rate_limited": (429, "Too many requests; retry after the Retry-After seconds."),
    "internal_error": (500, "Unexpected server error (details are logged, never returned)."),
    "provider_error": (502, "The upstream provider failed; the call was not charged."),
    "service_unavailable": (503, "A dependency is temporarily unavailable."),
    "provider_timeout": (504, "The upstream provider timed out; the call was not charged."),
}


class DomainError(Exception):
    """Base of all errors raised by services; carries an error code and HTTP status."""

    status = 400
    code = "invalid_request"
    message = "Bad request."

    def __init__(self, message: str | None = None, *, code: str | None = None,
                 status: int | None = None, headers: dict | None = None,
                 extra: dict | None = None):
        super().__init__(message or self.message)
        self.message = message or self.message
        if code:
            self.code = code
        if status:
            self.status = status
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


class InvalidRequest(DomainError):
    status, code, message = 400, "invalid_request", "The request is invalid."


class Unauthorized(DomainError):
    status, code, message = 401, "unauthorized", "A valid bearer credential is required."

    def __init__(self, message: str | None = None, **kw):
        super().__init__(message, **kw)
        self.headers.setdefault("WWW-Authenticate", 'Bearer realm="api"')


class PaymentRequired(DomainError):
    status, code, message = 402, "payment_required", "Payment required."


class InsufficientScope(DomainError):
    status, code, message = 403, "insufficient_scope", "The credential lacks the required scope."


class Forbidden(DomainError):
    status, code, message = 403, "forbidden", "You are not allowed to do this."


class NotFound(DomainError):
    status, code, message = 404, "not_found", "Not found."


class Conflict(DomainError):
    status, code, message = 409, "conflict", "Conflict with the current state."


class RateLimited(DomainError):
    status, code, message = 429, "rate_limited", "Too many requests."


class UpstreamError(DomainError):
    status, code, message = 502, "provider_error", "The upstream provider failed."


class ModuleNotFound(DomainError):
    status, code, message = 404, "module_not_found", "No approved module has this slug."


class UnknownAction(DomainError):
    status, code, message = 400, "unknown_action", "The module has no such action."


class ProviderTimeout(UpstreamError):
    status, code, message = 504, "provider_timeout", "The upstream provider timed out."


class ServiceUnavailable(DomainError):
    status, code, message = 503, "service_unavailable", "Temporarily unavailable."


_HTTP_CODE_NAMES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    503: "service_unavailable",
}


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
            out.append(f"{prefix}: {text}" if prefix else text)
        else:
            for m in messages:
                out.extend(_flatten_messages(m, prefix))
    else:
        out.append(f"{prefix}: {messages}" if prefix else str(messages))
    return out


def error_response(code: str, message: str, status: int, headers: dict | None = None,
                   extra: dict | None = None):
    import secrets

    if "request_id" not in g:
        g.request_id = "req_" + secrets.token_hex(12)
    body = {"error": code, "message": message, "request_id": g.request_id}
    if extra:
        body.update(extra)
    resp = jsonify(body)
    resp.status_code = status
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def handle_domain_error(err: DomainError):
    return error_response(err.code, err.message, err.status, err.headers, err.extra)


def handle_http_exception(err: HTTPException):
    status = err.code or 500
    if status >= 500:
        return handle_unexpected(err)
    data = getattr(err, "data", None) or {}
    headers = dict(data.get("headers") or {})
    code = _HTTP_CODE_NAMES.get(status, "invalid_request" if status < 500 else "internal_error")
    message = data.get("message")
    messages = data.get("messages") or data.get("errors")
    if status in (400, 422):
        status, code = 400, "invalid_request"
        if messages:
            message = "Invalid request: " + "; ".join(_flatten_messages(messages))
    if status == 429:
        # Flask-Limiter: keep Retry-After and RateLimit headers it computed.
        message = message or f"Rate limit exceeded ({err.description})."
        if hasattr(err, "get_headers"):
            for k, v in err.get_headers():
                if k.lower() != "content-type":
                    headers.setdefault(k, v)
    if status == 405 and hasattr(err, "valid_methods") and err.valid_methods:
        headers["Allow"] = ", ".join(err.valid_methods)
    if status == 413:
        message = message or "The request body is too large."
    if not message:
        message = err.description or err.name
    return error_response(code, message, status, headers)


def handle_unexpected(err: Exception):
    log.exception("unhandled error", extra={"request_id": getattr(g, "request_id", None)})
    return error_response("internal_error", "Internal server error.", 500)


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(DomainError, handle_domain_error)
    app.register_error_handler(HTTPException, handle_http_exception)
    app.register_error_handler(Exception, handle_unexpected)
