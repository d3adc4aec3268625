"""The metered call's thin entry: a WSGI layer in front of Flask that answers the common
``POST /v1/module/<slug>/call`` itself, with the same checks, services and rendering as
the Flask route (``routes.ModuleCallView``), without Flask's per-request machinery.

Why: a GIL-only profile of the metered call put about a third of the worker's CPU in
Flask/werkzeug's request context, dispatch, webargs and the ``after_request`` chain
(docs/performance.md, "The metered call's thin entry"). This layer does the same work
for the one hot route in a few function calls.

What it does, in the Flask route's order (each step is the function the Flask path
calls too, so there is one implementation of each):

1. Assign the request id (``requestid.request_id_for``) in an app context (``g``,
   ``current_app``; popping it returns the hot-path connection and the session, the
   same teardown as a Flask request).
2. Authenticate the bearer credential (``auth.authenticate``: 401) and check the scope
   ``call:write`` (``auth.check_scopes``: 403).
3. Load the headers and the JSON body with the route's schemas' fast loaders
   (``ModuleCallHeadersSchema.fast_load`` / ``ModuleCallRequestSchema.fast_load``).
4. Count the plan rate limit (``ratelimits.per_credential``: 429).
5. ``gateway.calls.call`` — the service the route calls.
6. Render the answer (or the ``DomainError`` / unexpected error through
   ``app.errors``' handlers), add ``X-Request-Id`` and ``RateLimit-*``
   (``requestid.echo``), log the access line (``logs.access``) and count the request
   (``metrics.observe_request``) with the route's own rule as label.

It steps aside, handing the request untouched to Flask (which then answers it, errors
included, exactly as before), whenever the request is not the plain case: another
method or path, a body that is not ``application/json`` with a ``Content-Length`` within
``MAX_CONTENT_LENGTH``, JSON the fast loaders decline (Flask's schemas then produce the
400), an ``X-Payment`` / ``PAYMENT-SIGNATURE`` header (the x402 flow). It steps aside
only before anything is counted or written, so no request is counted twice. It is not
installed at all when tracing is on (the Flask route carries the server span) or when
``HOT_PATH`` is off. Parity: ``tests/test_hotpath.py`` sends the same requests through
both entries and compares status, headers, body, log line and metrics.
"""
from __future__ import annotations

import io
import re
import time

import orjson

from app import auth, logs, metrics, ratelimits, requestid
from app.errors import DomainError, handle_domain_error, handle_unexpected
from app.services.gateway.catalog import SLUG_RE

ENDPOINT = "modules.ModuleCallView"
SCOPES = ("call:write",)
# The slugs the catalog can hold (``catalog.SLUG_RE``); any other path goes to Flask.
_PATH = re.compile(r"/v1/module/(" + SLUG_RE.pattern.strip("^$") + ")/call")
# The request headers the headers schema's fast loader reads (WSGI name: HTTP name),
# passed as werkzeug's ``EnvironHeaders`` would give them (the WSGI value as is).
_HEADER_NAMES = {"HTTP_IDEMPOTENCY_KEY": "Idempotency-Key"}
_PAYMENT_HEADERS = ("HTTP_X_PAYMENT", "HTTP_PAYMENT_SIGNATURE")


