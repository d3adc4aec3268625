"""The route helper: one decorator declares an endpoint of a blueprint — its rule and
method, who may call it (scopes / admin, or public), the request schema (body or query),
the success schema and the documented error statuses — and registers it as a
flask-smorest ``MethodView``. Route functions stay thin: read the principal, call a
service, return what the service returns (the schema dumps it).
"""
from __future__ import annotations

import inspect
from functools import wraps
from typing import Callable

from flask import g, make_response, request
from flask.views import MethodView

from app import ratelimits
from app.auth import authenticated, principal
from app.auth import public as public_route
from app.errors import ErrorSchema, InvalidRequest
from app.services.orgs import audit, orgs

# flask-smorest's named error responses, by status
_RESPONSES = {400: "BAD_REQUEST", 401: "UNAUTHORIZED", 402: "PAYMENT_REQUIRED", 403: "FORBIDDEN",
              404: "NOT_FOUND", 409: "CONFLICT", 413: "DEFAULT_ERROR", 422: "UNPROCESSABLE_ENTITY",
              429: "TOO_MANY_REQUESTS",
              502: "DEFAULT_ERROR"}


# The 404 of a route taking ``org_id`` for an organisation the caller is not a member of.
NOT_MEMBER = "`org_id` is not an organisation of the caller."


def acting_account(org_id: str | None, *scopes: str) -> str:
    """The account a request with an optional ``org_id`` acts on: the credential's own, or
    the organisation ``org_id`` when the caller's role there allows ``scopes``
    (``orgs.payer``: 403 ``org_role_required``; not a member: 404)."""
    return orgs.payer(principal(), org_id, scopes)


def document_errors(blp, errors: dict, *, schema=None) -> Callable:
    """Decorator documenting a route's error statuses: ``{status: description}`` where a
    description is None, a text, or ``(text, headers)``. A response with a text or headers
    is declared inline (``schema``, by default ``ErrorSchema``: flask-smorest drops both from
    a named response); one with neither as flask-smorest's named response."""
    def decorator(view: Callable) -> Callable:
        for code, text in reversed(list(errors.items())):
            text, headers = text if isinstance(text, tuple) else (text, None)
            if schema is not None or text or headers:
                kw = {"schema": schema if schema is not None else ErrorSchema}
            else:
                kw = {"response": _RESPONSES[code]}
            kw.update({"description": text} if text else {}, **({"headers": headers} if headers else {}))
            view = blp.alt_response(code, **kw)(view)
        return view

    return decorator


