"""Scope and admin matrix, generated from the OpenAPI document so every route is covered:
a credential lacking a route's scope gets 403 ``insufficient_scope``; a non-admin on an
admin route gets 403 ``forbidden``; no credential gets 401 — before any validation or lookup."""
from __future__ import annotations

import re

import pytest

from app.scopes import ALL_SCOPES
from tests.support.errors import error_code


def _operations(client):
    spec = client.get("/openapi.json").get_json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if method in ("get", "post", "put", "patch", "delete"):
                yield path, method, op


def _url(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "zzz_notAnId0", path)


def _call(client, method, path, headers):
    kwargs = {"headers": headers}
    if method in ("post", "put", "patch"):
        kwargs["json"] = {}
    return getattr(client, method)(_url(path), **kwargs)


def test_every_operation_declares_security(client):
    for path, method, op in _operations(client):
        assert "security" in op, f"{method.upper()} {path} has no security declaration"


def test_missing_credential_is_401(client):
    for path, method, op in _operations(client):
        if not any("bearerAuth" in req for req in op.get("security") or []):
            continue  # public, or guarded by an operator scheme (e.g. /metrics)
        r = _call(client, method, path, {})
        assert r.status_code == 401, (method, path, r.status_code)
        assert error_code(r.get_json()) == "unauthorized"


@pytest.mark.parametrize("scope", ALL_SCOPES)
def test_key_without_scope_is_403(client, make_account, scope):
    acct = make_account(scopes=[s for s in ALL_SCOPES if s != scope])
    checked = 0
    for path, method, op in _operations(client):
        if scope not in (op.get("x-required-scopes") or []):
            continue
        r = _call(client, method, path, acct.headers)
        assert r.status_code == 403, (method, path, r.status_code, r.get_data(as_text=True)[:200])
        assert error_code(r.get_json()) == "insufficient_scope"
        checked += 1


def test_admin_routes_refuse_non_admins(client, make_account):
    acct = make_account()
    for path, method, op in _operations(client):
        if not op.get("x-admin-only"):
            continue
        r = _call(client, method, path, acct.headers)
        assert r.status_code == 403 and error_code(r.get_json()) == "forbidden", (method, path)
