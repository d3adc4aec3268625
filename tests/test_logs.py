"""Logs: JSON lines carry request id, account id and call id; one access line per
request; secrets (API keys, bearer tokens) never appear, whoever logs them."""
from __future__ import annotations

import io
import json
import logging
import random

import pytest
from flask import g

from app.logs import make_handler, redact


@pytest.fixture
def captured():
    """Everything logged during the test, as the production JSON formatter writes it."""
    stream = io.StringIO()
    handler = make_handler(json=True, stream=stream)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _lines(stream) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_access_line_per_request_with_ids(client, account, captured):
    r = client.get("/api/account", headers={**account.headers, "X-Request-Id": "trace-42"})
    assert r.status_code == 200
    access = [line for line in _lines(captured) if line["logger"] == "gateway.access"]
    assert len(access) == 1
    line = access[0]
    assert line["method"] == "GET" and line["route"] == "/api/account" and line["status"] == 200
    assert line["request_id"] == "trace-42" and line["account_id"] == account.id
    assert isinstance(line["duration_ms"], float) and line["client_ip"] == "127.0.0.1"
    assert line["ts"].endswith("Z") and line["level"] == "INFO"


def test_call_id_is_attached_to_records_of_the_request(app, captured):
    with app.test_request_context("/v1/module/x/call"):
        g.request_id, g.account_id, g.call_id = "req_1", "acct_1", "call_1"
        logging.getLogger("app.test").info("provider answered")
    line = [x for x in _lines(captured) if x["logger"] == "app.test"][0]
    assert (line["request_id"], line["account_id"], line["call_id"]) == ("req_1", "acct_1", "call_1")


def test_no_key_or_token_ever_reaches_the_logs(client, account, captured):
    # A key minted through the API, used, revoked, then used again (401) ...
    created = client.post("/api/keys", json={"name": "ci"}, headers=account.headers)
    assert created.status_code == 201
    new_key = created.get_json()["key"]
    auth = {"Authorization": f"Bearer {new_key}"}
    assert client.get("/api/account", headers=auth).status_code == 200
    assert client.get("/api/account?api_key=" + new_key, headers=auth).status_code == 200
    client.delete(f"/api/keys/{created.get_json()['id']}", headers=account.headers)
    assert client.get("/api/account", headers=auth).status_code == 401
    # ... and careless code logging a key, a header and an exception that mentions one.
    log = logging.getLogger("app.careless")
    log.warning("calling upstream with key %s", account.key)
    log.info("headers: %s", {"Authorization": f"Bearer {new_key}"})
    try:
        raise ValueError(f"bad credential {new_key}")
    except ValueError:
        log.exception("failed")
    out = captured.getvalue()
    assert "gateway.access" in out and "app.careless" in out  # the lines were captured
    for secret in (new_key, account.key, new_key[9:], account.key[9:]):
        assert secret not in out
    assert "[redacted]" in out
    assert "api_key=" not in out  # query strings are never logged


def test_redact_patterns():
    assert redact("k=svc_live_abcDEF123 t=svc_sess_XyZ9") == "k=[redacted] t=[redacted]"
    assert redact("Authorization: Bearer abc.def-ghi") == "Authorization: Bearer [redacted]"
    assert redact("stripe sk_live_51Habc and whsec_abc+/=") == "stripe [redacted] and [redacted]"
    assert redact("acct_123 key_456 req_789") == "acct_123 key_456 req_789"


def test_job_id_is_attached_to_records_of_an_rq_job(captured):
    from types import SimpleNamespace

    from rq.job import _current_job  # what rq sets while a worker runs a job

    token = _current_job.set(SimpleNamespace(id="job-123"))
    try:
        logging.getLogger("app.tasks.test").info("sending")
    finally:
        _current_job.reset(token)
    logging.getLogger("app.tasks.test").info("idle")
    lines = [x for x in _lines(captured) if x["logger"] == "app.tasks.test"]
    assert lines[0]["job_id"] == "job-123" and "job_id" not in lines[1]


def test_records_skip_the_caller_lookup_but_keep_the_process(app):  # noqa: ARG001
    """init_logging turns off what no formatter prints (source line, thread): finding the
    caller walked the stack on every record. gunicorn's text format prints the pid."""
    import logging

    record = logging.getLogger("gateway.access").makeRecord("x", logging.INFO, None, 0, "m", (), None)
    assert logging._srcfile is None and logging.logThreads is False
    assert record.thread is None and record.process is not None


def test_the_marker_gate_never_skips_a_line_the_patterns_would_change():
    """``redact`` skips the regex for lines without any of ``_SECRET_MARKERS``: for random
    lines built from the patterns' own pieces, the result is the regex's every time."""
    from app.logs import _SECRET_PATTERNS

    rng = random.Random(18)
    pieces = ["svc_", "live", "test", "sess", "_", "sk", "rk", "pk", "whsec", "Bearer ", "bearer ",
              "earer", "abc", "Z9", "+/=", " ", "-", ".", "acct_1", "k="]
    for _ in range(20_000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        assert redact(line) == _SECRET_PATTERNS.sub("[redacted]", line), line
