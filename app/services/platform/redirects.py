"""Redirect targets: the one rule for URLs the gateway sends a browser to (the checkout's
``return_url``; docs/security.md "Open redirects").

A return URL is accepted only when it is an absolute ``https`` URL (``http`` too outside
production, for local shops), with a host name, no userinfo (``user@host`` makes browsers
show a trusted name in front of another host), no backslash (browsers read ``\\`` as
``/``, turning ``https://a.example\\@b.example`` into another host), no whitespace or
control characters, and at most 2,000 characters. When ``RETURN_URL_HOSTS`` is set
(comma-separated host names), the host must be one of them or a subdomain of one; unset,
any host is allowed (the return URL is the customer's own shop, and the checkout page
only ever sends the customer who started it there).

The check runs when the URL is stored and again before each redirect (``is_safe``), so a
row stored before the rule existed never redirects anywhere unsafe.
"""
from __future__ import annotations

import re
from urllib.parse import urlsplit

from flask import current_app

from app.errors import Unprocessable

MAX_LEN = 2000
_FORBIDDEN = re.compile(r"[\s\\\x00-\x1f\x7f-\x9f]")


def _allowed_schemes() -> tuple[str, ...]:
    return ("https",) if current_app.config.get("PRODUCTION") else ("https", "http")


def _allowed_host(host: str) -> bool:
    hosts = [h.strip().lower().rstrip(".") for h in
             (current_app.config.get("RETURN_URL_HOSTS") or "").split(",") if h.strip()]
    return not hosts or any(host == h or host.endswith("." + h) for h in hosts)


def problem(url: str) -> str | None:
    """Why ``url`` may not be a redirect target, or None when it may."""
    if not isinstance(url, str) or not url or len(url) > MAX_LEN:
        return f"must be an absolute URL of at most {MAX_LEN} characters"
    if _FORBIDDEN.search(url):
        return "must not contain backslashes, whitespace or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port  # noqa: F841 - raises on a malformed port
    except ValueError:
        return "is not a valid URL"
    if parts.scheme.lower() not in _allowed_schemes():
        return "must use " + " or ".join(_allowed_schemes())
    if "@" in parts.netloc or parts.username is not None:
        return "must not contain userinfo (user@host)"
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return "must name a host"
    if not _allowed_host(host):
        return "host is not one of RETURN_URL_HOSTS"
    return None


def validate_return_url(url: str | None, field: str = "return_url") -> str | None:
    """``url`` unchanged when it is an acceptable redirect target (None stays None);
    raises ``Unprocessable`` (422) naming ``field`` otherwise: the document publishes the shape
    (the field's pattern), what remains is configuration (https only in production,
    ``RETURN_URL_HOSTS``) and the port's range, which the schema does not state."""
    if url is None:
        return None
    reason = problem(url)
    if reason:
        raise Unprocessable(f"{field}: {reason}.")
    return url


def is_safe(url: str | None) -> bool:
    """Whether a stored ``url`` may be redirected to now."""
    return bool(url) and problem(url) is None


# The 422 of every route that takes a redirect target (its ``errors=`` entry).
REFUSED_DOC = ("`unprocessable`: the `return_url` has the documented shape but the redirect rule refuses it: "
               "http in production, a host outside the operator's `RETURN_URL_HOSTS`, or a port out of range.")


def origin(url: str) -> str:
    """``scheme://host[:port]`` of a safe URL (for a CSP ``form-action``)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
