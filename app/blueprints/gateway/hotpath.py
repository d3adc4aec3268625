"""The hot routes' thin entry: a WSGI layer in front of Flask that answers the common
``POST /v1/module/<slug>/call`` and the non-streaming ``POST /v1/chat/completions``
itself, with the same checks, services and rendering as the Flask routes
(``routes.ModuleCallView``, ``chat.routes.ChatCompletionsView``), without Flask's
per-request machinery.

Why: a GIL-only profile of the metered call put about a third of the worker's CPU in
Flask/werkzeug's request context, dispatch, webargs and the ``after_request`` chain
(bench/DIARY.md, "What is left": "What the thin entry bought"); the chat completion's profile
showed the same share outside its view. This layer does the same work for the two hot
routes in a few function calls.

What it does, in the Flask routes' order (each step is the function the Flask path calls
too, so there is one implementation of each):

1. Assign the request id (``requestid.request_id_for``) in an app context (``g``,
   ``current_app``; popping it returns the hot-path connection and the session, the
   same teardown as a Flask request).
2. Authenticate the bearer credential (``auth.authenticate``: 401) and check the scope
   ``call:write`` (``auth.check_scopes``: 403).
3. Load the body (and the module call's headers) with the routes' fast loaders
   (``ModuleCallHeadersSchema.fast_load`` / ``ModuleCallRequestSchema.fast_load``;
   ``chat.schemas.plain_chat_request``).
4. Count the plan rate limit (``ratelimits.per_credential``: 429).
5. The service the route calls: ``gateway.calls.call`` / ``chat.completions.create_completion``.
6. Render the answer (or the ``DomainError`` / unexpected error through
   ``app.errors``' handlers), add ``X-Request-Id`` and ``RateLimit-*``
   (``requestid.echo``); once the server has written the answer (the response
   iterable's ``close()``, which every WSGI server calls), log the access line
   (``logs.access``) and count the request (``metrics.observe_request``) with the route's
   own rule as label: the caller does not wait for either.

It steps aside, handing the request untouched to Flask (which then answers it, errors
included), whenever the request is not the plain case: another method or path, a body
that is not ``application/json`` with a ``Content-Length`` within ``MAX_CONTENT_LENGTH``,
JSON the fast loaders decline (Flask's schemas then word the 400), an ``X-Payment`` /
``PAYMENT-SIGNATURE`` header (the x402 flow), a chat request with ``stream`` (Flask relays
the event stream), with an ``Origin`` while ``CHAT_CORS_ORIGINS`` is set (Flask adds the
CORS headers) or off the chat host (``CHAT_HOST``: Flask's 404). It steps aside only
before anything is counted or written, so no request is counted twice.

One entry per case: this layer is always installed (no switch), so the plain case of the
two routes is served here and only here, in tests as in production; Flask serves the other
cases. With tracing on (``app.telemetry``) it opens the request's server span itself, as
the Flask instrumentation does for the routes Flask serves. Why not Flask alone: the same
plain metered call costs ~0.5 ms more of the worker's CPU through Flask (docs/decisions.md
§ "The hot routes' one entry"). Tests: ``tests/test_hotpath.py``.
"""
from __future__ import annotations

import io
import re
import time

import orjson
from flask import g
from werkzeug.sansio.utils import get_host

from app import auth, jsonutil, logs, metrics, ratelimits, requestid, telemetry
from app.chathost import error_style, on_chat_host
from app.errors import DomainError, handle_domain_error, handle_unexpected
from app.services.gateway.catalog import SLUG_RE

