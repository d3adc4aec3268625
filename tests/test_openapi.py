"""The OpenAPI 3.1 document is valid and covers every route."""
from __future__ import annotations

import re

from openapi_spec_validator import validate

from tests.gateway_helpers import mod, provider, provider_server  # noqa: F401 (fixtures)

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


_NAMES_FILE = "app/operation_ids.py"


def _operations(app, spec):
    """(endpoint, METHOD, path, operation) of every documented operation."""
    for rule in app.url_map.iter_rules():
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            operation = spec["paths"].get(path, {}).get(method.lower())
            if operation is not None:
                yield rule.endpoint, method, path, operation


def _unnamed(app, spec) -> list[str]:
    """What a developer who added a route without an ``operationId`` is told."""
    return [f"{method} {path} has no operationId: add ({endpoint!r}, {method!r}): "
            f"'verbObject' to OPERATION_IDS in {_NAMES_FILE} (the naming rule is in its docstring)"
            for endpoint, method, path, operation in _operations(app, spec)
            if "operationId" not in operation]


def test_every_operation_has_a_unique_lower_camel_case_operation_id(app, client):
    """Client generators name their functions after it (``listKeys``, not
    ``get_api_keys``); the names live in ``app/operation_ids.py``."""
    spec = _spec(client)
    assert not _unnamed(app, spec), "\n".join(_unnamed(app, spec))
    methods = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}
    ops = {(m.upper(), path): op for path, item in spec["paths"].items() for m, op in item.items() if m in methods}
    assert not [key for key, op in ops.items() if "operationId" not in op]
    matched = {(method, path) for _, method, path, _ in _operations(app, spec)}
    assert matched == set(ops), {"documented, no route": set(ops) - matched, "route, not documented": matched - set(ops)}
    names = [op["operationId"] for op in ops.values()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for name in names:
        assert re.fullmatch(r"[a-z]+(?:[A-Z0-9][a-z0-9]*)*", name), f"{name}: not lowerCamelCase"


def test_every_operation_id_names_an_operation_of_the_document(app, client):
    """No stale entries: a route removed or renamed takes its name out of the mapping (a
    renamed route keeps its published name under its new endpoint)."""
    from app.operation_ids import OPERATION_IDS

    documented = {(endpoint, method): op["operationId"]
                  for endpoint, method, _, op in _operations(app, _spec(client))
                  if "operationId" in op}
    stale = set(OPERATION_IDS) - set(documented)
    assert not stale, f"entries of OPERATION_IDS in {_NAMES_FILE} without an operation: {sorted(stale)}"
    assert documented == OPERATION_IDS


def test_a_route_added_without_a_name_is_reported_with_where_to_add_it():
    from flask import Flask
    from flask.views import MethodView
    from flask_smorest import Api as SmorestApi
    from flask_smorest import Blueprint as SmorestBlueprint

    from app.extensions import OperationIds

    app = Flask(__name__)
    app.config.update(API_TITLE="t", API_VERSION="1", OPENAPI_VERSION="3.1.0")
    api = SmorestApi(app, spec_kwargs={"extra_plugins": [OperationIds()]})
    blp = SmorestBlueprint("keys", __name__)

    @blp.route("/api/keys")
    class KeysView(MethodView):
        def get(self):
            return {}

    @blp.route("/api/new")
    class NewView(MethodView):
        def post(self):
            return {}

    api.register_blueprint(blp)
    spec = api.spec.to_dict()
    assert spec["paths"]["/api/keys"]["get"]["operationId"] == "listKeys"
    assert _unnamed(app, spec) == [
        "POST /api/new has no operationId: add ('keys.NewView', 'POST'): 'verbObject' to "
        "OPERATION_IDS in app/operation_ids.py (the naming rule is in its docstring)"]


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


def test_count_tokens_is_documented_as_the_messages_request_without_max_tokens(client):
    """``POST /v1/messages/count_tokens`` (the ``anthropic`` SDK's ``messages.count_tokens``):
    the Messages request without ``max_tokens`` and the fields that shape only the answer,
    ``{input_tokens}`` back, the Messages API's credentials and error shape."""
    spec = _spec(client)
    op = spec["paths"]["/v1/messages/count_tokens"]["post"]
    assert op["security"] == spec["paths"]["/v1/messages"]["post"]["security"]
    assert op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CountTokensRequest"}
    schemas = spec["components"]["schemas"]
    request, messages = schemas["CountTokensRequest"], schemas["MessagesRequest"]
    assert set(request["properties"]) == {"model", "messages", "system", "tools", "tool_choice"}
    assert request["required"] == ["messages", "model"]
    for name in request["properties"]:
        assert request["properties"][name] == messages["properties"][name]
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/MessageTokensCount"}
    assert schemas["MessageTokensCount"]["required"] == ["input_tokens"]
    assert {"400", "401", "403", "404", "422", "429"} <= set(op["responses"]) and "402" not in op["responses"]
    for status in ("400", "403", "404", "422"):
        assert op["responses"][status]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/AnthropicError"}


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


# The formats JSON Schema 2020-12 defines (§7.3) and those OpenAPI 3.1 adds for its types.
_JSON_SCHEMA_FORMATS = {
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
    "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
    "json-pointer", "relative-json-pointer", "regex",
    "int32", "int64", "float", "double", "password", "byte", "binary"}


def _formats(node, path="#"):
    if isinstance(node, dict):
        if isinstance(node.get("format"), str) and isinstance(node.get("type"), (str, list)):
            yield path, node["format"]
        for k, v in node.items():
            yield from _formats(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _formats(v, f"{path}/{i}")


def test_every_format_is_one_validators_and_generators_know(client):
    """apispec writes marshmallow's ``Url`` as ``format: url``, which no JSON Schema validator
    or client generator knows (a checkout's ``url`` was typed a bare string, never checked):
    every ``format`` of the document is one JSON Schema or OpenAPI defines."""
    unknown = [(p, f) for p, f in _formats(_spec(client)) if f not in _JSON_SCHEMA_FORMATS]
    assert unknown == []


def test_dates_and_times_in_answers_say_their_format(client):
    """A client generator types a field by its ``format``: the receipt keys' ``created_at``
    (an ISO 8601 time) and a day of ``GET /api/usage/daily`` (``YYYY-MM-DD``) were bare
    strings; so is every URL a client is sent to."""
    schemas = _spec(client)["components"]["schemas"]
    assert schemas["ReceiptKey"]["properties"]["created_at"]["format"] == "date-time"
    assert schemas["DayUsage"]["properties"]["date"]["format"] == "date"
    assert schemas["CheckoutCreated"]["properties"]["url"]["format"] == "uri"
    assert schemas["CheckoutState"]["properties"]["url"]["format"] == "uri"


def test_every_operation_that_reads_a_body_documents_413(app, client, make_account, monkeypatch):
    """Any body over ``MAX_CONTENT_LENGTH`` is answered 413 ``payload_too_large`` by every
    operation that reads one (Flask refuses it while reading, before the path's ids are
    looked up): the document said so on three of them. Each operation with a request body
    is sent one, as an admin, and its answer compared with the document."""
    monkeypatch.setitem(app.config, "RATELIMIT_ENABLED", False)
    spec = _spec(client)
    admin = make_account(admin=True)
    big = b'{"x": "' + b"a" * (client.application.config["MAX_CONTENT_LENGTH"] + 1) + b'"}'
    answered, undocumented = {}, []
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            if "requestBody" not in op:
                continue
            url = re.sub(r"\{[^}]+\}", "x", path)
            r = client.open(url, method=method.upper(), data=big, content_type="application/json",
                            headers={"Authorization": f"Bearer {admin.key}", "Stripe-Signature": "t=1,v1=" + "0" * 64,
                                     "SIGN-IN-WITH-X": "e30="})
            answered[f"{method.upper()} {path}"] = r.status_code
            if "413" not in op["responses"]:
                undocumented.append(f"{method.upper()} {path}")
    assert {op: s for op, s in answered.items() if s != 413} == {}
    assert undocumented == []


def _response(spec, name, status):
    method, path = name.split(" ", 1)
    response = spec["paths"][path][method.lower()]["responses"][status]
    if "$ref" in response:
        response = spec["components"]["responses"][response["$ref"].rsplit("/", 1)[-1]]
    return response


def test_an_error_documented_with_a_text_keeps_it(client):
    """flask-smorest ignores the description (and headers) of an ``alt_response`` given a
    named response: every error text of ``endpoint(errors=…)`` — which code, which rule — was
    dropped, and the document said "Unprocessable Entity" where the route explains its 422.
    Every operation allowed a 422 by the fuzz run states why, as the fuzz run's list does."""
    from tests.fuzz.run_fuzz import SEMANTIC_422

    spec = _spec(client)
    for name in SEMANTIC_422:
        assert _response(spec, name, "422")["description"] != "Unprocessable Entity", name
    assert "31 days" in _response(spec, "GET /api/usage/export", "422")["description"]
    assert "org_role_required" in _response(spec, "POST /api/agent/register", "403")["description"]
    assert "Slug taken" in _response(spec, "POST /api/agent/build", "409")["description"]
    assert _response(spec, "POST /api/agent/build", "409")["content"] == {
        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


def test_links_lead_from_a_created_object_to_the_operations_that_take_its_id(client):
    """A client (and schemathesis' stateful phase) follows a 201's links to the operations
    on what it created; only the alert had any, so the fuzz run called every other
    id-taking operation with made-up ids (404 only). Each link names an operation of the
    document and parameters that operation takes. None leads to an operation whose only
    unbound input is a body ``org_id`` (another organisation's is a documented 404, which a
    link-follower — schemathesis' ST302 — reads as the created object missing)."""
    spec = _spec(client)
    found = {}
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            if method == "parameters":
                continue
            for status, response in op.get("responses", {}).items():
                for name, link in (response.get("links") or {}).items():
                    _, _, target_path, target_method = link["operationRef"].split("/")
                    target_path = target_path.replace("~1", "/").replace("~0", "~")
                    target = spec["paths"][target_path][target_method]
                    taken = {p["name"] for p in target.get("parameters", [])
                             + spec["paths"][target_path].get("parameters", [])}
                    taken |= set(re.findall(r"\{([^}]+)\}", target_path))
                    assert set(link["parameters"]) <= taken, (name, link)
                    body = (target.get("requestBody") or {}).get("content", {}).get("application/json", {})
                    ref = body.get("schema", {}).get("$ref", "")
                    body_fields = spec["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"] if ref else {}
                    assert not (taken <= set(link["parameters"]) and "org_id" in body_fields), (name, link)
                    found[f"{method.upper()} {path}"] = found.get(f"{method.upper()} {path}", set()) | {
                        f"{target_method.upper()} {target_path}"}
    assert found["POST /api/keys"] == {"DELETE /api/keys/{key_id}"}
    assert "GET /api/orgs/{org_id}/members" in found["POST /api/orgs"]
    assert found["POST /api/orgs/{org_id}/invites"] == {"DELETE /api/orgs/{org_id}/invites/{invite_id}"}
    assert found["POST /api/agent/register"] == {"GET /api/agent/{agent_id}/usage",
                                                 "GET /api/agent/{agent_id}/earnings", "DELETE /api/agent/{agent_id}"}
    assert found["POST /api/alerts"] == {"DELETE /api/alerts/{alert_id}"}
    assert found["POST /api/pay/checkout"] == {"GET /api/pay/checkout/{payment_id}",
                                               "POST /api/pay/checkout/{payment_id}/cancel"}


def test_fields_every_answer_carries_are_required(client, make_account):
    """A client generator types a property left out of ``required`` as "may be absent"
    (``Unset`` in openapi-python-client) beside "may be null": a payment's `product`,
    `failure_code`, `failure_message`, a transaction's `payment_id` / `call_id` and a
    receipt key's `created_at` are always sent (null when unset). The answers carry them."""
    schemas = _spec(client)["components"]["schemas"]
    always = {"Payment": {"product", "failure_code", "failure_message"},
              "Transaction": {"payment_id", "call_id"}, "ReceiptKey": {"created_at"}}
    for name, fields in always.items():
        assert fields <= set(schemas[name]["required"]), name
    account = make_account()
    auth = {"Authorization": f"Bearer {account.key}"}
    client.post("/api/pay/checkout", json={"amount_cents": 1000}, headers=auth)
    assert always["Payment"] <= set(client.get("/api/pay/history", headers=auth).get_json()["payments"][0])
    assert always["Transaction"] <= set(client.get("/api/wallet/transactions", headers=auth).get_json()["transactions"][0])
    assert always["ReceiptKey"] <= set(client.get("/api/receipts/keys").get_json()["keys"][0])


def test_every_429_documents_the_headers_it_carries(app, client, monkeypatch):
    """A 429 carries ``Retry-After`` and ``RateLimit-*`` (docs/decisions.md); the document
    declared none, so a generated client or retry middleware could not know to wait. Every
    429 of the document (named or inline) now lists them, and a real one carries them."""
    spec = _spec(client)
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            if method == "parameters" or "429" not in op["responses"]:
                continue
            headers = _response(spec, f"{method.upper()} {path}", "429").get("headers") or {}
            assert {"Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} <= set(headers), \
                f"{method.upper()} {path}"
    monkeypatch.setitem(app.config, "RATELIMIT_ENABLED", True)
    monkeypatch.setitem(app.config, "AGENT_NONCE_RATE_LIMIT", "1/minute")
    answers = [client.get("/api/agent/nonce", environ_base={"REMOTE_ADDR": "203.0.113.42"}) for _ in range(2)]
    assert answers[1].status_code == 429
    assert int(answers[1].headers["Retry-After"]) >= 1 and answers[1].headers["RateLimit-Remaining"] == "0"


def test_an_error_with_more_fields_matches_its_documented_schema(client, make_account, mod):
    """Some errors carry fields beside ``error``/``message``/``request_id`` (a 402's payment
    request and price, a spend limit's figures, the roles that may act — docs/decisions.md);
    the gateway's ``Error`` schema declared ``additionalProperties: false``, so such an answer
    failed its own document (a generated client's strict parser, any response validator).
    A module call the balance cannot cover is checked against the 402 it documents."""
    from jsonschema import Draft202012Validator

    from tests.gateway_helpers import call

    spec = _spec(client)
    r = call(client, make_account(cents=2), {"action": "ok"})
    assert r.status_code == 402 and {"price_cents", "pay_to", "nonce"} <= set(r.get_json())
    schema = _response(spec, "POST /v1/module/{slug}/call", "402")["content"]["application/json"]["schema"]
    errors = [e.message for e in Draft202012Validator({**schema, "components": spec["components"]})
              .iter_errors(r.get_json())]
    assert errors == []
