"""Control characters on every text field (finding 7): the OpenAPI document is read, and
for every string field of every request body (JSON and form), query string and header it
lists, a value with NUL, a line break or an escape is refused with 400 naming the field,
so a new field cannot miss the input policy. Text lengths are bounded on every field.
Path parameters (issue 42 item 4) take the same rule: such a segment matches no route,
a 404 on every operation, never a 500 (PostgreSQL cannot store NUL)."""
from __future__ import annotations

import pytest

from app import create_app
from app.blueprints.console import PAGE_PREFIXES
from app.blueprints.fields import _CTRL_MULTILINE, QUERY_MAX, TEXT_MAX
from tests.agentkit import Keypair, register, session_headers
from tests.support.errors import error_code, error_message

VALUES = ["a\x00b", "a\nb", "a\x1b[31mb", "a\x7fb", "a\x85b"]
MULTILINE_OK = {"message", "description", "notes", "reason"}  # documented multi-line fields


def _resolve(spec, schema):
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _string_fields():
    spec = create_app({"TESTING": True}).test_client().get("/openapi.json").get_json()
    out = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if not isinstance(op, dict):
                continue
            for ctype, content in op.get("requestBody", {}).get("content", {}).items():
                props = _resolve(spec, content["schema"]).get("properties", {})
                for name, prop in props.items():
                    if "string" in (prop.get("type") if isinstance(prop.get("type"), list) else [prop.get("type")]):
                        out.append((method, path, ctype, name, prop))
            for param in op.get("parameters", []):
                if param.get("in") in ("query", "header") and param.get("schema", {}).get("type") == "string":
                    out.append((method, path, param["in"], param["name"], param["schema"]))
    return out


FIELDS = _string_fields()


def _path_params():
    spec = create_app({"TESTING": True}).test_client().get("/openapi.json").get_json()
    out = []
    for path, ops in spec["paths"].items():
        shared = ops.get("parameters", [])
        for method, op in ops.items():
            if isinstance(op, dict) and method != "parameters":
                for param in shared + op.get("parameters", []):
                    if param.get("in") == "path":
                        out.append((method, path, param["name"], param["schema"]))
    return out


PATH_PARAMS = _path_params()


def test_the_spec_has_the_fields():
    assert len(FIELDS) > 40 and ("post", "/api/contact", "application/json", "name") in \
        [f[:4] for f in FIELDS]


def _headers(client, make_account, path):
    """An admin key with every scope, or an agent session for the agent routes."""
    owner = make_account(admin=True)
    if path.startswith("/api/agent/") and not path.endswith(("/nonce", "/signin", "/register")):
        kp = Keypair()
        register(client, owner, kp, webhook="http://127.0.0.1:9/agent")
        return session_headers(client, kp)
    return dict(owner.headers)


def _send(client, method, path, where, name, value, headers):
    url = path.replace("{", "").replace("}", "")  # path parameters: any placeholder value
    if where == "application/json":
        return client.open(url, method=method, json={name: value}, headers=headers)
    if where == "application/x-www-form-urlencoded":
        return client.open(url, method=method, data={name: value}, headers=headers)
    if where == "query":
        return client.open(url, method=method, query_string={name: value}, headers=headers)
    headers[name] = value.encode("utf-8").decode("latin-1")
    return client.open(url, method=method, headers=headers)


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("method,path,where,name,prop", FIELDS, ids=[f"{f[0]} {f[1]} {f[3]}" for f in FIELDS])
def test_control_characters_refused(client, make_account, method, path, where, name, prop, value):
    multiline = name in MULTILINE_OK or (prop.get("not") or {}).get("pattern") == f"[{_CTRL_MULTILINE}]"
    if multiline and value == "a\nb":
        pytest.skip("line breaks are allowed in documented multi-line fields")
    if where == "header" and "\n" in value:
        pytest.skip("a header cannot carry a raw line break")
    r = _send(client, method, path, where, name, value, _headers(client, make_account, path))
    assert r.status_code == 400, (r.status_code, r.data[:300])
    message = error_message(r.get_json())
    assert name in message, message
    if "enum" not in prop:
        assert "control characters" in message or "=?" in message, message


@pytest.mark.parametrize("method,path,where,name,prop", FIELDS, ids=[f"{f[0]} {f[1]} {f[3]}" for f in FIELDS])
def test_every_text_field_is_bounded(method, path, where, name, prop):
    limit = {"query": QUERY_MAX, "header": 8000}.get(where, TEXT_MAX * 5)
    assert "enum" in prop or 0 < prop.get("maxLength", 0) <= limit, prop


def test_the_spec_has_the_path_parameters():
    assert ("get", "/api/modules/{slug}", "slug") in [p[:3] for p in PATH_PARAMS]
    assert len(PATH_PARAMS) > 15


@pytest.mark.parametrize("method,path,name,schema", PATH_PARAMS, ids=[f"{p[0]} {p[1]} {p[2]}" for p in PATH_PARAMS])
def test_path_parameters_are_bounded_and_published(method, path, name, schema):
    assert schema.get("type") == "string" and 0 < schema.get("maxLength", 0) <= 600, schema
    assert "pattern" in schema or "\\x00" in schema.get("not", {}).get("pattern", ""), schema


@pytest.mark.parametrize("value", ["a\x00b", "a\nb", "a\x85b", "x" * 700])
@pytest.mark.parametrize("method,path,name,schema", PATH_PARAMS, ids=[f"{p[0]} {p[1]} {p[2]}" for p in PATH_PARAMS])
def test_control_characters_in_path_parameters_refused(client, make_account, method, path, name, schema, value):
    from urllib.parse import quote

    url = path.replace("{" + name + "}", quote(value, safe=""))
    url = url.replace("{", "").replace("}", "")  # other parameters: any placeholder value
    r = client.open(url, method=method, json={}, headers=_headers(client, make_account, path))
    assert r.status_code == 404, (r.status_code, r.data[:300])
    if path.startswith(PAGE_PREFIXES):  # a page opened from an e-mail link: its 404 is the HTML page
        assert r.mimetype == "text/html", r.data[:300]
    else:
        assert error_code(r.get_json()) == "not_found"


@pytest.mark.parametrize("url", ["/api/modules/a%00b", "/pay/sandbox/checkout/cs_%00", "/keys/a%00b/revoke",
                                 "/unsubscribe/a%00b"])
def test_the_reported_urls(client, account, url):
    r = client.open(url, method="POST" if url.startswith("/keys") else "GET", headers=account.headers)
    if url.startswith(PAGE_PREFIXES):  # documented as an HTML page, 404 included
        assert r.status_code == 404 and r.mimetype == "text/html", r.data[:200]
        return
    assert r.status_code == 404 and "control characters" in r.get_json()["message"], r.data[:200]
