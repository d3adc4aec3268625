"""Operations endpoints: liveness, readiness and Prometheus metrics (public paths,
no API credential; ``/metrics`` is guarded by ``METRICS_TOKEN`` or loopback-only)."""
from __future__ import annotations

import hmac
import ipaddress
from functools import wraps

from flask import Response, current_app, request
from flask.views import MethodView

from app.auth import bearer_token, public
from app.blueprints.ops.schemas import LivenessSchema, NotReadySchema, ReadinessSchema
from app.errors import ErrorSchema, Forbidden, Unauthorized
from app import metrics
from app.extensions import Blueprint
from app.services.platform import health

blp = Blueprint("ops", __name__, description="Health, readiness and metrics for operators and load balancers.")

METRICS_SECURITY_SCHEME = "metricsToken"


def init_ops(api) -> None:
    """Register the ``/metrics`` bearer scheme in the OpenAPI document."""
    api.spec.components.security_scheme(METRICS_SECURITY_SCHEME, {
        "type": "http", "scheme": "bearer",
        "description": "The operator's `METRICS_TOKEN` (not an API key). When `METRICS_TOKEN` "
                       "is unset, `/metrics` answers loopback clients only."})


def _is_loopback(addr: str | None) -> bool:
    try:
        return ipaddress.ip_address(addr or "").is_loopback
    except ValueError:
        return False


def metrics_guard(func):
    """``METRICS_TOKEN`` set: require ``Authorization: Bearer <token>`` (401 otherwise).
    Unset: only loopback clients (the real client address, after ProxyFix) may scrape (403)."""
    @wraps(func)
    def wrapper(*args, **kwargs):
        expected = current_app.config.get("METRICS_TOKEN")
        if expected:
            given = bearer_token() or ""
            if not hmac.compare_digest(given.encode(), expected.encode()):
                raise Unauthorized("A valid METRICS_TOKEN bearer token is required.")
        elif not _is_loopback(request.remote_addr):
            raise Forbidden("Metrics are served to loopback clients only unless METRICS_TOKEN is set.")
        return func(*args, **kwargs)

    return wrapper


@blp.route("/healthz")
class HealthView(MethodView):
    @public
    @blp.response(200, LivenessSchema)
    def get(self):
        """Liveness: the process is up.

        Checks no dependency (use `/readyz` for that): restart the process when this fails."""
        return health.liveness()


@blp.route("/readyz")
class ReadyView(MethodView):
    @public
    @blp.response(200, ReadinessSchema)
    @blp.alt_response(503, schema=NotReadySchema,
                      description="`service_unavailable`: the database or Redis is unreachable "
                                  "(with `Retry-After`); `checks` says which.")
    def get(self):
        """Readiness: the database and Redis are reachable.

        The database answers `SELECT 1` and Redis (when configured) answers PING. Load
        balancers should route traffic only to instances answering 200."""
        return health.readiness()


@blp.route("/metrics")
class MetricsView(MethodView):
    @blp.doc(security=[{METRICS_SECURITY_SCHEME: []}, {}])
    @metrics_guard
    @blp.response(200, {"type": "string"}, content_type="text/plain",
                  description="Prometheus text exposition format.")
    @blp.alt_response(401, schema=ErrorSchema, description="`unauthorized`: `METRICS_TOKEN` is set and "
                      "the bearer token is missing or wrong.")
    @blp.alt_response(403, schema=ErrorSchema, description="`forbidden`: `METRICS_TOKEN` is unset and the "
                      "client is not on loopback.")
    def get(self):
        """Prometheus metrics of this host.

        Summed over every gunicorn worker (and the RQ worker) of this host:
        `gateway_http_requests_total` and `gateway_http_request_duration_seconds` by
        method, route (URL rule) and status; `gateway_calls_total` and
        `gateway_spend_micros_total` by module; `gateway_provider_errors_total` by module and
        kind; `gateway_queue_depth`, `gateway_queue_failed_jobs`,
        `gateway_queue_scheduled_jobs`, `gateway_redis_up` and
        `gateway_worker_heartbeat_timestamp_seconds` read at scrape time. Text format 0.0.4 by
        default; OpenMetrics when the `Accept` header asks for it."""
        body, content_type = metrics.render(request.headers.get("Accept"))
        return Response(body, status=200, content_type=content_type)


init_api = init_ops
