"""Operations endpoints: /healthz, /readyz, /metrics (token guard, route labels, helpers)."""
from __future__ import annotations

import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import create_app, metrics
from tests.conftest import base_config


def _samples(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} of a Prometheus exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _scrape(client, **kw) -> dict:
    r = client.get("/metrics", **kw)
    assert r.status_code == 200, r.get_data(as_text=True)
    assert r.content_type.startswith("text/plain")
    return _samples(r.get_data(as_text=True))


def test_healthz_is_public_and_touches_nothing(client):
    r = client.get("/healthz")
    assert r.status_code == 200 and r.get_json() == {"status": "ok"}
    assert r.headers["X-Request-Id"]


def test_readyz_reports_database_and_redis(client):
    r = client.get("/readyz")
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["status"] == "ok" and body["checks"]["database"]["status"] == "ok"
    assert ("redis" in body["checks"]) == bool(os.environ.get("REDIS_URL"))


@pytest.mark.parametrize("broken", ["database", "redis"])
def test_readyz_is_503_when_a_dependency_is_down(broken):
    # Port 1 on loopback: nothing listens, connections are refused at once.
    over = {"REDIS_URL": "redis://127.0.0.1:1/0"} if broken == "redis" else {
        "SQLALCHEMY_DATABASE_URI": "postgresql+psycopg://postgres@127.0.0.1:1/nope?connect_timeout=2"}
    app = create_app(base_config(**over))
    r = app.test_client().get("/readyz")
    assert r.status_code == 503
    body = r.get_json()
    assert body["error"] == "service_unavailable" and broken in body["message"]
    assert body["checks"][broken]["status"] == "unavailable"
    assert r.headers["Retry-After"] == "5"
    assert app.test_client().get("/healthz").status_code == 200  # liveness does not care


def test_metrics_count_requests_by_url_rule_not_raw_path(client, account):
    before = _scrape(client)
    r = client.delete("/api/keys/key_doesnotexist123", headers=account.headers)
    assert r.status_code == 404
    client.get("/no/such/route")
    after = _scrape(client)
    rule = {"method": "DELETE", "route": "/api/keys/<string:key_id>", "status": "404"}
    assert _value(after, "gateway_http_requests_total", **rule) == \
        _value(before, "gateway_http_requests_total", **rule) + 1
    assert _value(after, "gateway_http_request_duration_seconds_count", **rule) == \
        _value(before, "gateway_http_request_duration_seconds_count", **rule) + 1
    unmatched = {"method": "GET", "route": "<unmatched>", "status": "404"}
    assert _value(after, "gateway_http_requests_total", **unmatched) >= 1
    assert not any("key_doesnotexist123" in str(labels) or "/no/such/route" in str(labels)
                   for _, labels in after)


def test_call_and_provider_error_helpers(client):
    before = _scrape(client)
    metrics.observe_call("weather", "ok", cost_cents=3)
    metrics.observe_call("chat:tiny", "ok", cost_micros=1_234)
    metrics.observe_call("weather", "provider_error")
    metrics.provider_error("weather", "timeout")
    after = _scrape(client)

    def delta(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("gateway_calls_total", module="weather", status="ok") == 1
    assert delta("gateway_calls_total", module="weather", status="provider_error") == 1
    assert delta("gateway_spend_micros_total", module="weather") == 30_000
    assert delta("gateway_spend_micros_total", module="chat:tiny") == 1_234
    assert delta("gateway_provider_errors_total", module="weather", kind="timeout") == 1


def test_metrics_token_guard(app):
    client = app.test_client()
    # No token configured: loopback only (the real client address, after ProxyFix).
    assert client.get("/metrics").status_code == 200
    r = client.get("/metrics", environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert r.status_code == 403 and r.get_json()["error"] == "forbidden"
    app.config["METRICS_TOKEN"] = "s3cret-metrics-token"
    try:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        r = client.get("/metrics", headers={"Authorization": "Bearer s3cret-metrics-token"},
                       environ_base={"REMOTE_ADDR": "203.0.113.9"})
        assert r.status_code == 200 and b"gateway_http_requests_total" in r.data
    finally:
        app.config["METRICS_TOKEN"] = None


def test_metrics_openmetrics_negotiation(client):
    r = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200 and r.content_type.startswith("application/openmetrics-text")
    assert r.get_data(as_text=True).rstrip().endswith("# EOF")


def test_ops_routes_documented(client):
    spec = client.get("/openapi.json").get_json()
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "get" in spec["paths"][path]
    assert spec["paths"]["/healthz"]["get"]["security"] == []
    assert "503" in spec["paths"]["/readyz"]["get"]["responses"]
    assert spec["paths"]["/metrics"]["get"]["security"] == [{"metricsToken": []}, {}]
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")
def test_queue_depth_and_heartbeat_read_at_scrape_time(app, client):
    from app.tasks import enqueue
    from app.tasks.maintenance import heartbeat

    with app.app_context():
        app.config["JOBS_INLINE"] = False
        try:
            enqueue("app.tasks.maintenance.ping", "x")
            enqueue("app.tasks.maintenance.ping", "y")
        finally:
            app.config["JOBS_INLINE"] = True
        assert _value(_scrape(client), "gateway_queue_depth", queue=app.config["RQ_QUEUE"]) == 2
        assert ("gateway_worker_heartbeat_timestamp_seconds", frozenset()) not in _scrape(client)
        when = heartbeat()
    samples = _scrape(client)
    assert samples[("gateway_worker_heartbeat_timestamp_seconds", frozenset())] == pytest.approx(when)
    assert samples[("gateway_redis_up", frozenset())] == 1


def test_unknown_methods_do_not_create_label_values(client):
    client.open("/healthz", method="FROBNICATE")
    samples = _scrape(client)
    methods = {dict(labels).get("method") for name, labels in samples if name == "gateway_http_requests_total"}
    assert "FROBNICATE" not in methods and "other" in methods
