"""Product analytics: ingestion limits, attribution, CORS, funnel order, admin views."""
from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from sqlalchemy import insert, select

from tests.support.sqlevents import listening
from app.extensions import db
from app.models import TrackEvent
from app.models.base import utcnow


def _events(app):
    with app.app_context():
        rows = db.session.execute(select(TrackEvent).order_by(TrackEvent.id)).scalars().all()
        out = [(r.event, r.session_id, r.account_id, r.props) for r in rows]
        db.session.remove()
    return out


def test_track_stores_event_and_returns_204(app, client):
    r = client.post("/api/track", json={"event": "signup_started", "session_id": "s1",
                                        "props": {"plan": "pro", "n": 1}})
    assert r.status_code == 204 and r.data == b""
    assert _events(app) == [("signup_started", "s1", None, {"plan": "pro", "n": 1})]


def test_anonymous_track_is_one_insert(app, client):
    statements = []

    def record(conn, cursor, statement, *args):
        if "gw_rate_hit" not in statement:  # the per-IP count in PostgreSQL (no Redis): not the event's
            statements.append(statement.split()[0].upper())

    from app.services.public import tracking

    with app.app_context():
        engine = db.engine
    client.post("/api/track", json={"event": "warmup"})
    with listening(engine, ("before_cursor_execute", record)):
        assert client.post("/api/track", json={"event": "page_view", "session_id": "s"}).status_code == 204
    assert statements == ["INSERT"]


def test_async_commit_only_for_the_event_insert(app, client):
    """The insert skips the WAL-flush wait for its own transaction only: the pool's
    connections (all of the process's statements share them) commit durably after it.
    Failed before: a second pool whose sessions all had synchronous_commit=off (and a
    startup parameter PgBouncer refuses). The test database's own default is off
    (tests/support/workers.py ``relax_durability``): the pool's connections start at on
    here, as on a production server, so a setting that outlived the insert shows."""
    from sqlalchemy import text

    from app.services.public import tracking
    from app.services.platform import uow

    def server_default(dbapi_conn, record):
        with dbapi_conn.cursor() as cur:
            cur.execute("SET synchronous_commit = on")
        dbapi_conn.commit()

    assert "set_config('synchronous_commit', 'off', true)" in tracking._INSERT_ASYNC
    with app.app_context(), listening(db.engine, ("connect", server_default)):
        db.engine.dispose()
        assert client.post("/api/track", json={"event": "page_view"}).status_code == 204
        assert uow.run_one("SHOW synchronous_commit", {}) == [("on",)]
        assert db.session.execute(text("SHOW synchronous_commit")).scalar() == "on"
        db.session.remove()
        db.engine.dispose()  # the next tests' connections: the test database's default again
    assert [e[0] for e in _events(app)] == ["page_view"]


def test_track_attributed_to_valid_key_and_invalid_key_refused(app, client, account):
    assert client.post("/api/track", json={"event": "key_created"}, headers=account.headers).status_code == 204
    assert _events(app)[0][2] == account.id
    bad = client.post("/api/track", json={"event": "x"}, headers={"Authorization": "Bearer svc_live_nope"})
    assert bad.status_code == 401 and bad.get_json()["error"] == "unauthorized"
    assert len(_events(app)) == 1


@pytest.mark.parametrize("body, field", [
    ({"event": ""}, "event"),
    ({"event": "a" * 65}, "event"),
    ({"event": "bad name"}, "event"),
    ({"event": "ok\n"}, "event"),
    ({"event": "<script>"}, "event"),
    ({}, "event"),
    ({"event": "ok", "session_id": "s" * 129}, "session_id"),
    ({"event": "ok", "props": [1, 2]}, "props"),
    ({"event": "ok", "props": "str"}, "props"),
    ({"event": "ok", "props": {"a": {"b": {"c": {"d": 1}}}}}, "props"),
    ({"event": "ok", "props": {"a": [[[1]]]}}, "props"),
    ({"event": "ok", "extra": 1}, "extra"),
    ({"event": "ok", "session_id": "a\u0000b"}, "session_id"),
    ({"event": "ok", "session_id": "a\nb"}, "session_id"),
])
def test_track_validation(app, client, body, field):
    r = client.post("/api/track", json=body)
    assert r.status_code == 400, r.data
    j = r.get_json()
    assert j["error"] == "invalid_request" and field in j["message"] and j["request_id"]
    assert _events(app) == []


