"""CORS, one mechanism for every route that browsers may call: the public endpoints a
website posts to — ``/api/track``, ``/api/contact``, ``/api/email/subscribe`` and
``/unsubscribe``, ``/api/signup`` (``CORS_ORIGINS``, ``public_endpoints``) — and the chat
host (``CHAT_CORS_ORIGINS``). A route's ``after_request`` hook calls ``apply`` with its
setting and its headers; preflights (``OPTIONS``) are Flask's automatic answers, decorated
here like every other response (errors included)."""
from __future__ import annotations

from flask import current_app, request

# The public endpoints' CORS headers (``CORS_ORIGINS``): what a page's fetch or beacon needs.
PUBLIC_HEADERS = {
    "Access-Control-Allow-Methods": "POST, OPTIONS",
    "Access-Control-Allow-Headers": "Content-Type, Authorization, X-Request-Id",
    "Access-Control-Expose-Headers": "Retry-After, X-Request-Id, RateLimit-Limit, "
                                     "RateLimit-Remaining, RateLimit-Reset",
    "Access-Control-Max-Age": "86400",
}


def public_endpoints(blp, *endpoints: str) -> None:
    """CORS (``CORS_ORIGINS``, ``PUBLIC_HEADERS``) on ``blp``'s ``endpoints``: the public
    forms a website posts to from the browser. A 204's ``Content-Type`` is dropped (no body)."""
    @blp.after_request
    def _public_cors(response):
        if request.endpoint not in endpoints:
            return response
        if response.status_code == 204:
            response.headers.pop("Content-Type", None)
        return apply(response, current_app.config.get("CORS_ORIGINS"), PUBLIC_HEADERS)


def allowed_origins(setting: str | None) -> list[str]:
    """``*`` or the origins of a comma-separated setting (empty: none), as browsers send them
    in ``Origin`` (RFC 6454: scheme and host in lower case, no path): a setting written
    ``https://Shop.example/`` (a trailing slash, capitals) allows ``https://shop.example``
    instead of silently matching no browser."""
    return [o.strip().rstrip("/").lower() for o in (setting or "").split(",") if o.strip().rstrip("/")]


def apply(response, setting: str | None, headers: dict, *, reflect_request_headers: bool = False):
    """Add the CORS headers to ``response`` when the request's ``Origin`` is allowed by
    ``setting``: ``Access-Control-Allow-Origin`` (``*`` when the setting is ``*``, else the
    origin itself with ``Vary: Origin``) and ``headers`` (methods, allowed and exposed
    headers, max age). With ``reflect_request_headers`` a preflight's
    ``Access-Control-Request-Headers`` are allowed as asked (SDKs send their own
    ``x-stainless-*`` headers; the origin is already on the list). An unlisted origin gets
    no CORS headers (the browser then refuses the answer)."""
    origin = request.headers.get("Origin")
    allowed = allowed_origins(setting)
    if not origin or not allowed:
        return response
    if "*" in allowed:
        response.headers["Access-Control-Allow-Origin"] = "*"
    elif origin in allowed:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.vary.add("Origin")
    else:
        response.vary.add("Origin")
        return response
    for k, v in headers.items():
        response.headers[k] = v
    asked = request.headers.get("Access-Control-Request-Headers")
    if reflect_request_headers and asked and request.method == "OPTIONS":
        response.headers["Access-Control-Allow-Headers"] = asked
        response.vary.add("Access-Control-Request-Headers")
    return response
