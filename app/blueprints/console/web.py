"""The console's web plumbing: the session cookie, CSRF, the sign-in gate and the
security headers of every console response.

* Cookie ``gw_console``: the session token (``services.accounts.console``) signed with a
  timestamp (itsdangerous) and re-signed on every response, so it dies after
  ``CONSOLE_SESSION_IDLE_MINUTES`` without a request (idle timeout); the token's row
  expires after the absolute timeout and is consumed at sign-out (server-side
  revocation). HttpOnly, SameSite=Lax, Secure in production.
* CSRF: every form carries ``csrf`` = HMAC(SECRET_KEY, session token) when signed in, or
  HMAC(SECRET_KEY, nonce of the ``gw_console_pre`` cookie) when signed out; every POST is
  refused (403 page) unless it matches.
* Headers: a strict Content-Security-Policy (no inline script or style: the one
  stylesheet is served by the app), no caching, no referrer, no framing.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from flask import current_app, g, redirect, render_template, request, url_for
from itsdangerous import BadSignature, URLSafeTimedSerializer

from app.services.accounts import console as console_svc

COOKIE = "gw_console"
PRE_COOKIE = "gw_console_pre"
_SALT = "console.session.v1"

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; script-src 'self'; "
       "form-action 'self' https://checkout.stripe.com; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "X-Robots-Tag": "noindex",
}


MODE_COOKIE = "gw_console_mode"


def mode() -> str:
    """The console's live/test switch (a cookie set by the switch form)."""
    return "test" if request.cookies.get(MODE_COOKIE) == "test" else "live"


def _serializer() -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt=_SALT)


def _secure() -> bool:
    return current_app.config.get("APP_ENV") == "production"


def load_session() -> None:
    """Before each console request: ``g.account`` (or None) from the cookie."""
    g.account, g.session_token, g.pre_nonce = None, None, request.cookies.get(PRE_COOKIE)
    raw = request.cookies.get(COOKIE)
    if raw and len(raw) <= 400:
        try:
            token = _serializer().loads(raw, max_age=console_svc.idle_seconds())
        except BadSignature:  # includes SignatureExpired: idle too long
            token = None
        account = console_svc.session_account(token) if isinstance(token, str) else None
        if account is not None:
            g.account, g.session_token = account, token
    if not g.session_token and not (g.pre_nonce and len(g.pre_nonce) <= 64):
        g.pre_nonce, g.new_pre = secrets.token_urlsafe(24), True


def csrf_token() -> str:
    binding = ("s:" + g.session_token) if g.get("session_token") else ("p:" + (g.get("pre_nonce") or ""))
    key = current_app.config["SECRET_KEY"].encode()
    return hmac.new(key, ("console-csrf:" + binding).encode(), hashlib.sha256).hexdigest()


def csrf_ok() -> bool:
    sent = request.form.get("csrf", "")
    return bool(sent) and hmac.compare_digest(sent, csrf_token())


def finish(response):
    """After each console request: security headers, and the cookies (re-signed session
    for the idle timeout; cleared after sign-out; the pre-session nonce when new)."""
    response.headers.update(HEADERS)
    opts = {"httponly": True, "samesite": "Lax", "secure": _secure(), "path": "/"}
    if g.get("signed_out"):
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="Lax", secure=_secure())
    elif g.get("session_token"):
        set_session_cookie(response, g.session_token)
    if g.get("new_pre") and not g.get("session_token"):
        response.set_cookie(PRE_COOKIE, g.pre_nonce, **opts)
    return response


def set_session_cookie(response, session_token: str):
    """Put the (signed) console session cookie on ``response``; also used outside the
    console blueprint (the sign-up confirmation signs the new account in)."""
    response.set_cookie(COOKIE, _serializer().dumps(session_token), max_age=console_svc.idle_seconds(),
                        httponly=True, samesite="Lax", secure=_secure(), path="/")
    return response


def safe_next(target: str | None) -> str:
    """A local path to go to after sign-in (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return url_for("console.dashboard")
    parts = urlsplit(target)
    return parts.path + (("?" + parts.query) if parts.query else "") if not parts.netloc else url_for(
        "console.dashboard")


def login_redirect():
    nxt = request.full_path.rstrip("?") if request.method == "GET" else None
    return redirect(url_for("console.login", next=nxt) if nxt else url_for("console.login"), code=303)


def form_number(text: str) -> float | str:
    """A form's number field as the JSON API takes it (a JSON number, not a string): the
    float ``text`` spells, or ``text`` itself when it spells none, for the schema to refuse
    with its own message."""
    try:
        return float(text)
    except ValueError:
        return text


def load_form(schema, data: dict, *, rename: dict | None = None) -> tuple[dict | None, dict]:
    """A console form's values loaded with the JSON API's request schema, so the console
    takes the one input policy (``app.blueprints.fields``: no control characters, bounded
    lengths, mail-header safety) and the same field rules. Returns ``(loaded, {})`` or
    ``(None, {form field: message})``; ``rename`` maps schema fields to the form's names,
    schema-wide errors go to ``_form``."""
    from marshmallow import ValidationError

    try:
        return schema.load(data), {}
    except ValidationError as exc:
        errors = {}
        for name, messages in exc.normalized_messages().items():
            text = " ".join(str(m) for m in messages) if isinstance(messages, list) else str(messages)
            key = "_form" if name == "_schema" else (rename or {}).get(name, name)
            errors[key] = f"{errors[key]} {text}" if key in errors else text
        return None, errors


def page(template: str, status: int, ctx: dict, extra: dict):
    """A console page of the handlers that render it again with a status and ``extra``
    (the errors, the form echoed back, a secret shown once): the page's defaults ``ctx``
    overridden by ``extra``."""
    return render_template(template, **{**ctx, **extra}), status


def forbidden_page(message: str):
    return render_template("console/message.html", title="Refused", message=message), 403
