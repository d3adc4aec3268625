"""What the sync and async clients share: configuration, the description of one API
operation (``Op``), the retry policy and the reading of answers.

Retries: 429 and 5xx answers (and connection failures) are retried with exponential
backoff, honouring ``Retry-After``. An operation is retried only when repeating it is
safe: GET/PUT/DELETE, and POSTs that carry an ``Idempotency-Key`` (every module call
does; the client generates one when the caller gave none), so a retry never charges
twice. A 429 is always safe to retry (the gateway refused the request before doing it),
and so is a connection that could not be opened (``NOT_SENT``: nothing reached the
gateway); ``409 idempotency_key_in_use`` (the first attempt still running) is retried too.
"""
from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, TypeVar

import httpx

from gateway_client._version import __version__
from gateway_client.errors import error_for, parse_retry_after

T = TypeVar("T")

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = 30.0
# A module call waits for its provider: a catalog action may run up to 120 s (its
# ``timeout_seconds``) before the gateway answers, 504 at the latest; a call's answer is
# read for that long plus a margin, so a slow action's charged answer is not lost.
CALL_READ_TIMEOUT = 130.0
USER_AGENT = f"gateway-client-python/{__version__} httpx/{httpx.__version__}"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# transport failures before any byte of the request was sent: repeating it is always safe
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def resolve_base_url(base_url: str | None) -> str:
    return (base_url or os.environ.get("GATEWAY_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")


def resolve_api_key(api_key: str | None) -> str | None:
    return api_key or os.environ.get("GATEWAY_API_KEY") or None


def new_idempotency_key() -> str:
    return "gwc_" + uuid.uuid4().hex


@dataclass(frozen=True)
class Op(Generic[T]):
    """One API operation: the request to send and how to read a 2xx answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    auth: bool = True
    stream_to: str | None = None  # write the 2xx body to this file instead of reading it
    waits_for_provider: bool = False  # a module call: read for up to CALL_READ_TIMEOUT by default

    @property
    def idempotency_key(self) -> str | None:
        return self.headers.get("Idempotency-Key")

    @property
    def retry_safe(self) -> bool:
        return self.method in ("GET", "PUT", "DELETE", "HEAD") or self.idempotency_key is not None


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` extra attempts; delay ``backoff * 2**attempt`` (± 25 % jitter),
    at most ``max_backoff``; a ``Retry-After`` above ``max_retry_after`` is not waited
    for (the error is raised at once)."""

    max_retries: int = 2
    backoff: float = 0.5
    max_backoff: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, op: Op[Any], attempt: int, response: httpx.Response | None,
              error: Exception | None = None) -> float | None:
        """Seconds to wait before retrying after ``attempt`` (0-based), or None to give up.
        ``response`` is None when the request failed at the connection level (``error``)."""
        if attempt >= self.max_retries:
            return None
        if response is None:
            if not (op.retry_safe or isinstance(error, NOT_SENT)):
                return None
        elif not _retryable_answer(op, response):
            return None
        base = min(self.max_backoff, self.backoff * (2.0 ** attempt)) * random.uniform(0.75, 1.25)
        if response is not None:
            after = parse_retry_after(response.headers.get("Retry-After"))
            if after is not None:
                if after > self.max_retry_after:
                    return None
                return max(after, 0.05)
        return base


def _retryable_answer(op: Op[Any], response: httpx.Response) -> bool:
    if response.status_code == 429:
        return True
    if response.status_code == 409 and op.idempotency_key is not None:
        return _error_code(response) == "idempotency_key_in_use"
    return response.status_code in RETRY_STATUSES and op.retry_safe


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error.get("code") if isinstance(error, dict) else error


def default_timeouts(timeout: float | None, own_client: bool) -> tuple[float, httpx.Timeout | None]:
    """(the HTTP client's timeout, a module call's), from the ``timeout`` the caller gave
    (None: the defaults). A timeout of the caller's, or an HTTP client of the caller's,
    applies to every request: no module call timeout of its own then."""
    if timeout is not None or not own_client:
        return (DEFAULT_TIMEOUT if timeout is None else timeout), None
    return DEFAULT_TIMEOUT, httpx.Timeout(DEFAULT_TIMEOUT, read=CALL_READ_TIMEOUT)


def request_timeout(op: Op[Any], call_timeout: httpx.Timeout | None) -> Any:
    """The timeout of one request: the module call's for a call, else the client's."""
    if op.waits_for_provider and call_timeout is not None:
        return call_timeout
    return httpx.USE_CLIENT_DEFAULT


def request_headers(op: Op[Any], token: str | None) -> dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json", **op.headers}
    if op.auth and token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def raise_for_status(response: httpx.Response) -> None:
    """Raise the ``ApiError`` subclass for a non-2xx answer (body already read)."""
    if response.is_success:
        return
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    raise error_for(response.status_code, body, response.headers)


def json_body(response: httpx.Response) -> Any:
    return response.json()


def is_payment_required(response: httpx.Response) -> bool:
    return response.status_code == 402 and _error_code(response) == "payment_required"