def test_props_over_4096_bytes_is_422_and_stores_nothing(app, client):
    """The serialised size is a rule JSON Schema cannot state: 422 `unprocessable` naming
    `props` (docs/decisions.md, "Schema-valid requests"), not a 400 for a request the
    document accepts. The limit counts bytes of compact JSON, so multi-byte text counts
    as its UTF-8 length."""
    r = client.post("/api/track", json={"event": "ok", "props": {"blob": "x" * 4100}})
    assert r.status_code == 422, r.data
    j = r.get_json()
    assert j["error"] == "unprocessable" and "props" in j["message"] and "4,096" in j["message"]
    r = client.post("/api/track", json={"event": "ok", "props": {"t": "é" * 2100}})  # 4,200 bytes
    assert r.status_code == 422, r.data
    assert _events(app) == []
    assert client.post("/api/track", json={"event": "ok", "props": {"t": "x" * 4086}}).status_code == 204


def test_nul_in_props_stored_as_replacement_character(app, client):
    r = client.post("/api/track", json={"event": "x", "props": {"k\u0000": ["v\u0000", {"n": "\u0000"}]}})
    assert r.status_code == 204
    assert _events(app)[0][3] == {"k\ufffd": ["v\ufffd", {"n": "\ufffd"}]}
    client.post("/api/track", json={"event": "x", "props": {"k": "\\u0000 literal", "z": "\u0000"}})
    assert _events(app)[1][3] == {"k": "\\u0000 literal", "z": "\ufffd"}


def test_track_accepts_limits_exactly(app, client):
    props = {"a": {"b": {"c": 1}}, "s": "x" * 3900}
    assert client.post("/api/track", json={"event": "a" * 64, "session_id": "s" * 128,
                                           "props": props}).status_code == 204
    assert client.post("/api/track", json={"event": "A-z_0.9:x"}).status_code == 204


def test_track_malformed_and_oversized_bodies(app, client):
    r = client.post("/api/track", data=b'{"event": ', content_type="application/json")
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    deep = b"[" * 2000 + b"]" * 2000
    assert client.post("/api/track", data=deep, content_type="application/json").status_code == 400
    big = orjson.dumps({"event": "x", "props": {"p": "y" * 9000}})
    r = client.post("/api/track", data=big, content_type="application/json")
    assert r.status_code == 413 and r.get_json()["error"] == "payload_too_large"
    assert _events(app) == []


