"""Request ids: taken from ``X-Request-Id`` when sane, else generated; echoed on every response."""
from __future__ import annotations

import re
import secrets

from flask import Flask, g, request

_SANE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def init_request_id(app: Flask) -> None:
    @app.before_request
    def _assign_request_id():
        incoming = request.headers.get("X-Request-Id", "")
        g.request_id = incoming if _SANE.match(incoming) else "req_" + secrets.token_hex(12)

    @app.after_request
    def _echo_request_id(response):
        rid = g.get("request_id")
        if rid is None:  # error raised before before_request ran (e.g. routing)
            rid = g.request_id = "req_" + secrets.token_hex(12)
        response.headers["X-Request-Id"] = rid
        for k, v in (g.get("ratelimit_headers") or {}).items():
            response.headers.setdefault(k, v)
        return response