ENDPOINT = "modules.ModuleCallView"
CHAT_ENDPOINT = "chat.ChatCompletionsView"
CHAT_PATH = "/v1/chat/completions"
SCOPES = ("call:write",)  # both routes' scope
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
        rules = {r.endpoint: r.rule for r in app.url_map.iter_rules()}
        self.route = rules[ENDPOINT]
        self.chat_route = rules.get(CHAT_ENDPOINT)  # None: no chat routes in this app

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") == "POST" and _plain(environ, self.max_body):
            path = environ.get("PATH_INFO", "")
            if path == CHAT_PATH:
                # off the chat host Flask answers 404 before authenticating: so does it here,
                # with the host as Flask reads it (werkzeug's get_host: "" for a malformed
                # Host header, e.g. a port out of range, and for none: then Flask decides)
                host = get_host(environ.get("wsgi.url_scheme", "http"), environ.get("HTTP_HOST"))
                # a browser's request (Origin) when CORS is on: Flask adds the CORS headers
                cors = "HTTP_ORIGIN" in environ and self.app.config.get("CHAT_CORS_ORIGINS")
                if self.chat_route is not None and not cors and on_chat_host(host, self.app.config.get("CHAT_HOST")):
                    style = error_style(path, host, self.app.config.get("CHAT_HOST"))  # OpenAI's
                    return self._call(self._chat, self.chat_route, None, environ, start_response, style)
            else:
                m = _PATH.fullmatch(path)
                if m is not None:
                    return self._call(self._module_call, self.route, m.group(1), environ, start_response,
                                      "gateway")
        return self.wsgi_app(environ, start_response)

    def _call(self, handler, route, arg, environ, start_response, style):
        with telemetry.server_span(environ, route) as span:
            status, headers, body, logged = self._serve(handler, route, arg, environ, style)
            if span is not None:  # (handed to Flask: Flask's own span follows this short one)
                telemetry.server_status(span, status, headers) if status else \
                    span.set_attribute("gateway.handed_to_flask", True)
        if status is None:  # not the plain case: Flask answers it, the body put back
            environ["wsgi.input"] = io.BytesIO(body)
            return self.wsgi_app(environ, start_response)
        start_response(status, headers)
        return _Answer(body, logged)

    def _serve(self, handler, route, arg, environ, style):
        """(status line, headers, body, the access line's arguments), or (None, None, the
        body read, None) for Flask."""
        started = time.perf_counter()
        raw = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
        ctx = self.app.app_context()
        ctx.push()
        # what Flask's request would give: the start time (metrics.request_elapsed) and the
        # error convention app.errors renders in (app.chathost.error_style, as for Flask)
        g.request_started, g.error_style = started, style
        error = None
        try:
            answer = self._answer(handler, arg, raw, environ)
            # what the access line says, read while the request's ids are in ``g``
            logged = None if answer is None else (
                route, environ.get("PATH_INFO", ""), int(answer[0][:3]), time.perf_counter() - started,
                environ.get("REMOTE_ADDR"), logs.context_ids())
        except BaseException as exc:  # popped with the error, as Flask's teardown sees it
            error = exc
            raise
        finally:
            ctx.pop(error)
        return (None, None, raw, None) if answer is None else (*answer, logged)

    def _answer(self, handler, arg, raw, environ):
        """(status line, headers, body), or None to hand the request to Flask: the request
        id, the credential and the scope (both routes), then the route's ``handler``."""
        g.request_id = requestid.request_id_for(environ.get("HTTP_X_REQUEST_ID"))
        try:
            principal = auth.authenticate(auth.parse_bearer(environ.get("HTTP_AUTHORIZATION")))
            g.principal, g.account_id = principal, principal.account_id
            auth.check_scopes(principal, SCOPES)
            answer = handler(principal, arg, raw, environ)
        except DomainError as err:
            return self._render(handle_domain_error(err))
        except Exception as err:  # noqa: BLE001 - rendered as Flask renders it: 500, logged
            return self._render(handle_unexpected(err))
        if answer is None:
            return None
        headers, body = answer
        requestid.echo(headers)
        return "200 OK", list(headers.items()), body

    def _module_call(self, principal, slug, raw, environ):
        """``POST /v1/module/<slug>/call``: (headers, body), or None for Flask."""
        from app.services.gateway import calls as gateway

        args = self._arguments(raw, environ)
        if args is None:
            return None
        body, idempotency_key = args
        ratelimits.per_credential(principal)
        res = gateway.call(account_id=principal.account_id, mode=principal.mode, slug=slug,
                           body=body, idempotency_key=idempotency_key, payment=None,
                           request_id=g.request_id, key_id=auth.key_of(principal),
                           actor=principal.credential_id, controls=auth.controls_of(principal),
                           actor_account=auth.person_of(principal))
        headers = {"Content-Type": "application/json", "Content-Length": str(len(res.body))}
        if res.replayed:
            headers["Idempotent-Replayed"] = "true"
        headers.update(res.headers)
        return headers, res.body

    def _chat(self, principal, _arg, raw, environ):
        """``POST /v1/chat/completions`` on the chat host without ``stream`` (a stream is
        relayed by Flask): (headers, body), or None for Flask."""
        from app.blueprints.chat.schemas import plain_chat_request
        from app.services.chat import completions as chat

        try:
            body = plain_chat_request(jsonutil.loads(raw))
        except orjson.JSONDecodeError:
            return None
        if body is None or body.get("stream"):
            return None
        ratelimits.per_credential(principal)
        result = chat.create_completion(principal.account_id, principal.mode, body,
                                        key_id=auth.key_of(principal),
                                        actor=principal.credential_id, controls=auth.controls_of(principal),
                                        byok=bool(principal.extra.get("byok")))
        payload = orjson.dumps(result.body)
        headers = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
        headers.update(result.headers)
        return headers, payload

    def _arguments(self, raw, environ):
        """(body, Idempotency-Key) when the fast loaders accept them, else None."""
        try:
            doc = jsonutil.loads(raw)
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


class _Answer:
    """A thin-entry answer: its body, then the access line and the request metrics once
    the server has written it — when it asks the iterable for more after the body, or
    closes it (PEP 3333; whichever comes first, once)."""

    __slots__ = ("body", "logged")

    def __init__(self, body: bytes, logged: tuple | None):
        self.body, self.logged = body, logged

    def __iter__(self):
        yield self.body
        self.close()

    def close(self) -> None:
        if self.logged is None:
            return
        (route, path, status, elapsed, client_ip, ids), self.logged = self.logged, None
        logs.access("POST", route, path, status, elapsed, client_ip, ids=ids)
        metrics.observe_request("POST", route, status, elapsed)


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
    it sees the client address ProxyFix sets)."""
    app.wsgi_app = HotPath(app, app.wsgi_app)
