"""The metered call's thin entry (app/blueprints/gateway/hotpath.py): the same request
sent through it and through the Flask route gets the same status, headers, body,
access line and request metrics; anything but the plain case is handed to Flask
untouched, before anything is counted."""
from __future__ import annotations

import io
import logging

import pytest
from werkzeug.test import Client

from app import logs, metrics
from app.blueprints.gateway import hotpath
from app.blueprints.gateway.hotpath import HotPath
from tests.gateway_helpers import PROVIDER, balance_cents, mod, provider, provider_server  # noqa: F401

ROUTE = "/v1/module/<string:slug>/call"


@pytest.fixture
def entries(app):
    """(thin, flask, handed): a client through the thin entry, one straight to Flask, and
    the list of requests the thin entry handed to Flask."""
    thin = app.wsgi_app
    assert isinstance(thin, HotPath), "the app is served through the thin entry"
    flask_app = thin.wsgi_app
    handed = []

    def spy(environ, start_response):
        handed.append(environ["PATH_INFO"])
        return flask_app(environ, start_response)

    probe = HotPath(app, spy)
    return Client(probe), Client(flask_app), handed


def _post(client, acct, body=None, *, slug="svc", headers=None, bearer=None, **kw):
    h = {"X-Request-Id": "req-parity"}
    if acct is not None or bearer is not None:
        h["Authorization"] = f"Bearer {bearer or acct.key}"
    h.update(headers or {})
    if body is not None and "data" not in kw:
        kw["json"] = body
    return client.post(f"/v1/module/{slug}/call", headers=h, **kw)


def _shape(resp, volatile=()):
    """Status, header names and values (but for the volatile ones) and the JSON body
    without per-call values."""
    headers = {k: ("*" if k in volatile else v) for k, v in resp.headers.items()}
    body = resp.get_json()
    if isinstance(body, dict):
        body = {k: ("*" if k in ("call_id", "receipt", "nonce") else v) for k, v in body.items()}
    return resp.status, headers, body


def _both(entries, make, volatile=("RateLimit-Reset", "RateLimit-Remaining")):
    """The same request through both entries (the second one's counts one more request of
    the same credential: its ``RateLimit-Remaining`` is one less)."""
    thin, flask_client, handed = entries
    a, b = make(thin), make(flask_client)
    assert _shape(a, volatile) == _shape(b, volatile)
    return a, handed


def test_success_is_the_same_and_not_handed(app, entries, make_account, mod):
    acct = make_account(cents=100)
    r, handed = _both(entries, lambda c: _post(c, acct, {"action": "ok", "text": "hi"}))
    assert r.status_code == 200 and handed == []
    assert r.get_json()["result"]["echo"] == {"action": "ok", "text": "hi"}
    assert r.headers["X-Request-Id"] == "req-parity"
    assert list(r.headers.keys())[:2] == ["Content-Type", "Content-Length"]
    assert balance_cents(app, acct.id) == 94  # charged once per entry


def test_idempotent_replay_and_reuse(entries, make_account, mod):
    acct = make_account(cents=100)
    thin, flask_client, handed = entries
    first = _post(thin, acct, {"action": "ok"}, headers={"Idempotency-Key": "k-1"})
    replay_thin = _post(thin, acct, {"action": "ok"}, headers={"Idempotency-Key": "k-1"})
    replay_flask = _post(flask_client, acct, {"action": "ok"}, headers={"Idempotency-Key": "k-1"})
    assert replay_thin.headers["Idempotent-Replayed"] == "true"
    assert first.get_data() == replay_thin.get_data() == replay_flask.get_data()
    volatile = ("RateLimit-Reset", "RateLimit-Remaining")
    assert _shape(replay_thin, volatile) == _shape(replay_flask, volatile)
    _both(entries, lambda c: _post(c, acct, {"action": "ok", "x": 1}, headers={"Idempotency-Key": "k-1"}))
    assert handed == []


@pytest.mark.parametrize("case", ["no_credential", "bad_credential", "malformed_header", "scope",
                                  "unknown_module", "unknown_action", "payment_required",
                                  "provider_error", "long_key"])
