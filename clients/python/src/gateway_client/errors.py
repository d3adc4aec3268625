"""Errors raised by the client: ``ApiError`` (every non-2xx answer of the gateway, one
subclass per family of status codes) and ``ReceiptInvalid`` (a receipt that does not verify).

The gateway answers every error as ``{"error": code, "message": text, "request_id": id}``
(the chat host in its provider's shape, ``{"error": {"code", "message", …}, "request_id"}``, read too);
those three fields become ``.code``, ``.message`` and ``.request_id``. 402 answers carry
the payment request (``price_cents``, ``pay_to``, ``nonce``, ``accepts``); 429 answers
carry ``Retry-After``.
"""
from __future__ import annotations

from typing import Any, Mapping


class GatewayError(Exception):
    """Base of every exception raised by this package."""


class ApiError(GatewayError):
    """A non-2xx answer: ``status`` (HTTP), ``code`` (stable snake_case error code),
    ``message`` (human text), ``request_id`` (quote it to support), ``body`` (the JSON),
    ``retry_after`` (seconds of the answer's ``Retry-After``, or None: a 429, a 503)."""

    def __init__(self, status: int, code: str, message: str, request_id: str | None = None,
                 body: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" (request {request_id})" if request_id else ""))
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.body: dict[str, Any] = dict(body or {})
        self.headers: dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}
        self.retry_after: float | None = parse_retry_after(self.headers.get("retry-after"))


class InvalidRequest(ApiError):
    """400 / 413 / 415 / 422: the request was refused as malformed; nothing changed."""


class AuthenticationError(ApiError):
    """401: missing, unknown, expired or revoked credential (or a failed agent sign-in)."""


class PaymentRequired(ApiError):
    """402: the balance cannot cover the call (``payment_required``) or an x402 payment was
    refused (``payment_invalid``, see ``reason``). ``price_cents``, ``pay_to``, ``nonce``
    and ``accepts`` (the x402 payment requirements) come from the answer."""

    def __init__(self, status: int, code: str, message: str, request_id: str | None = None,
                 body: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status, code, message, request_id, body, headers)
        price = self.body.get("price_cents", self.headers.get("x-price-cents"))
        self.price_cents: int | None = int(price) if price is not None else None
        self.pay_to: str | None = self.body.get("pay_to") or self.headers.get("x-pay-to") or None
        self.nonce: str | None = self.body.get("nonce") or self.headers.get("x-nonce") or None
        self.accepts: list[dict[str, Any]] = list(self.body.get("accepts") or [])
        self.reason: str | None = self.body.get("reason")
        self.fund_endpoint: str | None = self.body.get("fund_endpoint")


class PermissionDenied(ApiError):
    """403: the credential lacks a scope, or the account may not use the route."""


class NotFound(ApiError):
    """404: no such object or route (another account's objects are reported as not found)."""


class Conflict(ApiError):
    """409: conflicts with the current state (taken name, Idempotency-Key reuse, limits)."""


class RateLimited(ApiError):
    """429: too many requests; ``retry_after`` is the number of seconds to wait."""


class ServerError(ApiError):
    """5xx: the gateway or the module's provider failed (provider failures are not charged)."""


class ReceiptInvalid(GatewayError, ValueError):
    """A call receipt does not verify: tampered fields, unknown key or bad signature."""


class PaymentFailed(GatewayError):
    """Automatic x402 payment could not be made (no x402 extra, unusable requirements)."""


def parse_retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (the delta-seconds form the gateway sends)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


_FAMILIES: dict[int, type[ApiError]] = {
    400: InvalidRequest, 413: InvalidRequest, 415: InvalidRequest, 422: InvalidRequest,
    401: AuthenticationError, 402: PaymentRequired, 403: PermissionDenied, 404: NotFound,
    409: Conflict, 429: RateLimited,
}


def error_for(status: int, body: Any, headers: Mapping[str, str]) -> ApiError:
    """The ``ApiError`` subclass instance for an error answer (``body`` is its parsed JSON,
    or anything else when the answer was not JSON)."""
    data: dict[str, Any] = body if isinstance(body, dict) else {}
    cls = _FAMILIES.get(status) or (ServerError if status >= 500 else ApiError)
    # the chat host answers in its provider's shape: {"error": {"code", "message", …}}
    error = data.get("error")
    nested: dict[str, Any] = error if isinstance(error, dict) else {}
    code = str(nested.get("code") or (None if nested else data.get("error")) or f"http_{status}")
    message = str(nested.get("message") or data.get("message")
                  or (body if isinstance(body, str) and body else f"HTTP {status}"))
    lowered = {k.lower(): v for k, v in headers.items()}
    request_id = data.get("request_id") or lowered.get("x-request-id")
    return cls(status, code, message, request_id, data, lowered)
