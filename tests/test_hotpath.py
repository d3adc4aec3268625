"""The hot routes' one entry (app/blueprints/gateway/hotpath.py): the plain case of the
metered call and of the non-streaming chat completion is answered there (status, headers,
body, money, access line, request metrics) and nowhere else; anything else is handed to
Flask untouched, before anything is counted. The Flask routes' own answers for the
handed cases are the route tests' (tests/api/)."""
from __future__ import annotations

import io
import logging

import pytest
from werkzeug.test import Client

from app import logs, metrics
from app.blueprints.gateway.hotpath import HotPath
from tests.gateway_helpers import PROVIDER, balance_cents, mod, provider, provider_server  # noqa: F401

ROUTE = "/v1/module/<string:slug>/call"


@pytest.fixture
def entries(app):
    """(client, handed): a client through the app's entry, whose inner app (Flask) is a
    spy recording the requests the entry handed to it."""
    entry = app.wsgi_app
    assert isinstance(entry, HotPath), "the app is served through the thin entry"
    flask_app = entry.wsgi_app
    handed = []

    def spy(environ, start_response):
        handed.append(environ["PATH_INFO"])
        return flask_app(environ, start_response)

    return Client(HotPath(app, spy)), handed


def _post(client, acct, body=None, *, slug="svc", headers=None, bearer=None, **kw):
    h = {"X-Request-Id": "req-parity"}
    if acct is not None or bearer is not None:
        h["Authorization"] = f"Bearer {bearer or acct.key}"
    h.update(headers or {})
    if body is not None and "data" not in kw:
        kw["json"] = body
    return client.post(f"/v1/module/{slug}/call", headers=h, **kw)


def test_success_is_answered_here_and_not_handed(app, entries, make_account, mod):
    acct = make_account(cents=100)
    client, handed = entries
    r = _post(client, acct, {"action": "ok", "text": "hi"})
    assert r.status_code == 200 and handed == []
    assert r.get_json()["result"]["echo"] == {"action": "ok", "text": "hi"}
    assert r.headers["X-Request-Id"] == "req-parity"
    assert list(r.headers.keys())[:2] == ["Content-Type", "Content-Length"]
    assert r.headers["Content-Type"] == "application/json"
    assert int(r.headers["Content-Length"]) == len(r.get_data())
    assert r.headers["RateLimit-Limit"] and r.headers["RateLimit-Remaining"]
    assert balance_cents(app, acct.id) == 97  # charged once


def test_idempotent_replay_and_reuse(entries, make_account, mod):
    acct = make_account(cents=100)
    client, handed = entries
    first = _post(client, acct, {"action": "ok"}, headers={"Idempotency-Key": "k-1"})
    replay = _post(client, acct, {"action": "ok"}, headers={"Idempotency-Key": "k-1"})
    assert "Idempotent-Replayed" not in first.headers and replay.headers["Idempotent-Replayed"] == "true"
    assert first.get_data() == replay.get_data()
    reused = _post(client, acct, {"action": "ok", "x": 1}, headers={"Idempotency-Key": "k-1"})
    assert reused.status_code == 409 and reused.get_json()["error"] == "idempotency_key_reused"
    assert handed == []


@pytest.mark.parametrize("case", ["no_credential", "bad_credential", "malformed_header", "scope",
                                  "unknown_module", "unknown_action", "payment_required",
                                  "provider_error", "long_key"])
def test_refusals_are_answered_here(case, entries, make_account, mod):
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
    client, handed = entries
    r = _post(client, acct, body, **kw)
    expected = {"no_credential": (401, "unauthorized"), "bad_credential": (401, "unauthorized"),
                "malformed_header": (401, "unauthorized"), "scope": (403, "insufficient_scope"),
                "unknown_module": (404, "module_not_found"), "unknown_action": (404, "unknown_action"),
                "payment_required": (402, "payment_required"), "provider_error": (502, "provider_error"),
                "long_key": (400, "invalid_request")}[case]
    assert (r.status_code, r.get_json()["error"]) == expected
    assert r.get_json()["request_id"] == r.headers["X-Request-Id"] == "req-parity"
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
    client, handed = entries
    r = _post(client, acct, body, **kw)
    assert handed == ["/v1/module/svc/call"]
    expected = {"missing_action": 400, "not_json_text": 400, "array": 400, "text_plain": 400,
                "payment_header": 200, "json_suffix_type": 200, "chunked": 400}[case]  # (the balance covers:
    # an unreadable payment header is not read; a chunked body is not read by Flask's loader)
    assert r.status_code == expected, r.get_data()[:300]


