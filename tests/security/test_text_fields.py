"""Control characters on every text field (finding 7): the OpenAPI document is read, and
for every string field of every request body (JSON and form), query string and header it
lists, a value with NUL, a line break or an escape is refused with 400 naming the field,
so a new field cannot miss the input policy. Text lengths are bounded on every field."""
from __future__ import annotations

import pytest

from app import create_app
from app.blueprints.fields import QUERY_MAX, TEXT_MAX
from tests.agentkit import Keypair, register, session_headers
from tests.support.errors import error_message

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
    if name in MULTILINE_OK and value == "a\nb":
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
