"""Alert endpoints (SPEC 21–24): create/list/delete, validation, limits, isolation, scopes,
and the events list with delivery state."""
from __future__ import annotations

from datetime import timedelta

import pytest

from app.models.base import utcnow
from tests.support.alerts import confirm_target

GOOD = {"name": "Daily spend", "metric": "spend_cents", "op": ">", "threshold": 500,
        "window": "day", "channel": "email", "target": "Ops@Example.com"}


def test_create_list_delete(client, account):
    r = client.post("/api/alerts", json=GOOD, headers=account.headers)
    assert r.status_code == 201, r.get_json()
    body = r.get_json()
    assert body["id"].startswith("alrt_") and body["secret"] is None
    assert body["target"] == "ops@example.com" and body["threshold"] == 500.0 and body["created_at"]
    hook = client.post("/api/alerts", json={**GOOD, "channel": "webhook",
                                            "target": "https://hooks.example.com/x"},
                       headers=account.headers).get_json()
    assert hook["secret"].startswith("whsec_")
    listed = client.get("/api/alerts", headers=account.headers).get_json()["alerts"]
    assert [a["id"] for a in listed] == [body["id"], hook["id"]]
    assert all("secret" not in a for a in listed)  # shown once, at creation
    r = client.delete(f"/api/alerts/{body['id']}", headers=account.headers)
    assert r.status_code == 200 and r.get_json() == {"deleted": True, "id": body["id"]}
    assert [a["id"] for a in client.get("/api/alerts", headers=account.headers).get_json()["alerts"]] == [hook["id"]]


def test_deleting_an_alert_again_answers_as_the_first_time(client, account):
    """A client that lost the first DELETE's answer and retries (the Python client retries a
    DELETE after a 5xx or a lost connection) gets 200 and the same body, as revoking a key
    twice does; it was 404, so the retry reported NotFound though the alert was deleted. The
    second one changes nothing (one audit entry). An unknown id is still 404."""
    alert_id = client.post("/api/alerts", json=GOOD, headers=account.headers).get_json()["id"]
    first = client.delete(f"/api/alerts/{alert_id}", headers=account.headers)
    again = client.delete(f"/api/alerts/{alert_id}", headers=account.headers)
    assert (again.status_code, again.get_json()) == (200, first.get_json()) == (200, {"deleted": True, "id": alert_id})
    entries = client.get("/api/audit", headers=account.headers).get_json()["entries"]
    assert [e["action"] for e in entries if e["target"] == alert_id] == ["alert.delete", "alert.create"]
    r = client.delete("/api/alerts/alrt_nope", headers=account.headers)
    assert r.status_code == 404 and r.get_json()["error"] == "not_found"


def test_a_retried_create_with_an_idempotency_key_makes_one_alert(client, account):
    """A client that lost the 201 (a timeout) and retries with its Idempotency-Key gets
    the first answer, webhook secret included, and no second alert; the same key with
    another body is 409. Before, the retry made a second alert (and a second e-mail
    confirmation for an e-mail target)."""
    hook = {**GOOD, "channel": "webhook", "target": "https://hooks.example.com/x"}
    headers = {**account.headers, "Idempotency-Key": "alert-create-1"}
    first = client.post("/api/alerts", json=hook, headers=headers)
    assert first.status_code == 201 and "Idempotent-Replayed" not in first.headers
    again = client.post("/api/alerts", json=hook, headers=headers)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json() == first.get_json() and again.get_json()["secret"].startswith("whsec_")
    other = client.post("/api/alerts", json={**hook, "threshold": 7}, headers=headers)
    assert other.status_code == 409 and other.get_json()["error"] == "idempotency_key_reused"
    listed = client.get("/api/alerts", headers=account.headers).get_json()["alerts"]
    assert [a["id"] for a in listed] == [first.get_json()["id"]]
    # without a key every POST is a new alert, as before
    assert client.post("/api/alerts", json=GOOD, headers=account.headers).status_code == 201
    assert client.post("/api/alerts", json=GOOD, headers=account.headers).status_code == 201
    assert len(client.get("/api/alerts", headers=account.headers).get_json()["alerts"]) == 3


def test_a_refused_create_releases_its_idempotency_key(app, client, account):
    """A create that failed did nothing: the same key may be used again (with a fixed body)."""
    headers = {**account.headers, "Idempotency-Key": "alert-create-2"}
    app.config["ALLOW_PRIVATE_URLS"] = False
    try:
        bad = client.post("/api/alerts", json={**GOOD, "channel": "webhook", "target": "https://127.0.0.1/x"},
                          headers=headers)
    finally:
        app.config["ALLOW_PRIVATE_URLS"] = True
    assert bad.status_code == 422, bad.get_json()  # the SSRF guard
    assert client.post("/api/alerts", json=GOOD, headers=headers).status_code == 201