def test_refusals_are_the_same(case, entries, make_account, mod):
    acct = make_account(cents=0 if case == "payment_required" else 100,
                        scopes=("keys:read",) if case == "scope" else None)
    body, kw = {"action": "ok"}, {}
    if case == "no_credential":
        acct = None
    elif case == "bad_credential":
        kw["bearer"] = "svc_live_" + "x" * 40
    elif case == "malformed_header":
        kw["headers"] = {"Authorization": "Basic abc"}
    elif case == "unknown_module":
        kw["slug"] = "nope"
    elif case == "unknown_action":
        body = {"action": "nope"}
    elif case == "provider_error":
        body = {"action": "boom"}
    elif case == "long_key":
        kw["headers"] = {"Idempotency-Key": "k" * 129}
    volatile = ("RateLimit-Reset", "RateLimit-Remaining", "WWW-Authenticate", "X-Nonce", "PAYMENT-REQUIRED")
    r, handed = _both(entries, lambda c: _post(c, acct, body, **kw), volatile)
    assert r.status_code >= 400 and r.get_json()["request_id"] == "req-parity"
    # a header the fast loader declines goes to Flask's schema; the rest are answered here
    assert handed == (["/v1/module/svc/call"] if case == "long_key" else [])


@pytest.mark.parametrize("case", ["missing_action", "not_json_text", "array", "text_plain",
                                  "payment_header", "json_suffix_type", "chunked"])
def test_anything_else_is_handed_to_flask_untouched(case, entries, make_account, mod):
    acct = make_account(cents=100)
    kw = {}
    body = {"action": "ok"}
    if case == "missing_action":
        body = {"text": "no action"}
    elif case == "not_json_text":
        kw = {"data": b"{not json", "content_type": "application/json"}
    elif case == "array":
        body = [1, 2]
    elif case == "text_plain":
        kw = {"data": b'{"action": "ok"}', "content_type": "text/plain"}
    elif case == "payment_header":
        kw = {"headers": {"X-Payment": "not-base64!"}}
    elif case == "json_suffix_type":
        kw = {"data": b'{"action": "ok"}', "content_type": "application/vnd.x+json"}
    elif case == "chunked":
        body = None
        kw = {"input_stream": io.BytesIO(b'{"action": "ok"}'), "content_type": "application/json",
              "headers": {"Transfer-Encoding": "chunked"}}
    r, handed = _both(entries, lambda c: _post(c, acct, body, **kw))
    assert handed == ["/v1/module/svc/call"]
    if case == "json_suffix_type":
        assert r.status_code == 200  # Flask accepts it; only the handing over differs


def test_rate_limited_is_the_same(app, entries, make_account, mod, monkeypatch):
    monkeypatch.setitem(app.config["PLANS"], "starter", {"plan_cents": 2000, "rate_limit": "1/hour"})
    a, b = make_account(cents=100), make_account(cents=100)
    thin, flask_client, handed = entries
    assert _post(thin, a, {"action": "ok"}).headers["RateLimit-Remaining"] == "0"
    assert _post(flask_client, b, {"action": "ok"}).status_code == 200
    r_thin, r_flask = _post(thin, a, {"action": "ok"}), _post(flask_client, b, {"action": "ok"})
    assert r_thin.status_code == 429 and r_thin.headers["Retry-After"]
    volatile = ("Retry-After", "RateLimit-Reset", "RateLimit-Remaining")
    assert _shape(r_thin, volatile) == _shape(r_flask, volatile)
    assert balance_cents(app, a.id) == 97 and handed == []


def test_unexpected_error_is_a_logged_500(entries, make_account, mod, monkeypatch, caplog):
    from app.services.gateway import calls

    def boom(**kw):
        logging.getLogger("app.services.gateway.calls").warning("inside the call")
        raise RuntimeError("boom")

    monkeypatch.setattr(calls, "call", boom)
    acct = make_account(cents=100)
    caplog.handler.addFilter(logs._ContextFilter())  # as the app's handler does
    with caplog.at_level(logging.INFO):
        r, handed = _both(entries, lambda c: _post(c, acct, {"action": "ok"}))
    assert r.status_code == 500 and r.get_json()["error"] == "internal_error"
    inside = [rec for rec in caplog.records if rec.getMessage() == "inside the call"]
    assert [rec.request_id for rec in inside] == ["req-parity", "req-parity"]
    assert [rec.account_id for rec in inside] == [acct.id, acct.id]
    assert sum(rec.getMessage() == "unhandled error" for rec in caplog.records) == 2


def test_access_line_and_metrics_are_the_same(entries, make_account, mod, caplog):
    acct = make_account(cents=100)
    thin, flask_client, _ = entries
    caplog.handler.addFilter(logs._ContextFilter())  # as the app's handler does
    lines = []
    for client in (thin, flask_client):
        before = _count(ROUTE, "200")
        with caplog.at_level(logging.INFO, logger="gateway.access"):
            caplog.clear()
            assert _post(client, acct, {"action": "ok"}).status_code == 200
        assert _count(ROUTE, "200") == before + 1
        (rec,) = [r for r in caplog.records if r.name == "gateway.access"]
        lines.append({k: getattr(rec, k) for k in ("method", "route", "path", "status", "client_ip",
                                                   "request_id", "account_id")})
        assert rec.duration_ms > 0
    assert lines[0] == lines[1]
    assert lines[0]["route"] == ROUTE and lines[0]["request_id"] == "req-parity"


