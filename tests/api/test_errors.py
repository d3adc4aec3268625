"""Every error on every path is JSON {error, message, request_id}."""
from __future__ import annotations


def _is_error(r, status, code):
    body = r.get_json()
    assert r.status_code == status, (r.status_code, r.data[:300])
    assert set(body) >= {"error", "message", "request_id"}
    assert body["error"] == code
    assert body["request_id"] == r.headers["X-Request-Id"]
    return body


def test_unknown_route(client):
    _is_error(client.get("/nope"), 404, "not_found")
    _is_error(client.post("/api/nope", json={}), 404, "not_found")


def test_method_not_allowed(client):
    r = client.put("/api/account")
    _is_error(r, 405, "method_not_allowed")
    assert "GET" in r.headers["Allow"]


def test_body_too_large(client, account):
    big = b'{"name": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    r = client.post("/api/keys", data=big, headers={**account.headers, "Content-Type": "application/json"})
    _is_error(r, 413, "payload_too_large")


def test_malformed_json(client, account):
    r = client.post("/api/keys", data=b"{nope", headers={**account.headers, "Content-Type": "application/json"})
    _is_error(r, 400, "invalid_request")


def test_deep_json_is_400_not_500(client, account):
    deep = b"[" * 100_000 + b"]" * 100_000
    r = client.post("/api/keys", data=deep, headers={**account.headers, "Content-Type": "application/json"})
    assert r.status_code == 400


def test_request_id_is_echoed_when_sane(client):
    r = client.get("/nope", headers={"X-Request-Id": "abc-123"})
    assert r.headers["X-Request-Id"] == "abc-123" and r.get_json()["request_id"] == "abc-123"
    r = client.get("/nope", headers={"X-Request-Id": "bad id\twith spaces"})
    assert r.headers["X-Request-Id"].startswith("req_")


def test_500_leaks_nothing():
    from app import create_app
    from tests.conftest import base_config

    app = create_app(base_config())

    @app.get("/__boom")
    def boom():
        raise RuntimeError("secret internals postgres://user:pw@host")

    r = app.test_client().get("/__boom")
    body = _is_error(r, 500, "internal_error")
    assert "secret" not in r.get_data(as_text=True) and "Traceback" not in body["message"]