def test_rate_limited_here(app, entries, make_account, mod, monkeypatch):
    monkeypatch.setitem(app.config["PLANS"], "starter", {"plan_cents": 2000, "rate_limit": "1/hour"})
    a = make_account(cents=100)
    client, handed = entries
    assert _post(client, a, {"action": "ok"}).headers["RateLimit-Remaining"] == "0"
    r = _post(client, a, {"action": "ok"})
    assert r.status_code == 429 and r.get_json()["error"] == "rate_limited" and r.headers["Retry-After"]
    assert r.headers["RateLimit-Limit"] == "1" and r.headers["RateLimit-Remaining"] == "0"
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
        client, handed = entries
        r = _post(client, acct, {"action": "ok"})
    assert r.status_code == 500 and r.get_json()["error"] == "internal_error" and handed == []
    inside = [rec for rec in caplog.records if rec.getMessage() == "inside the call"]
    assert [rec.request_id for rec in inside] == ["req-parity"]
    assert [rec.account_id for rec in inside] == [acct.id]
    assert sum(rec.getMessage() == "unhandled error" for rec in caplog.records) == 1


def test_access_line_and_metrics(entries, make_account, mod, caplog):
    acct = make_account(cents=100)
    client, _ = entries
    caplog.handler.addFilter(logs._ContextFilter())  # as the app's handler does
    before = _count(ROUTE, "200")
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        r = _post(client, acct, {"action": "ok"})
        r.get_data()  # written: the line and the count follow the answer
    assert r.status_code == 200 and _count(ROUTE, "200") == before + 1
    (rec,) = [r for r in caplog.records if r.name == "gateway.access"]
    line = {k: getattr(rec, k) for k in ("method", "route", "path", "status", "request_id", "account_id")}
    assert line == {"method": "POST", "route": ROUTE, "path": "/v1/module/svc/call", "status": 200,
                    "request_id": "req-parity", "account_id": acct.id}
    assert rec.duration_ms > 0


def test_access_line_and_metrics_come_after_the_answer_is_written(app, make_account, mod, caplog):
    """The caller does not wait for the access line or the metrics: the entry's answer
    logs and counts once the server has written its body (it asks the iterable for more,
    or closes it: PEP 3333). Failed before: both ran before the answer was handed back."""
    from werkzeug.test import EnvironBuilder

    acct = make_account(cents=100)
    caplog.handler.addFilter(logs._ContextFilter())  # as the app's handler does
    environ = EnvironBuilder(path="/v1/module/svc/call", method="POST", json={"action": "ok"},
                             headers={"Authorization": f"Bearer {acct.key}", "X-Request-Id": "req-after"}).get_environ()
    before = _count(ROUTE, "200")
    statuses = []
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        answer = iter(app.wsgi_app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
        body = next(answer)  # being written
        assert statuses == ["200 OK"] and b'"receipt"' in body
        assert [r for r in caplog.records if r.name == "gateway.access"] == []
        assert _count(ROUTE, "200") == before
        assert next(answer, None) is None  # written: the server asks for more
    (rec,) = [r for r in caplog.records if r.name == "gateway.access"]
    assert (rec.status, rec.request_id, rec.account_id) == (200, "req-after", acct.id)
    assert _count(ROUTE, "200") == before + 1


def _count(route, status):
    return metrics.HTTP_REQUESTS.labels("POST", route, status)._value.get()


def test_body_handed_over_is_the_body_sent(entries, make_account, mod):
    """A body the fast loader declines reaches Flask byte for byte (its 400 names the field)."""
    acct = make_account(cents=100)
    client, handed = entries
    r = _post(client, acct, {"action": ""})
    assert r.status_code == 400 and "action" in r.get_json()["message"] and handed


def test_always_installed_tracing_and_host_matching_included(monkeypatch):
    """One entry for the plain case whatever the configuration: no switch turns it off."""
    from app import create_app
    from tests.conftest import base_config

    for config in ({}, {"SERVER_NAME": "gw.example"}):
        assert isinstance(create_app(base_config(**config)).wsgi_app, HotPath)


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
        r.get_data()  # written: the access line follows the answer
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


def test_chat_completion_is_answered_here_and_not_handed(app, entries, make_account, chat_fakes, caplog):
    """Status, X-Chat-* headers, body and money of a plain completion, answered by the thin
    entry itself with its access line and request count."""
    from app.services.money import ledger

    acct = make_account(cents=100)
    client, handed = entries
    caplog.handler.addFilter(logs._ContextFilter())
    before_count, before = _count(CHAT_ROUTE, "200"), _micros(app, acct.id)
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        r = _chat(client, acct)
        r.get_data()  # written: the access line and the count follow the answer
    assert r.status_code == 200, r.get_json()
    assert handed == [] and _count(CHAT_ROUTE, "200") == before_count + 1
    assert int(r.headers["Content-Length"]) == len(r.get_data())
    assert r.headers["X-Chat-Model"] and r.headers["X-Chat-Completion-Id"] and r.headers["X-Chat-Cost-Micros"]
    assert r.headers["X-Request-Id"] == "req-parity" and r.headers["RateLimit-Limit"]
    body = r.get_json()
    assert body["object"] == "chat.completion" and body["usage"]["cost_usd"] > 0
    assert before - _micros(app, acct.id) == body["usage"]["cost_micros"] == int(r.headers["X-Chat-Cost-Micros"])
    (rec,) = [x for x in caplog.records if x.name == "gateway.access"]
    assert (rec.route, rec.status, rec.request_id, rec.account_id) == (CHAT_ROUTE, 200, "req-parity", acct.id)
    with app.app_context():
        assert ledger.check() == []


@pytest.mark.parametrize("case", ["no_credential", "scope", "payment_required", "unknown_model"])
def test_chat_refusals_are_answered_here(case, entries, make_account, chat_fakes):
    acct = make_account(cents=0 if case == "payment_required" else 100,
                        scopes=("keys:read",) if case == "scope" else None)
    body = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]} if case == "unknown_model" else None
    if case == "no_credential":
        acct = None
    client, handed = entries
    a = _chat(client, acct, body)
    expected = {"no_credential": 401, "scope": 403, "payment_required": 402, "unknown_model": 404}[case]
    assert a.status_code == expected and handed == []
    assert a.headers["X-Request-Id"] == "req-parity"
    # the chat host's OpenAI error shape
    error = a.get_json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["code"] and error["message"]