@pytest.mark.parametrize("patch,field", [
    ({"metric": "latency"}, "metric"), ({"op": "=="}, "op"), ({"window": "year"}, "window"),
    ({"channel": "sms"}, "channel"), ({"threshold": "NaN"}, "threshold"),
    ({"threshold": "Infinity"}, "threshold"), ({"threshold": -1}, "threshold"),
    ({"threshold": True}, "threshold"), ({"threshold": "500"}, "threshold"), ({"name": ""}, "name"), ({"target": "not-an-email"}, "target"),
    ({"channel": "webhook", "target": "ftp://example.com/x"}, "target"),
    ({"channel": "chat", "target": "not a url"}, "target"),
])
def test_validation(client, account, patch, field):
    r = client.post("/api/alerts", json={**GOOD, **patch}, headers=account.headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    assert field in r.get_json()["message"]
    assert client.get("/api/alerts", headers=account.headers).get_json()["alerts"] == []


@pytest.mark.parametrize("missing", list(GOOD))
def test_all_fields_required(client, account, missing):
    body = {k: v for k, v in GOOD.items() if k != missing}
    r = client.post("/api/alerts", json=body, headers=account.headers)
    assert r.status_code == 400 and missing in r.get_json()["message"]


def test_private_webhook_target_refused_in_production_setting(app, client, account):
    app.config["ALLOW_PRIVATE_URLS"] = False
    try:
        for url in ("https://127.0.0.1/hook", "https://169.254.169.254/latest", "https://10.0.0.8/x",
                    "http://hooks.example.com/x"):
            r = client.post("/api/alerts", json={**GOOD, "channel": "chat", "target": url},
                            headers=account.headers)
            assert r.status_code == 422 and "target" in r.get_json()["message"], url  # the SSRF guard
    finally:
        app.config["ALLOW_PRIVATE_URLS"] = True


def test_per_account_maximum(app, client, account, make_account):
    app.config["ALERTS_MAX_PER_ACCOUNT"] = 3
    try:
        ids = [client.post("/api/alerts", json=GOOD, headers=account.headers).get_json()["id"]
               for _ in range(3)]
        r = client.post("/api/alerts", json=GOOD, headers=account.headers)
        assert r.status_code == 409 and r.get_json()["error"] == "alert_limit_reached"
        other = make_account()
        assert client.post("/api/alerts", json=GOOD, headers=other.headers).status_code == 201
        client.delete(f"/api/alerts/{ids[0]}", headers=account.headers)
        assert client.post("/api/alerts", json=GOOD, headers=account.headers).status_code == 201
    finally:
        app.config.pop("ALERTS_MAX_PER_ACCOUNT")


def test_other_accounts_alert_is_404(client, make_account):
    a, b = make_account(), make_account()
    alert_id = client.post("/api/alerts", json=GOOD, headers=a.headers).get_json()["id"]
    r = client.delete(f"/api/alerts/{alert_id}", headers=b.headers)
    assert r.status_code == 404 and r.get_json()["error"] == "not_found"
    assert client.get("/api/alerts", headers=b.headers).get_json()["alerts"] == []
    assert len(client.get("/api/alerts", headers=a.headers).get_json()["alerts"]) == 1


def test_scopes(client, make_account):
    reader = make_account(scopes=["alerts:read"])
    assert client.get("/api/alerts", headers=reader.headers).status_code == 200
    assert client.get("/api/alerts/events", headers=reader.headers).status_code == 200
    r = client.post("/api/alerts", json=GOOD, headers=reader.headers)
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"
    nobody = make_account(scopes=["keys:read"])
    assert client.get("/api/alerts/events", headers=nobody.headers).status_code == 403
    assert client.get("/api/alerts").status_code == 401


def test_events_newest_first_limited_to_100_with_delivery_state(app, client, account, make_account):
    from app.extensions import db
    from app.services.billing import alerts
    from tests import usage_seed

    alert_id = client.post("/api/alerts", json={**GOOD, "window": "hour", "threshold": 0, "op": ">="},
                           headers=account.headers).get_json()["id"]
    confirm_target(app, alert_id)
    other = make_account()
    confirm_target(app, client.post("/api/alerts", json={**GOOD, "threshold": 0, "op": ">="},
                                    headers=other.headers).get_json()["id"])
    start = utcnow() - timedelta(hours=105)
    with app.app_context():
        usage_seed.record(account.id, "mod", spend_micros=10_000, at=utcnow())
        db.session.commit()
        for h in range(105):  # one firing per hour period
            alerts.evaluate_all(start + timedelta(hours=h), dispatch=False)
    events = client.get("/api/alerts/events", headers=account.headers).get_json()["events"]
    assert len(events) == 100
    assert [e["fired_at"] for e in events] == sorted((e["fired_at"] for e in events), reverse=True)
    e = events[0]
    assert e["alert_id"] == alert_id and e["metric"] == "spend_cents" and e["op"] == ">="
    assert e["threshold"] == 0 and e["window"] == "hour" and e["channel"] == "email"
    assert e["delivery_status"] == "pending" and e["attempts"] == 0 and e["next_attempt_at"]
    assert {"value", "period", "delivered_at", "last_error", "name", "id"} <= set(e)
    assert len({x["period"] for x in events}) == 100
    other_events = client.get("/api/alerts/events", headers=other.headers).get_json()["events"]
    assert other_events and all(x["alert_id"] != alert_id for x in other_events)


def test_openapi_documents_alert_shapes(client):
    spec = client.get("/openapi.json").get_json()
    post = spec["paths"]["/api/alerts"]["post"]
    assert post["security"] == [{"bearerAuth": ["alerts:write"]}] and "409" in post["responses"]
    assert spec["paths"]["/api/alerts/events"]["get"]["security"] == [{"bearerAuth": ["alerts:read"]}]
    names = spec["components"]["schemas"]
    assert {"delivery_status", "attempts", "value", "period"} <= set(names["AlertEvent"]["properties"])
    assert "alert_limit_reached" in spec["x-error-codes"]