def _count(route, status):
    return metrics.HTTP_REQUESTS.labels("POST", route, status)._value.get()


def test_body_handed_over_is_the_body_sent(entries, make_account, mod):
    """A body the fast loader declines reaches Flask byte for byte (its 400 names the field)."""
    acct = make_account(cents=100)
    r, handed = _both(entries, lambda c: _post(c, acct, {"action": ""}))
    assert r.status_code == 400 and "action" in r.get_json()["message"] and handed


def test_not_installed_when_off_tracing_or_host_matching(monkeypatch):
    from types import SimpleNamespace

    from app import create_app, telemetry
    from tests.conftest import base_config

    assert not isinstance(create_app(base_config(HOT_PATH=False)).wsgi_app, HotPath)
    inner = object()
    for config, tracing in (({"HOT_PATH": False}, False), ({}, True), ({"SERVER_NAME": "gw.example"}, False)):
        monkeypatch.setattr(telemetry, "enabled", lambda env=None, on=tracing: on)
        stub = SimpleNamespace(config=config, wsgi_app=inner)
        hotpath.install(stub)  # would fail on the stub (no url_map) if it installed
        assert stub.wsgi_app is inner


def test_behind_proxyfix_it_sees_the_forwarded_client(app, make_account, mod, caplog):
    from werkzeug.middleware.proxy_fix import ProxyFix

    from app import create_app
    from tests.conftest import base_config
    from tests.support.finalize import drain

    proxied = create_app(base_config(TRUSTED_PROXIES=1))
    assert isinstance(proxied.wsgi_app, ProxyFix) and isinstance(proxied.wsgi_app.app, HotPath)
    acct = make_account(cents=100)
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        r = proxied.test_client().post("/v1/module/svc/call", json={"action": "ok"},
                                       headers={"Authorization": f"Bearer {acct.key}",
                                                "X-Forwarded-For": "203.0.113.9"})
    assert r.status_code == 200
    assert [rec.client_ip for rec in caplog.records if rec.name == "gateway.access"] == ["203.0.113.9"]
    drain(proxied)  # its own finalize writer (the teardown drains only the session app's)


# --- the chat completion (POST /v1/chat/completions, non-streaming) ---------------------------

CHAT_ROUTE = "/v1/chat/completions"


@pytest.fixture
def chat_fakes(app, monkeypatch, tmp_path):
    from tests.chatfakes import configured, running_fakes

    with running_fakes() as upstreams, configured(app, monkeypatch, tmp_path, upstreams) as fakes:
        yield fakes


def _chat(client, acct, body=None, *, headers=None, bearer=None, **kw):
    h = {"X-Request-Id": "req-parity"}
    if acct is not None or bearer is not None:
        h["Authorization"] = f"Bearer {bearer or acct.key}"
    h.update(headers or {})
    if "data" not in kw:
        kw["json"] = {"model": "m-small", "messages": [{"role": "user", "content": "hello there"}]} \
            if body is None else body
    return client.post(CHAT_ROUTE, headers=h, **kw)


def _micros(app, account_id) -> int:
    from app.services.money import ledger

    with app.app_context():
        return ledger.cached_balance(account_id)


# (the body's latency_ms can differ in length: Content-Length is checked against each body)
_CHAT_VOLATILE = ("RateLimit-Reset", "RateLimit-Remaining", "X-Chat-Completion-Id", "Content-Length",
                  "X-Gateway-Overhead-Ms")


def _chat_shape(resp):
    status, headers, body = _shape(resp, _CHAT_VOLATILE)
    if isinstance(body, dict):
        body = {k: ("*" if k in ("id", "created") else v) for k, v in body.items()}
        if isinstance(body.get("usage"), dict):
            body["usage"] = {**body["usage"], "latency_ms": "*"}
    return status, headers, body