def test_cors_preflight_and_response_headers(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "CORS_ORIGINS", "https://shop.example, https://app.example")
    pre = client.options("/api/track", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert pre.status_code == 200
    assert pre.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    assert "authorization" in pre.headers["Access-Control-Allow-Headers"].lower()
    assert "Origin" in pre.headers["Vary"]
    other = client.options("/api/track", headers={"Origin": "https://evil.example",
                                                  "Access-Control-Request-Method": "POST"})
    assert "Access-Control-Allow-Origin" not in other.headers
    # actual responses (errors included) carry the header so the browser can read them
    err = client.post("/api/track", json={"event": ""}, headers={"Origin": "https://shop.example"})
    assert err.status_code == 400 and err.headers["Access-Control-Allow-Origin"] == "https://shop.example"
    # the other public endpoints a website posts to from the browser speak it too (until
    # 2026-11-29 only /api/track: a site's contact, newsletter or sign-up form on its own
    # origin could not read the answer); the rest of the API does not
    for path in ("/api/contact", "/api/email/subscribe", "/api/email/unsubscribe", "/api/signup"):
        pre = client.options(path, headers={"Origin": "https://shop.example", "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "content-type"})
        assert pre.headers.get("Access-Control-Allow-Origin") == "https://shop.example", path
        assert "content-type" in pre.headers["Access-Control-Allow-Headers"].lower(), path
        bad = client.post(path, json={}, headers={"Origin": "https://shop.example"})
        assert bad.status_code == 400 and bad.headers["Access-Control-Allow-Origin"] == "https://shop.example", path
        assert "Access-Control-Allow-Origin" not in client.post(
            path, json={}, headers={"Origin": "https://evil.example"}).headers, path
    for path in ("/api/account", "/api/signup/confirm", "/api/track/funnel"):
        assert "Access-Control-Allow-Origin" not in client.options(
            path, headers={"Origin": "https://shop.example", "Access-Control-Request-Method": "POST"}).headers, path
    # an origin configured as a URL (trailing slash, capitals) is the origin browsers send
    monkeypatch.setitem(app.config, "CORS_ORIGINS", "https://Shop.Example/ , https://app.example:8443/")
    for origin in ("https://shop.example", "https://app.example:8443"):
        r = client.post("/api/track", json={"event": "x"}, headers={"Origin": origin})
        assert r.status_code == 204 and r.headers["Access-Control-Allow-Origin"] == origin
    monkeypatch.setitem(app.config, "CORS_ORIGINS", "*")
    ok = client.post("/api/track", json={"event": "x"}, headers={"Origin": "https://any.example"})
    assert ok.status_code == 204 and ok.headers["Access-Control-Allow-Origin"] == "*"
    monkeypatch.setitem(app.config, "CORS_ORIGINS", "")
    assert "Access-Control-Allow-Origin" not in client.post(
        "/api/track", json={"event": "x"}, headers={"Origin": "https://any.example"}).headers


def test_track_rate_limited_per_ip(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "TRACK_RATE_LIMIT", "3/minute")
    a = {"REMOTE_ADDR": "203.0.113.7"}
    codes = [client.post("/api/track", json={"event": "x"}, environ_base=a).status_code for _ in range(4)]
    assert codes == [204, 204, 204, 429]
    r = client.post("/api/track", json={"event": "x"}, environ_base=a, headers={"Origin": "https://o.example"})
    j = r.get_json()
    assert r.status_code == 429 and j["error"] == "rate_limited" and j["request_id"] and j["message"]
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    # another client IP is not affected
    assert client.post("/api/track", json={"event": "x"}, environ_base={"REMOTE_ADDR": "203.0.113.8"}).status_code == 204


def test_rate_limit_uses_real_client_ip_behind_proxy(app, monkeypatch):
    from app import create_app
    from tests.conftest import base_config

    proxied = create_app(base_config(TRUSTED_PROXIES=1, TRACK_RATE_LIMIT="2/minute"))
    c = proxied.test_client()

    def send(ip):
        return c.post("/api/track", json={"event": "x"}, headers={"X-Forwarded-For": ip}).status_code

    assert [send("198.51.100.1") for _ in range(3)] == [204, 204, 429]
    assert send("198.51.100.2") == 204  # same proxy address, different real client


def _add(app, rows):
    now = utcnow()
    with app.app_context():
        db.session.execute(insert(TrackEvent.__table__), [
            {"event": ev, "session_id": sid, "account_id": acct, "props": None,
             "created_at": now - timedelta(minutes=mins)} for ev, sid, acct, mins in rows])
        db.session.commit()
        db.session.remove()


STEPS = "signup_started,signup_completed,key_created,first_call,payment_completed"


def test_funnel_counts_ordered_steps(app, client, make_account):
    user = make_account()
    admin = make_account(admin=True)
    old = 8 * 24 * 60
    _add(app, [
        # s1: all five in order
        ("signup_started", "s1", user.id, 50), ("signup_completed", "s1", user.id, 40),
        ("key_created", "s1", user.id, 30), ("first_call", "s1", user.id, 20),
        ("payment_completed", "s1", user.id, 10),
        # s2: steps 1-2 in order, step 3 only BEFORE step 2 -> counts for 2 steps
        ("key_created", "s2", user.id, 60), ("signup_started", "s2", user.id, 50),
        ("signup_completed", "s2", user.id, 40), ("first_call", "s2", user.id, 5),
        # s3: step 2 without step 1 -> counts nowhere beyond... step1 0
        ("signup_completed", "s3", user.id, 40),
        # s4: step 1 repeated, step 2 after the second step-1 event
        ("signup_started", "s4", user.id, 50), ("signup_started", "s4", user.id, 30),
        ("signup_completed", "s4", user.id, 20),
        # s5: another account's session, step 1 and 2
        ("signup_started", "s5", admin.id, 50), ("signup_completed", "s5", admin.id, 45),
        # s6: anonymous, step 1 only; s7: outside the 7-day window
        ("signup_started", "s6", None, 50), ("signup_started", "s7", user.id, old),
        ("signup_completed", "s7", user.id, old - 1),
        # no session id: never in a funnel
        ("signup_started", None, user.id, 50),
    ])
    r = client.get("/api/track/funnel", headers=user.headers)
    assert r.status_code == 200
    j = r.get_json()
    assert j["scope"] == "account" and [s["event"] for s in j["steps"]] == STEPS.split(",")
    assert [s["sessions"] for s in j["steps"]] == [3, 3, 1, 1, 1]
    assert j["steps"][2]["conversion_from_previous"] == round(1 / 3, 4)
    assert j["steps"][0]["step"] == 1 and j["steps"][4]["conversion_from_first"] == round(1 / 3, 4)
    g = client.get("/api/track/funnel", headers=admin.headers).get_json()
    assert g["scope"] == "global" and [s["sessions"] for s in g["steps"]] == [5, 4, 1, 1, 1]
    own = client.get("/api/track/funnel?scope=account", headers=admin.headers).get_json()
    assert [s["sessions"] for s in own["steps"]] == [1, 1, 0, 0, 0]
    denied = client.get("/api/track/funnel?scope=global", headers=user.headers)
    assert denied.status_code == 403 and denied.get_json()["error"] == "forbidden"
    assert client.get("/api/track/funnel").status_code == 401


def test_funnel_steps_configurable(app, client, account, monkeypatch):
    monkeypatch.setitem(app.config, "FUNNEL_STEPS", "visit, cart")
    _add(app, [("visit", "a", account.id, 3), ("cart", "a", account.id, 2)])
    j = client.get("/api/track/funnel", headers=account.headers).get_json()
    assert [(s["event"], s["sessions"]) for s in j["steps"]] == [("visit", 1), ("cart", 1)]


def test_funnel_needs_scope(client, make_account):
    weak = make_account(scopes=["account:read"])
    r = client.get("/api/track/funnel", headers=weak.headers)
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"


def test_recent_and_sessions_admin_only(app, client, make_account):
    user, admin = make_account(), make_account(admin=True)
    _add(app, [("e", f"s{i % 3}", None, 250 - i) for i in range(250)]
         + [("old", "gone", None, 120), ("x", "gone", None, 90)])
    for path in ("/api/track/recent", "/api/track/sessions"):
        r = client.get(path, headers=user.headers)
        assert r.status_code == 403 and r.get_json()["error"] == "forbidden"
    events = client.get("/api/track/recent", headers=admin.headers).get_json()["events"]
    assert len(events) == 200 and events[0]["event"] == "e"
    stamps = [e["created_at"] for e in events]
    assert stamps == sorted(stamps, reverse=True)
    sessions = client.get("/api/track/sessions", headers=admin.headers).get_json()["sessions"]
    by_id = {s["session_id"]: s for s in sessions}
    assert "gone" not in by_id  # last event 90 minutes ago
    # s0..s2 had events in the last hour; counts cover the whole session
    assert set(by_id) == {"s0", "s1", "s2"} and sum(s["events"] for s in sessions) == 250
    assert all(s["first_seen"] <= s["last_seen"] for s in sessions)


def test_send_beacon_text_plain_body_is_read_as_json(app, client):
    r = client.post("/api/track", data=b'{"event":"beacon","session_id":"b"}',
                    content_type="text/plain;charset=UTF-8", headers={"Origin": "https://x.example"})
    assert r.status_code == 204 and "Content-Type" not in r.headers
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert _events(app) == [("beacon", "b", None, None)]
    bad = client.post("/api/track", data=b"event=x", content_type="application/x-www-form-urlencoded")
    assert bad.status_code == 400


def test_a_body_that_is_not_a_json_object_is_named_plainly(app, client):
    """``null``, a list or a string as the body: 400 saying the body must be a JSON object
    (before: "_schema: Invalid input type.", marshmallow's internal key), nothing stored."""
    for body in ("null", "[1]", '"signup_started"', "7"):
        for path in ("/api/track", "/api/contact", "/api/email/subscribe"):
            r = client.post(path, data=body, content_type="application/json")
            assert r.status_code == 400, (path, body)
            assert r.get_json()["message"] == "Invalid request: the body must be a JSON object.", (path, body)
    with app.app_context():
        from sqlalchemy import func, select

        from app.extensions import db
        from app.models import TrackEvent
        assert db.session.execute(select(func.count()).select_from(TrackEvent)).scalar_one() == 0
        db.session.remove()


def test_each_broken_rule_is_said_once(client):
    """One message per broken rule: an empty or too long event name is told its length,
    a bad character its alphabet, a session id with a control character that (before: the
    length and the pattern both spoke, "Length must be between 1 and 64. must be 1-64
    characters of …", and a NUL in a session id got three overlapping sentences)."""
    def message(body):
        r = client.post("/api/track", json=body)
        assert r.status_code == 400
        return r.get_json()["message"]

    assert message({"event": ""}) == "Invalid request: event: Length must be between 1 and 64."
    assert message({"event": "x" * 65}) == "Invalid request: event: Length must be between 1 and 64."
    assert message({"event": "sign up"}) == "Invalid request: event: may contain only A-Z a-z 0-9 _ . : -"
    assert message({"event": "x", "session_id": ""}) == \
        "Invalid request: session_id: Length must be between 1 and 128."
    assert message({"event": "x", "session_id": "a\u0000b"}).count("control characters") == 1
