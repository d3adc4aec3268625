"""Issue 42 item 12: a schema-valid, well-formed request is never a 400. Each request below
is valid against the published document (checked here with jsonschema on the operation's
own schema, so the test cannot pass by sending something the document refuses) and used to
be answered 400. Now: what a schema can state, the document states (per-chain shapes of a
wallet, Stripe's signature header), and what it cannot is answered with the status that
says so and documented on the operation — 409 for stored state, 404 for a thing that does
not exist, 401 for a signature that does not verify, 422 ``unprocessable`` for a rule
between parameters, the clock, a checksum or a decoded length."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import base58
import jsonschema
import pytest


@pytest.fixture
def doc(client):
    return client.get("/openapi.json").get_json()


def _resolve(doc, schema):
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _body_schema(doc, path, method):
    op = doc["paths"][path][method]
    return _resolve(doc, op["requestBody"]["content"]["application/json"]["schema"])


def _assert_body_valid(doc, path, method, body):
    schema = {**_body_schema(doc, path, method), "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(body)


def _assert_query_valid(doc, path, query):
    for param in doc["paths"][path]["get"]["parameters"]:
        if param["in"] == "query" and param["name"] in query:
            jsonschema.Draft202012Validator(param["schema"]).validate(query[param["name"]])


def _documented(doc, path, method, status):
    assert str(status) in doc["paths"][path][method]["responses"], (path, method, status)


def test_export_with_from_after_to_is_422_and_documented(client, account, doc):
    now = datetime.now(timezone.utc).replace(microsecond=0)
    for q in ({"from": now.isoformat(), "to": (now - timedelta(days=1)).isoformat()},
              {"from": now.isoformat(), "to": now.isoformat()},
              {"from": now.isoformat(), "to": (now + timedelta(days=32)).isoformat()}):
        _assert_query_valid(doc, "/api/usage/export", q)
        r = client.get("/api/usage/export", query_string=q, headers=account.headers)
        assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", (q, r.get_json())
    _documented(doc, "/api/usage/export", "get", 422)


@pytest.mark.parametrize("delta", [timedelta(days=-1), timedelta(days=400)])
def test_a_key_expiring_in_the_past_or_beyond_a_year_is_422_and_creates_nothing(client, account, doc, delta):
    body = {"name": "k", "expires_at": (datetime.now(timezone.utc) + delta).isoformat()}
    _assert_body_valid(doc, "/api/keys", "post", body)
    before = client.get("/api/keys", headers=account.headers).get_json()["keys"]
    r = client.post("/api/keys", json=body, headers=account.headers)
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()
    assert client.get("/api/keys", headers=account.headers).get_json()["keys"] == before
    _documented(doc, "/api/keys", "post", 422)


def test_a_period_alone_on_a_key_without_a_limit_is_a_409(client, account, doc):
    key = client.post("/api/keys", json={"name": "nolimit"}, headers=account.headers).get_json()
    body = {"spend_limit_period": "day"}
    _assert_body_valid(doc, "/api/keys/{key_id}", "patch", body)
    r = client.patch(f"/api/keys/{key['id']}", json=body, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "conflict", r.get_json()
    _documented(doc, "/api/keys/{key_id}", "patch", 409)


def test_an_unknown_payment_method_is_404_and_documented(client, account, doc):
    body = {"payment_method_id": "pm_nope"}
    _assert_body_valid(doc, "/api/pay/method", "post", body)
    r = client.post("/api/pay/method", json=body, headers=account.headers)
    assert r.status_code == 404 and r.get_json()["error"] == "payment_method_not_found", r.get_json()
    _documented(doc, "/api/pay/method", "post", 404)
    _documented(doc, "/api/pay/method", "post", 409)


def test_the_webhook_documents_stripes_header_shape_and_a_forgery_is_401(client, doc):
    op = doc["paths"]["/api/pay/webhook"]["post"]
    header = next(p for p in op["parameters"] if p["name"] == "Stripe-Signature")
    forged = "t=1700000000,v1=" + "ab" * 32
    jsonschema.Draft202012Validator(header["schema"]).validate(forged)
    r = client.post("/api/pay/webhook", data=b'{"id": "evt_1"}', headers={
        "Stripe-Signature": forged, "Content-Type": "application/json"})
    assert r.status_code == 401 and r.get_json()["error"] == "webhook_signature_invalid", r.get_json()
    _documented(doc, "/api/pay/webhook", "post", 401)
    # a header of another shape breaks the document, and is the 400
    for bad in ("garbage", "t=1,v1=XYZ", "v1=" + "ab" * 32):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(header["schema"]).validate(bad)
        r = client.post("/api/pay/webhook", data=b"{}", headers={"Stripe-Signature": bad,
                                                                 "Content-Type": "application/json"})
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", (bad, r.get_json())


SOLANA = base58.b58encode(bytes(range(1, 33))).decode()
EVM = "0x" + "ab" * 20


def test_the_wallet_connect_body_states_the_shapes_per_chain(client, account, doc):
    """The document refuses an address of the other family, and so does the server (400);
    a body the document accepts gets no 400: without a message issued it is the state
    conflict 409 `nonce_invalid`."""
    schema = {**_body_schema(doc, "/api/wallet/connect", "post"), "components": doc["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    mismatched = [{"chain": "solana", "address": EVM, "signature": "0x" + "1" * 130},
                  {"chain": "base", "address": SOLANA, "signature": "1" * 88},
                  {"chain": "base", "address": EVM, "signature": "1" * 88}]
    for body in mismatched:
        assert not validator.is_valid(body), body
        r = client.post("/api/wallet/connect", json=body, headers=account.headers)
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", (body, r.get_json())
    for body in ({"chain": "solana", "address": SOLANA, "signature": "2" * 88},
                 {"chain": "polygon", "address": EVM, "signature": "0x" + "1" * 130}):
        validator.validate(body)
        r = client.post("/api/wallet/connect", json=body, headers=account.headers)
        assert r.status_code == 409 and r.get_json()["error"] == "nonce_invalid", (body, r.get_json())
    _documented(doc, "/api/wallet/connect", "post", 409)
    _documented(doc, "/api/wallet/connect", "post", 422)


@pytest.mark.parametrize("query", [
    {"chain": "solana", "address": EVM},                                      # the other family
    {"chain": "base", "address": SOLANA},
    {"chain": "base", "address": "0x" + "aB" * 20},                           # EIP-55 mismatch
    {"chain": "solana", "address": "1" * 44},                                 # not 32 bytes
])
def test_a_wallet_message_for_an_address_not_of_the_chain_is_422(client, account, doc, query):
    _assert_query_valid(doc, "/api/wallet/connect/message", query)
    r = client.get("/api/wallet/connect/message", query_string=query, headers=account.headers)
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()
    _documented(doc, "/api/wallet/connect/message", "get", 422)


def test_a_pubkey_of_the_documented_shape_that_is_no_key_is_422(client, account, doc):
    from app.blueprints.agents.schemas import PUBKEY_PATTERN

    for pubkey in ("ed25519:" + "1" * 43, "ed25519:" + "z" * 44,
                   "eip155:8453:0x" + "aB" * 20):  # 31 zero bytes; over 32 bytes; EIP-55 mismatch
        assert re.fullmatch(PUBKEY_PATTERN, pubkey)
        body = {"name": "a", "pubkey": pubkey}
        _assert_body_valid(doc, "/api/agent/register", "post", body)
        r = client.post("/api/agent/register", json=body, headers=account.headers)
        assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", (pubkey, r.get_json())
    _documented(doc, "/api/agent/register", "post", 422)


def test_the_error_table_publishes_the_statuses(doc):
    codes = doc["x-error-codes"]
    assert codes["unprocessable"]["status"] == 422
    assert codes["unknown_action"]["status"] == 404
    assert codes["nonce_invalid"]["status"] == 409
    assert codes["webhook_signature_invalid"]["status"] == 401
    assert codes["payment_method_not_found"]["status"] == 404


# --- the second round: the operations the fuzz run still allowed a 400 --------------------

@pytest.fixture
def strict(app):
    """The SSRF guard as in production: private hosts refused."""
    app.config["ALLOW_PRIVATE_URLS"] = False
    yield
    app.config["ALLOW_PRIVATE_URLS"] = True


def test_the_ssrf_guards_verdict_on_a_well_formed_url_is_422_on_every_route(client, account, doc, strict):
    """The SSRF guard's error class (``netguard.UnsafeURL``) is 422 ``unprocessable``: a URL
    of the published shape whose host is not public is not a malformed request."""
    from tests.agentkit import Keypair, session_headers

    url = "https://127.0.0.1/hook"
    body = {"name": "a", "pubkey": Keypair().pubkey, "webhook": url}
    _assert_body_valid(doc, "/api/agent/register", "post", body)
    r = client.post("/api/agent/register", json=body, headers=account.headers)
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()
    assert "webhook" in r.get_json()["message"]
    alert = {"name": "n", "metric": "calls", "op": ">", "threshold": 1, "window": "day",
             "channel": "webhook", "target": url}
    _assert_body_valid(doc, "/api/alerts", "post", alert)
    r = client.post("/api/alerts", json=alert, headers=account.headers)
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()
    assert client.get("/api/alerts", headers=account.headers).get_json()["alerts"] == []
    kp = Keypair()
    assert client.post("/api/agent/register", json={"name": "b", "pubkey": kp.pubkey,
                                                    "webhook": "https://1.1.1.1/hook"},
                       headers=account.headers).status_code == 201
    build = {"slug": "ssrf-422", "price_cents": 1, "actions": ["go"], "webhook": url}
    _assert_body_valid(doc, "/api/agent/build", "post", build)
    r = client.post("/api/agent/build", json=build, headers=session_headers(client, kp))
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()
    for path in ("/api/agent/register", "/api/agent/build", "/api/alerts"):
        _documented(doc, path, "post", 422)


def test_a_build_without_a_webhook_for_an_agent_without_one_is_a_409(client, account, doc):
    from tests.agentkit import Keypair, session_headers

    kp = Keypair()
    assert client.post("/api/agent/register", json={"name": "b", "pubkey": kp.pubkey},
                       headers=account.headers).status_code == 201
    build = {"slug": "no-hook", "price_cents": 1, "actions": ["go"]}
    _assert_body_valid(doc, "/api/agent/build", "post", build)
    r = client.post("/api/agent/build", json=build, headers=session_headers(client, kp))
    assert r.status_code == 409 and r.get_json()["error"] == "conflict", r.get_json()
    _documented(doc, "/api/agent/build", "post", 409)


def test_an_alert_email_too_long_once_trimmed_is_422(client, account, doc):
    target = "a" * 64 + "@" + ("b" * 60 + ".") * 4 + "com"  # 312 characters
    body = {"name": "n", "metric": "calls", "op": ">", "threshold": 1, "window": "day",
            "channel": "email", "target": target}
    _assert_body_valid(doc, "/api/alerts", "post", body)
    r = client.post("/api/alerts", json=body, headers=account.headers)
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()


def test_a_return_url_outside_the_operators_hosts_is_422(app, client, account, doc):
    body = {"amount_cents": 500, "return_url": "https://elsewhere.example/back"}
    _assert_body_valid(doc, "/api/pay/checkout", "post", body)
    app.config["RETURN_URL_HOSTS"] = "shop.example"
    try:
        r = client.post("/api/pay/checkout", json=body, headers=account.headers)
    finally:
        app.config["RETURN_URL_HOSTS"] = None
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()
    assert "return_url" in r.get_json()["message"]
    assert client.get("/api/pay/history", headers=account.headers).get_json()["payments"] == []
    _documented(doc, "/api/pay/checkout", "post", 422)


def test_an_auto_topup_cap_below_its_amount_is_422(client, account, doc):
    body = {"threshold_cents": 500, "amount_cents": 2000, "monthly_cap_cents": 1000}
    _assert_body_valid(doc, "/api/pay/auto-topup", "put", body)
    r = client.put("/api/pay/auto-topup", json=body, headers=account.headers)
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable", r.get_json()
    assert "monthly_cap_cents" in r.get_json()["message"]
    _documented(doc, "/api/pay/auto-topup", "put", 422)
    _documented(doc, "/api/pay/auto-topup", "put", 409)


def test_a_provider_key_for_a_provider_not_in_the_catalog_is_404(client, account, doc):
    body = {"provider": "nope", "api_key": "sk-12345678"}
    _assert_body_valid(doc, "/api/provider-keys", "post", body)
    r = client.post("/api/provider-keys", json=body, headers=account.headers)
    assert r.status_code == 404 and r.get_json()["error"] == "not_found", r.get_json()
    _documented(doc, "/api/provider-keys", "post", 404)
    _documented(doc, "/api/provider-keys", "post", 422)  # the provider refusing the key (tests/api/test_byok.py)
    assert doc["x-error-codes"]["provider_key_invalid"]["status"] == 422


@pytest.mark.parametrize("name", ["   ", "\u3000", " \u00a0 "])
def test_a_blank_key_name_is_refused_by_the_document_too(client, account, doc, name):
    """POST /api/keys trims the name and refuses a blank one (400 naming `name`): the
    document states it (a pattern), so a schema-valid request is never that 400."""
    with pytest.raises(jsonschema.ValidationError):
        _assert_body_valid(doc, "/api/keys", "post", {"name": name})
    before = client.get("/api/keys", headers=account.headers).get_json()["keys"]
    r = client.post("/api/keys", json={"name": name}, headers=account.headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    assert "name" in r.get_json()["message"]
    assert client.get("/api/keys", headers=account.headers).get_json()["keys"] == before
    _assert_body_valid(doc, "/api/keys", "post", {"name": " padded "})


_PUBLIC_EMAIL_BODIES = [("/api/contact", {"message": "hi"}), ("/api/email/subscribe", {}),
                        ("/api/email/unsubscribe", {}), ("/api/signup", {})]


@pytest.mark.parametrize("email", ["user@localhost", '"q"@example.com', "u@[127.0.0.1]", "bob@ex\u00e4mple.com",
                                   "a@example..com", "a=?utf-8?q?x?=@example.com"])
@pytest.mark.parametrize("path,rest", _PUBLIC_EMAIL_BODIES)
def test_an_address_the_service_refuses_is_refused_by_the_document_too(client, doc, path, rest, email):
    """The public forms (contact, newsletter, sign-up) refuse what is not an address the
    service mails (400 naming `email`); `format: email` alone admits some of them (a dotless
    domain, a quoted local part, an address literal), so the document states the shape."""
    with pytest.raises(jsonschema.ValidationError):
        _assert_body_valid(doc, path, "post", {"email": email, **rest})
    r = client.post(path, json={"email": email, **rest})
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", r.get_json()
    assert "email" in r.get_json()["message"]


@pytest.mark.parametrize("path,rest", _PUBLIC_EMAIL_BODIES)
def test_an_address_the_service_takes_is_valid_in_the_document(client, doc, path, rest):
    for email in ("a@b.co", " Padded.Name+tag@Example.com ", "o'brien@mail.example.org"):
        _assert_body_valid(doc, path, "post", {"email": email, **rest})
        r = client.post(path, json={"email": email, **rest})
        assert r.status_code in (200, 202), (path, email, r.get_json())


@pytest.mark.parametrize("name", ["   ", "\u3000", " \u00a0 "])
def test_a_blank_alert_name_is_refused_by_the_document_too(client, account, doc, name):
    """POST /api/alerts trims the name and refuses a blank one (400 naming `name`): the
    document's pattern refuses it too, and a padded name stays valid."""
    alert = {"metric": "calls", "op": ">", "threshold": 1, "window": "day", "channel": "email",
             "target": "ops@example.com"}
    with pytest.raises(jsonschema.ValidationError):
        _assert_body_valid(doc, "/api/alerts", "post", {"name": name, **alert})
    r = client.post("/api/alerts", json={"name": name, **alert}, headers=account.headers)
    assert r.status_code == 400 and "name" in r.get_json()["message"], r.get_json()
    for ok in (" padded ", "a=b", "Spend \u00e9t\u00e9"):
        _assert_body_valid(doc, "/api/alerts", "post", {"name": ok, **alert})


def test_an_export_window_in_lower_case_rfc3339_is_read_as_utc(client, account, doc):
    """RFC 3339 §5.6 allows "t" and "z" in lower case (the document's `format: date-time`):
    `…z` is UTC as `…Z` is — before, it was 400 "Not a valid datetime"."""
    now = datetime.now(timezone.utc).replace(microsecond=0, tzinfo=None)
    q = {"from": (now - timedelta(hours=1)).isoformat() + "z", "to": now.isoformat().replace("T", "t") + ".5z"}
    _assert_query_valid(doc, "/api/usage/export", q)
    assert all(jsonschema.Draft202012Validator.FORMAT_CHECKER.conforms(v, "date-time") for v in q.values())
    r = client.get("/api/usage/export", query_string=q, headers=account.headers)
    assert r.status_code == 200, r.get_json()
    frm = (now - timedelta(hours=1)).strftime("%Y%m%d")
    assert r.headers["Content-Disposition"].startswith(f'attachment; filename="usage-{frm}-')
