"""OpenTelemetry (issue 18, Deliver 5): off by default with no tracing code loaded; on through
the standard OTEL_* variables, with the metered call's phases as spans."""
from __future__ import annotations


import pytest

from app import telemetry
from tests.support.procs import probe



@pytest.mark.parametrize("env,on", [
    ({}, False), ({"OTEL_TRACES_EXPORTER": "none"}, False), ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_enabled_only_by_otel_variables(env, on):
    assert telemetry.enabled(env) is on


_PROBE = r"""
import json, sys
from app import create_app, telemetry
app = create_app({"APP_ENV": "test", "TESTING": True,  # the database: DATABASE_URL
                  "INSTANCE_PATH": sys.argv[1]})
with telemetry.span("call.open"):
    pass
app.test_client().get("/openapi.json")
# the hot route's plain case, served by the thin entry (401: no credential): its server span
app.test_client().post("/v1/module/nope/call", json={"action": "x"},
                       headers={"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"})
from sqlalchemy import text
from app.extensions import db
from app.services.platform import uow
with app.app_context():  # a statement of the session and one of the hot path's (uow.run_one)
    db.session.execute(text("SELECT 4141"))
    uow.run_one("SELECT 4242", {})
# (redis 8 imports the OpenTelemetry metrics SDK itself when it is installed: not ours)
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.instrumentation",
                                                         "opentelemetry.sdk.trace")))
if telemetry._tracer is not None:
    from opentelemetry import trace
    trace.get_tracer_provider().force_flush()
print("\nPROBE " + json.dumps({"otel_modules": len(loaded), "tracer": telemetry._tracer is not None}))
"""


def _probe(tmp_path, **env) -> tuple[dict, str]:
    return probe(_PROBE, str(tmp_path), **env)


def test_off_imports_nothing(tmp_path):
    result, _ = _probe(tmp_path)
    assert result == {"otel_modules": 0, "tracer": False}


def test_console_exporter_shows_request_and_phase_spans(tmp_path):
    result, stdout = _probe(tmp_path, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="gw-test")
    assert result["otel_modules"] > 0 and result["tracer"]
    assert '"name": "call.open"' in stdout
    assert '"name": "GET /openapi.json"' in stdout
    # the thin entry's server span, named as Flask's instrumentation names a route, its parent
    # the caller's traceparent
    span = stdout[stdout.index('"name": "POST /v1/module/<string:slug>/call"'):]
    span = span[:span.index('"resource"')]
    assert '"kind": "SpanKind.SERVER"' in span and '"parent_id": "0x' + "cd" * 8 + '"' in span
    assert "401" in span
    assert "SELECT 4141" in stdout and "SELECT 4242" in stdout  # SQL spans, the hot path's statements included
    assert "gw-test" in stdout