def link(path: str, method: str, description: str, **parameters: str) -> dict:
    """An OpenAPI link (for ``endpoint(links=…)``) to the operation ``method`` of the
    documented ``path`` (``/api/keys/{key_id}``), its parameters given by runtime
    expressions (``key_id="$response.body#/id"``)."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    return {"operationRef": f"#/paths/{pointer}/{method}", "parameters": parameters,
            "description": description}


def _json_if_present(view: Callable) -> Callable:
    """An optional body may be omitted, but a body that is sent must be JSON: webargs
    would ignore one under another media type and run the action as if none came. Answered
    400 like a required body under another media type (no new status to document)."""
    @wraps(view)
    def checked(*args, **kwargs):
        if request.content_length or request.headers.get("Transfer-Encoding"):
            if not request.is_json:
                raise InvalidRequest("The request body must be JSON (Content-Type: application/json) or omitted.")
        return view(*args, **kwargs)
    return checked


IDEMPOTENT_REPLAY_HEADERS = {
    "Idempotent-Replayed": {"description": "`true` when this is the stored first answer of the "
                                           "`Idempotency-Key` (nothing happened again).",
                            "schema": {"type": "string", "enum": ["true"]}}}
IDEMPOTENCY_CONFLICTS = ("`idempotency_key_reused`: the Idempotency-Key was used with another request; "
                         "`idempotency_key_in_use`: a request with it is still in flight.")


def _idempotent(view: Callable, func: Callable, status: int) -> Callable:
    """Stripe's ``Idempotency-Key`` semantics around a dumped response
    (``services.platform.idempotency``): the first request with a key runs and its answer is
    stored; the same key with the same body answers that (``Idempotent-Replayed: true``),
    with another body 409. A failed request releases the key."""
    from app.auth import principal
    from app.services.platform import idempotency

    takes_key = "idempotency_key" in inspect.signature(func).parameters

    @wraps(view)
    def wrapper(*args, **kwargs):
        key = kwargs.get("idempotency_key") if takes_key else kwargs.pop("idempotency_key", None)
        if key is None:
            return view(*args, **kwargs)
        p = principal()
        body = next((a for a in args if isinstance(a, dict)), None)  # the loaded body (after self)
        req_hash = idempotency.request_hash(f"{request.method} {request.path}", p.mode, body)
        stored = idempotency.claim(p.account_id, key, req_hash)
        if stored is not None:
            resp = make_response(stored, status)
            resp.headers.update({"Content-Type": "application/json", "Idempotent-Replayed": "true"})
            return resp
        try:
            resp = view(*args, **kwargs)
        except BaseException:
            idempotency.release(p.account_id, key)
            raise
        if 200 <= resp.status_code < 300:
            idempotency.complete(p.account_id, key, resp.get_data(as_text=True))
        else:
            idempotency.release(p.account_id, key)
        return resp
    return wrapper


def _with_not_member(text):
    """A route taking ``org_id`` answers 404 for one the caller is not a member of
    (``acting_account``): its documented 404 says so."""
    if isinstance(text, tuple) or (text and "`org_id`" in text):
        return text
    return f"{text.rstrip('.')}; or {NOT_MEMBER}" if text else NOT_MEMBER


def endpoint(blp, rule: str, method: str, *scopes: str, ok=None, status: int = 200, body=None,
             query=None, errors: dict[int, str | None] | None = None, admin: bool = False,
             public: bool = False, ip_limit: str | None = None, email_limit: str | None = None,
             name: str | None = None, body_optional: bool = False, headers=None,
             links: dict | None = None, idempotent: bool = False) -> Callable:
    """Register the decorated function as ``method`` on ``rule`` of ``blp``.

    ``scopes``/``admin``: required by ``@authenticated`` (``public``: no credential).
    ``body`` / ``query``: the request schema (the function receives the loaded data first,
    then the rule's path values; ``body_optional``: the body may be omitted, documented as
    not required). ``headers``: a request-headers schema, validated first and passed as
    keyword arguments. ``ok``: the response schema of ``status``. ``errors``:
    documented error statuses with an optional description. ``ip_limit`` /
    ``email_limit``: names of config rate limits (``app.ratelimits``; a 429 is documented
    by ``@authenticated`` or here). ``name``: the view's
    class name (default: the function name in CamelCase + ``View``). ``links``: OpenAPI
    links of the ``status`` response (name: link object), e.g. from a created resource's
    id to the operations that take it (clients and schemathesis' stateful phase follow them).
    ``idempotent``: the route honours ``Idempotency-Key`` (its ``headers`` schema declares
    it, ``fields.idempotency_key_header``) with Stripe's semantics (``_idempotent``); 409 and
    the replay header are documented.
    """
    def decorator(func: Callable) -> Callable:
        @wraps(func)
        def handler(self, *args, **kwargs):
            if public:
                return func(*args, **kwargs)
            # who acts, for the audit log of any change the route makes (services.orgs.audit)
            with audit.acting(audit.actor_of(principal(), g.get("request_id"), request.remote_addr)):
                return func(*args, **kwargs)

        errors_doc = dict(errors or {})
        if any("org_id" in getattr(schema, "_declared_fields", {}) for schema in (body, query)):
            errors_doc[404] = _with_not_member(errors_doc[404] or "No such resource" if 404 in errors_doc else None)
        if idempotent:
            errors_doc[409] = " ".join(filter(None, (errors_doc.get(409), IDEMPOTENCY_CONFLICTS)))
        view = document_errors(blp, errors_doc)(handler)
        if (ip_limit or email_limit) and public and 429 not in (errors or {}):
            view = blp.alt_response(429, response=_RESPONSES[429])(view)
        view = blp.response(status, ok, headers=IDEMPOTENT_REPLAY_HEADERS if idempotent else None)(view)
        if idempotent:
            view = _idempotent(view, func, status)
        if links:
            view = blp.doc(responses={status: {"links": links}})(view)
        if email_limit:  # counted once the body is valid: a refused request uses none of it
            view = ratelimits.per_email(email_limit)(view)
        if body is not None:
            view = blp.arguments(body, required=not body_optional)(view)
            if body_optional:
                view = _json_if_present(view)
        if query is not None:
            view = blp.arguments(query, location="query")(view)
        if headers is not None:
            view = blp.arguments(headers, location="headers", as_kwargs=True)(view)
        if ip_limit:
            view = ratelimits.per_ip(ip_limit)(view)
        view = public_route(view) if public else authenticated(*scopes, admin=admin)(view)
        view_name = name or "".join(part.title() for part in func.__name__.split("_")) + "View"
        blp.route(rule)(type(view_name, (MethodView,), {method: view, "__doc__": func.__doc__}))
        return func

    return decorator
