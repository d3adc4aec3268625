"""Forwarding a module call to its provider over the outbound layer's hot path
(``app.services.platform.http.upstream``: urllib3's pool directly, one per process,
pinned to the screened address), provider
authentication (secret header from the environment, or Standard Webhooks signatures
for agent-built modules), bounded response reading and result normalization."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone

import orjson
import requests
from urllib3.exceptions import ReadTimeoutError

from app.services.platform import crypto, http

USER_AGENT = http.USER_AGENT


class ProviderFailure(Exception):
    """The provider could not be reached, timed out, or answered 3xx/5xx/oversized."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind  # "error" | "timeout"
        self.detail = detail


class ProviderMisconfigured(Exception):
    """The gateway cannot authenticate to the provider (secret missing)."""


@dataclass(frozen=True)
class ProviderAnswer:
    status: int
    ok: bool
    result: dict


def auth_headers(auth: dict | None, payload: bytes, call_id: str, production: bool) -> dict:
    """Headers that authenticate the gateway to the provider. The caller's credentials
    are never forwarded (the gateway builds the outgoing headers from scratch)."""
    if not auth:
        return {}
    if auth["type"] == "header":
        value = os.environ.get(auth["env"]) or (None if production else auth.get("default"))
        if not value:
            raise ProviderMisconfigured(f"provider secret {auth['env']} is not configured")
        return {auth["header"]: auth.get("prefix", "") + value}
    if auth["type"] == "standard_webhooks":
        return crypto.webhook_headers(call_id, datetime.now(timezone.utc), payload, auth["secret"])
    raise ProviderMisconfigured(f"unknown provider auth type {auth['type']!r}")


def _query(body: dict) -> dict:
    out = {}
    for k, v in body.items():
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif v is None:
            out[k] = ""
        elif isinstance(v, (str, int, float)):
            out[k] = str(v)
        else:
            out[k] = orjson.dumps(v).decode()
    return out


def normalize(content: bytes, content_type: str) -> dict:
    """The call's ``result`` object: a JSON object body as is; any other JSON value as
    ``{"data": value}``; an empty body as ``{}``; a non-JSON body as
    ``{"text": body, "content_type": type}``."""
    if not content.strip():
        return {}
    try:
        value = orjson.loads(content)
    except orjson.JSONDecodeError:
        return {"text": content.decode("utf-8", "replace"), "content_type": content_type}
    return value if isinstance(value, dict) else {"data": value}


def forward(*, method: str, url: str, body: dict, payload: bytes, headers: dict,
            timeout: float, max_bytes: int, allow_private_hosts: bool) -> ProviderAnswer:
    """Send the call; raise ProviderFailure on connection errors, timeouts, refused addresses
    (SSRF policy, checked on the address dialled), 3xx, 5xx, 401/407 (the gateway's own
    provider credentials refused), 408, 429 and oversized bodies.
    2xx → ok; other 4xx → not ok, the provider's body is the result (charged)."""
    kwargs = {"params": _query(body)} if method in ("GET", "DELETE") else {"body": payload}
    try:
        resp = http.upstream("modules", allow_private_hosts=allow_private_hosts).request(
            method, url, headers=headers, timeout=(min(timeout, 5.0), timeout), **kwargs)
    except http.AddressRefused as exc:
        raise ProviderFailure("error", f"provider address not allowed ({exc})") from None
    except requests.Timeout as exc:
        raise ProviderFailure("timeout", f"provider timed out: {type(exc).__name__}") from None
    except requests.RequestException as exc:
        raise ProviderFailure("error", f"provider unreachable: {type(exc).__name__}") from None
    status = resp.status
    try:
        if status >= 500 or 300 <= status < 400 or status < 200:
            raise ProviderFailure("error", f"provider answered HTTP {status}")
        # Not a verdict on the caller's input, so never charged: the gateway's own credentials
        # were refused (401/407), the provider is rate-limiting the gateway (429) or timed out (408).
        if status in (401, 407):
            raise ProviderFailure("error", "provider refused the gateway's credentials")
        if status == 429:
            raise ProviderFailure("error", "provider is rate-limiting the gateway (HTTP 429)")
        if status == 408:
            raise ProviderFailure("timeout", "provider answered HTTP 408")
        try:
            content = http.read_capped(resp, max_bytes)
        except http.ResponseTooLarge:
            raise ProviderFailure("error", f"provider response exceeds {max_bytes} bytes") from None
        except requests.ConnectionError as exc:
            if exc.args and isinstance(exc.args[0], ReadTimeoutError):
                raise ProviderFailure("timeout", "provider timed out while sending its body") from None
            raise ProviderFailure("error", "provider connection failed mid-body") from None
        except requests.RequestException as exc:
            raise ProviderFailure("error", f"provider body unreadable: {type(exc).__name__}") from None
    finally:
        http.release(resp)
    result = normalize(content, resp.headers.get("Content-Type", ""))
    return ProviderAnswer(status=status, ok=status < 400, result=result)


def build_request(*, auth: dict | None, body: dict, call_id: str, request_id: str | None,
                  mode: str, production: bool) -> tuple[dict, bytes]:
    """(headers, JSON payload) of the outgoing request."""
    payload = orjson.dumps(body)
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               "User-Agent": USER_AGENT, "X-Gateway-Call-Id": call_id, "X-Gateway-Mode": mode}
    if request_id:
        headers["X-Request-Id"] = request_id
    headers.update(auth_headers(auth, payload, call_id, production))
    return headers, payload