def test_chat_completion_is_the_same_and_not_handed(app, entries, make_account, chat_fakes, caplog):
    """Same status, headers (X-Chat-* included), body and money through both entries; the
    thin entry answers it itself, with the same access line and request count."""
    from app.services.money import ledger

    acct = make_account(cents=100)
    thin, flask_client, handed = entries
    caplog.handler.addFilter(logs._ContextFilter())
    answers, lines, spent = [], [], []
    for client in (thin, flask_client):
        before_count = _count(CHAT_ROUTE, "200")
        before = _micros(app, acct.id)
        with caplog.at_level(logging.INFO, logger="gateway.access"):
            caplog.clear()
            r = _chat(client, acct)
        assert r.status_code == 200, r.get_json()
        answers.append(r)
        spent.append(before - _micros(app, acct.id))
        assert _count(CHAT_ROUTE, "200") == before_count + 1
        (rec,) = [x for x in caplog.records if x.name == "gateway.access"]
        lines.append({k: getattr(rec, k) for k in ("method", "route", "path", "status", "request_id", "account_id")})
    assert _chat_shape(answers[0]) == _chat_shape(answers[1])  # Content-Length: per body, below
    assert all(int(r.headers["Content-Length"]) == len(r.get_data()) for r in answers)
    assert answers[0].headers["X-Chat-Model"] and answers[0].get_json()["usage"]["cost_usd"] > 0
    assert spent[0] == spent[1] == answers[0].get_json()["usage"]["cost_micros"] > 0
    assert lines[0] == lines[1] and lines[0]["route"] == CHAT_ROUTE
    assert handed == []
    with app.app_context():
        assert ledger.check() == []


@pytest.mark.parametrize("case", ["no_credential", "scope", "payment_required", "unknown_model"])
def test_chat_refusals_are_the_same(case, entries, make_account, chat_fakes):
    acct = make_account(cents=0 if case == "payment_required" else 100,
                        scopes=("keys:read",) if case == "scope" else None)
    body = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]} if case == "unknown_model" else None
    if case == "no_credential":
        acct = None
    thin, flask_client, handed = entries
    a, b = _chat(thin, acct, body), _chat(flask_client, acct, body)
    volatile = _CHAT_VOLATILE + ("WWW-Authenticate", "X-Nonce", "PAYMENT-REQUIRED")
    assert _shape(a, volatile) == _shape(b, volatile)
    assert a.status_code >= 400 and a.get_json()["request_id"] == "req-parity" and handed == []
    # the chat host's OpenAI error shape on both entries, byte for byte (a 402's nonce differs)
    error = a.get_json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["code"] and error["message"]
    if case != "payment_required":
        assert a.get_data() == b.get_data()


@pytest.mark.parametrize("case", ["stream", "not_plain", "off_chat_host", "x402"])
def test_chat_streams_schema_errors_and_other_hosts_go_to_flask(case, app, entries, make_account, chat_fakes,
                                                                monkeypatch):
    acct = make_account(cents=100)
    thin, flask_client, handed = entries
    body = None
    headers = None
    if case == "x402":  # an x402 payment header: Flask's route reads it (the balance covers: ignored)
        headers = {"PAYMENT-SIGNATURE": "not-base64!"}
    elif case == "stream":
        body = {"model": "m-small", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    elif case == "not_plain":
        body = {"model": "m-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}
    else:  # Flask answers 404 before looking at the credential, so the thin entry must not answer 401
        monkeypatch.setitem(app.config, "CHAT_HOST", "chat.example")
        acct = None
    r = _chat(thin, acct, body, headers=headers)
    assert handed == [CHAT_ROUTE]
    expected = {"stream": 200, "not_plain": 400, "off_chat_host": 404, "x402": 200}[case]
    assert r.status_code == expected, r.get_data()[:300]
    if case == "stream":
        assert r.headers["Content-Type"].startswith("text/event-stream")


@pytest.mark.parametrize("host", ["chat.example", "CHAT.Example:8080", "chat.example:0", "chat.example:",
                                  "chat.example:99999", "chat.example:x", "other.example"])
def test_the_chat_host_is_read_as_flask_reads_it(host, app, entries, make_account, chat_fakes, monkeypatch):
    """Found in review: the thin entry cut the raw Host header at its last ':', so a port
    werkzeug rejects (0, empty, 99999, x) still matched CHAT_HOST — a charged 200 where
    Flask answers 404."""
    monkeypatch.setitem(app.config, "CHAT_HOST", "chat.example")
    acct = make_account(cents=100)
    thin, flask_client, handed = entries
    kw = {"environ_overrides": {"HTTP_HOST": host}}
    a, b = _chat(thin, acct, **kw), _chat(flask_client, acct, **kw)
    expected = 200 if host in ("chat.example", "CHAT.Example:8080") else 404
    assert a.status_code == b.status_code == expected
    assert handed == ([] if expected == 200 else [CHAT_ROUTE])
