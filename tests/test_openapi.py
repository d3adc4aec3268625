"""The OpenAPI 3.1 document is valid and covers every route."""
from __future__ import annotations

import re

from openapi_spec_validator import validate

# Routes that serve the documentation itself.
_DOC_ENDPOINTS = {"api-docs.openapi_json", "api-docs.openapi_swagger_ui", "docs_assets.swagger_assets"}
# The browser console (HTML pages for people, not the JSON API): deliberately left out.
_CONSOLE = "console."


def _spec(client):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return r.get_json()


def test_document_is_valid_openapi_31(client):
    spec = _spec(client)
    assert spec["openapi"] == "3.1.0" and spec["info"]["version"] == "1.0.0"
    validate(spec)
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"


def test_every_route_is_documented(app, client):
    spec = _spec(client)
    for rule in app.url_map.iter_rules():
        if rule.endpoint in _DOC_ENDPOINTS or rule.endpoint.startswith(_CONSOLE):
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        assert path in spec["paths"], f"{rule.rule} missing from /openapi.json"
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert method.lower() in spec["paths"][path], f"{method} {rule.rule} undocumented"


def test_security_and_errors_documented(client):
    spec = _spec(client)
    op = spec["paths"]["/api/keys"]["post"]
    assert op["security"] == [{"bearerAuth": ["keys:write"]}]
    assert {"400", "401", "403", "429"} <= set(op["responses"])
    assert "x-error-codes" in spec and "payment_required" in spec["x-error-codes"]


def test_the_messages_api_documents_its_x_api_key_credential(client):
    """``POST /v1/messages`` authenticates with Anthropic's ``x-api-key`` header as well as
    the bearer (what the ``anthropic`` SDK sends): the document says so, as an alternative."""
    spec = _spec(client)
    scheme = spec["components"]["securitySchemes"]["anthropicApiKey"]
    assert scheme == {**scheme, "type": "apiKey", "in": "header", "name": "x-api-key"}
    assert spec["paths"]["/v1/messages"]["post"]["security"] == [
        {"bearerAuth": ["call:write"]}, {"anthropicApiKey": ["call:write"]}]
    assert spec["paths"]["/v1/chat/completions"]["post"]["security"] == [{"bearerAuth": ["call:write"]}]


def test_docs_page_renders(client):
    r = client.get("/docs")
    assert r.status_code == 200 and b"swagger" in r.data.lower()
    assert client.get("/docs/assets/swagger-ui-bundle.js").status_code == 200


def _arrays_in_unions_without_items(node, path="#"):
    """Paths of union members (a ``type`` list or an ``anyOf``/``oneOf`` branch) that are
    arrays without ``items``: openapi-python-client cannot type them ("Invalid property in
    union") and drops the whole operation (issue 39: POST /v1/chat/completions was missing)."""
    out = []
    if isinstance(node, dict):
        types = node.get("type")
        if isinstance(types, list) and "array" in types and len(types) > 1 and "items" not in node:
            out.append(path)
        for key in ("anyOf", "oneOf"):
            for i, branch in enumerate(node.get(key) or []):
                if isinstance(branch, dict) and branch.get("type") == "array" and "items" not in branch:
                    out.append(f"{path}/{key}/{i}")
        for k, v in node.items():
            out.extend(_arrays_in_unions_without_items(v, f"{path}/{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_arrays_in_unions_without_items(v, f"{path}/{i}"))
    return out


def test_client_generators_can_type_every_union(client):
    spec = _spec(client)
    assert _arrays_in_unions_without_items(spec) == []
    for path in ("/v1/chat/completions", "/v1/messages"):
        assert "post" in spec["paths"][path]


def test_a_required_json_body_requires_something(client):
    """webargs reads a request without a body as ``{}``: a body documented as required whose
    schema requires nothing (no ``required``, ``anyOf`` or ``minProperties``) would be
    accepted without one, against the document (schemathesis ST201 on
    ``PUT /api/account/billing-details``). Such a body is documented optional
    (``endpoint(body_optional=True)``), so that the document says what the service takes."""
    spec = _spec(client)
    schemas = spec["components"]["schemas"]
    unsaid = []
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            body = op.get("requestBody") if isinstance(op, dict) else None
            ref = ((body or {}).get("content", {}).get("application/json") or {}).get("schema", {}).get("$ref")
            if not (body and body.get("required") and ref):
                continue
            schema = schemas[ref.rsplit("/", 1)[-1]]
            if not any(schema.get(k) for k in ("required", "anyOf", "oneOf", "minProperties")):
                unsaid.append(f"{method.upper()} {path}")
    assert unsaid == []