@pytest.mark.parametrize("case", ["stream", "not_plain", "off_chat_host", "x402"])
def test_chat_streams_schema_errors_and_other_hosts_go_to_flask(case, app, entries, make_account, chat_fakes,
                                                                monkeypatch):
    acct = make_account(cents=100)
    client, handed = entries
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
    r = _chat(client, acct, body, headers=headers)
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
    Flask answers 404 (werkzeug's reading decides which entry answers)."""
    monkeypatch.setitem(app.config, "CHAT_HOST", "chat.example")
    acct = make_account(cents=100)
    client, handed = entries
    a = _chat(client, acct, environ_overrides={"HTTP_HOST": host})
    expected = 200 if host in ("chat.example", "CHAT.Example:8080") else 404
    assert a.status_code == expected
    assert handed == ([] if expected == 200 else [CHAT_ROUTE])


@pytest.mark.parametrize("number", [b"123456789012345678901234567890", b"18446744073709551616",
                                    b"-9223372036854775809"])
def test_an_integer_beyond_64_bits_is_refused_not_rounded(app, entries, make_account, mod, number):
    """orjson reads such an integer as a float: the provider would have got 1.2345678901234568e+29
    for the caller's 123456789012345678901234567890. A clear 422 instead (valid JSON, valid by the
    document: a rule the schema cannot state), nothing charged."""
    acct = make_account(cents=100)
    client, handed = entries
    r = _post(client, acct, data=b'{"action": "ok", "n": ' + number + b"}", content_type="application/json")
    assert r.status_code == 422 and r.get_json()["error"] == "unprocessable"
    assert "64-bit" in r.get_json()["message"] and "as strings" in r.get_json()["message"]
    assert balance_cents(app, acct.id) == 100


def test_long_digits_within_range_or_in_strings_reach_the_provider_exactly(app, entries, make_account, mod):
    acct = make_account(cents=100)
    client, handed = entries
    raw = (b'{"action": "ok", "max": 18446744073709551615, "min": -9223372036854775808, '
           b'"s": "123456789012345678901234567890", "f": 0.12345678901234567890}')
    r = _post(client, acct, data=raw, content_type="application/json")
    assert r.status_code == 200 and handed == []
    echo = r.get_json()["result"]["echo"]
    assert (echo["max"], echo["min"], echo["s"]) == (2 ** 64 - 1, -(2 ** 63), "123456789012345678901234567890")


def test_a_body_that_is_not_json_is_told_so(app, entries, make_account, mod):
    """A JSON body sent as text/plain was answered "action: Missing data for required field"."""
    acct = make_account(cents=100)
    client, handed = entries
    r = _post(client, acct, data=b'{"action": "ok"}', content_type="text/plain")
    assert r.status_code == 400 and "Content-Type: application/json" in r.get_json()["message"]
    assert balance_cents(app, acct.id) == 100