class HotPath:
    """WSGI middleware: ``HotPath(app, app.wsgi_app)``; see the module docstring."""

    def __init__(self, app, wsgi_app):
        from app.blueprints.gateway.schemas import ModuleCallHeadersSchema, ModuleCallRequestSchema

        self.app = app
        self.wsgi_app = wsgi_app
        self.max_body = app.config.get("MAX_CONTENT_LENGTH") or 0
        self.load_headers = ModuleCallHeadersSchema().fast_load
        self.load_body = ModuleCallRequestSchema().fast_load
        self.route = next(r.rule for r in app.url_map.iter_rules() if r.endpoint == ENDPOINT)

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") == "POST":
            m = _PATH.fullmatch(environ.get("PATH_INFO", ""))
            if m is not None and _plain(environ, self.max_body):
                return self._call(m.group(1), environ, start_response)
        return self.wsgi_app(environ, start_response)

    def _call(self, slug, environ, start_response):
        started = time.perf_counter()
        raw = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        ctx = self.app.app_context()
        ctx.push()
        error = None
        try:
            answer = self._answer(slug, raw, environ)
            if answer is not None:
                self._finish(environ, answer[0], started)
        except BaseException as exc:  # popped with the error, as Flask's teardown sees it
            error = exc
            raise
        finally:
            ctx.pop(error)
        if answer is None:  # not the plain case: Flask answers it, the body put back
            environ["wsgi.input"] = io.BytesIO(raw)
            return self.wsgi_app(environ, start_response)
        status, headers, body = answer
        start_response(status, headers)
        return [body]

    def _answer(self, slug, raw, environ):
        """(status line, headers, body), or None to hand the request to Flask."""
        from flask import g

        from app.services.gateway import calls as gateway

        g.request_id = requestid.request_id_for(environ.get("HTTP_X_REQUEST_ID"))
        try:
            principal = auth.authenticate(auth.parse_bearer(environ.get("HTTP_AUTHORIZATION")))
            g.principal, g.account_id = principal, principal.account_id
            auth.check_scopes(principal, SCOPES)
            args = self._arguments(raw, environ)
            if args is None:
                return None
            body, idempotency_key = args
            ratelimits.per_credential(principal)
            res = gateway.call(account_id=principal.account_id, mode=principal.mode, slug=slug,
                               body=body, idempotency_key=idempotency_key, payment=None,
                               request_id=g.request_id, key_id=auth.key_of(principal))
        except DomainError as err:
            return self._render(handle_domain_error(err))
        except Exception as err:  # noqa: BLE001 - rendered as Flask renders it: 500, logged
            return self._render(handle_unexpected(err))
        headers = {"Content-Type": "application/json", "Content-Length": str(len(res.body))}
        if res.replayed:
            headers["Idempotent-Replayed"] = "true"
        headers.update(res.headers)
        requestid.echo(headers)
        return "200 OK", list(headers.items()), res.body

    def _arguments(self, raw, environ):
        """(body, Idempotency-Key) when the fast loaders accept them, else None."""
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        body = self.load_body(doc)
        if body is None:
            return None
        headers = {name: environ[var] for var, name in _HEADER_NAMES.items() if var in environ}
        loaded = self.load_headers(headers)
        if loaded is None:
            return None
        return body, loaded.get("idempotency_key")

    @staticmethod
    def _render(resp):
        """An error response of ``app.errors`` as (status line, headers, body)."""
        requestid.echo(resp.headers)
        return resp.status, resp.headers.to_wsgi_list(), resp.get_data()

    def _finish(self, environ, status_line, started):
        status = int(status_line[:3])
        elapsed = time.perf_counter() - started
        logs.access("POST", self.route, environ.get("PATH_INFO", ""), status, elapsed,
                    environ.get("REMOTE_ADDR"))
        metrics.observe_request("POST", self.route, status, elapsed)


def _plain(environ, max_body: int) -> bool:
    """A JSON body with a Content-Length within the limit and no x402 payment header:
    the only requests this entry answers."""
    ctype = environ.get("CONTENT_TYPE", "")
    if ctype != "application/json" and ctype.partition(";")[0].strip().lower() != "application/json":
        return False
    length = environ.get("CONTENT_LENGTH", "")
    if not length.isdigit() or not 0 < int(length) <= max_body or "HTTP_TRANSFER_ENCODING" in environ:
        return False
    return not any(h in environ for h in _PAYMENT_HEADERS)


def install(app) -> None:
    """Put the thin entry in front of ``app.wsgi_app`` (``create_app``, before ProxyFix so
    it sees the client address ProxyFix sets), unless ``HOT_PATH`` is off, tracing is on
    or the app matches hosts (``SERVER_NAME``)."""
    from app import telemetry

    if not app.config.get("HOT_PATH", True) or telemetry.enabled() or app.config.get("SERVER_NAME"):
        return
    app.wsgi_app = HotPath(app, app.wsgi_app)
