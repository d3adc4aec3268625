"""Request ids: taken from ``X-Request-Id`` when sane, else generated; echoed on every response."""
from __future__ import annotations

import re
import secrets

from flask import Flask, g, request

_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_for(incoming: str | None) -> str:
    """The request id of a request that sent ``incoming`` as its ``X-Request-Id``: kept
    when sane, else a new ``req_…`` id."""
    return incoming if incoming and _SANE.match(incoming) else "req_" + secrets.token_hex(12)


def echo(headers) -> None:
    """Add what every response carries to ``headers`` (werkzeug ``Headers`` or a dict):
    ``X-Request-Id``, and the plan rate limit's ``RateLimit-*`` (``g.ratelimit_headers``)
    unless the response set its own. Assigns a request id when none was (an error raised
    before ``before_request`` ran, e.g. routing)."""
    rid = g.get("request_id")
    if rid is None:
        rid = g.request_id = request_id_for(None)
    headers["X-Request-Id"] = rid
    for k, v in (g.get("ratelimit_headers") or {}).items():
        headers.setdefault(k, v)


def init_request_id(app: Flask) -> None:
    @app.before_request
    def _assign_request_id():
        g.request_id = request_id_for(request.headers.get("X-Request-Id"))

    @app.after_request
    def _echo_request_id(response):
        echo(response.headers)
        return response
