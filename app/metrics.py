"""Prometheus metrics: the metric objects, the helpers features call, and the scrape.

Works with several gunicorn workers (and the RQ worker) through prometheus_client's
multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set *before this module is
first imported* (``deploy/gunicorn.conf.py`` and ``deploy/serve.sh`` do it), every
process writes its figures to files in that directory and a scrape of ``/metrics`` on
any worker sums them. Without it (tests, ``make run``) figures live in this process.

Helpers for feature code (cheap, never raise):

* ``observe_call(module, status, cost_cents=0, cost_micros=None)`` — one metered module
  call or chat completion (``module`` = the usage product: module slug or ``chat:<model>``;
  ``status`` = ``ok`` | ``provider_error`` | ``provider_timeout`` | ``payment_required`` …).
* ``provider_error(module, kind)`` — an upstream failure (``kind`` = ``timeout`` |
  ``connect`` | ``http_5xx`` | ``invalid_response`` …).

Request counts and latencies are recorded for every request by ``init_metrics`` (label
``route`` is the URL rule, e.g. ``/api/keys/<key_id>``, never the raw path). Queue depth
is read from RQ at scrape time.
"""
from __future__ import annotations

import logging
import os
import time

from flask import Flask, current_app, g, request
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.exposition import choose_encoder
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
# ``*_created`` series are not produced in multiprocess mode; drop them everywhere so the
# exposition is the same with one process or many.
disable_created_metrics()

# Metric objects are not registered in the global registry: the scrape builds its own
# registry (multiprocess collector, or these objects), see ``render()``.
HTTP_REQUESTS = Counter(
    "gateway_http_requests_total", "HTTP requests served, by method, route (URL rule) and status.",
    ["method", "route", "status"], registry=None)
HTTP_LATENCY = Histogram(
    "gateway_http_request_duration_seconds", "Time to produce the response, by method, route and status.",
    ["method", "route", "status"], registry=None,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0))
CALLS = Counter(
    "gateway_calls_total", "Metered module calls and chat completions, by module (usage product) and status.",
    ["module", "status"], registry=None)
SPEND = Counter(
    "gateway_spend_micros_total", "Amount charged for calls, in micro-dollars (1 cent = 10,000), by module.",
    ["module"], registry=None)
PROVIDER_ERRORS = Counter(
    "gateway_provider_errors_total", "Upstream provider failures, by module and kind.",
    ["module", "kind"], registry=None)

STATEMENT_GROUPS = Counter(
    "gateway_statement_groups_total",
    "Grouped money statements (money/charging.py GroupStatement), by statement (call_open: "
    "gw_open_calls; chat_hold: gw_chat_holds; chat_settle: gw_chat_settles) and outcome: "
    "written (several rows in one statement), split (such a statement failed, e.g. a lock "
    "wait given up: its rows were written one by one), alone (a one-row statement gave up a "
    "lock wait and was sent again outside the queue).",
    ["statement", "outcome"], registry=None)

FINALIZE_WRITER = Counter(
    "gateway_finalize_writer_total",
    "Deferred call finalizations (money/charging.py DeferredFinalizer), by outcome: written, "
    "retried (the database refused the statement; tried again), late (the sweep refunded the "
    "call first), refused (left pending for the sweep).",
    ["outcome"], registry=None)

_OWN_METRICS = (HTTP_REQUESTS, HTTP_LATENCY, CALLS, SPEND, PROVIDER_ERRORS, FINALIZE_WRITER, STATEMENT_GROUPS)

UNMATCHED_ROUTE = "<unmatched>"


def observe_call(module: str, status: str, cost_cents: int = 0, cost_micros: int | None = None) -> None:
    """Count one metered call of ``module`` ending in ``status`` and the amount charged
    (``cost_micros`` when given, else ``cost_cents``; 0 for uncharged calls)."""
    try:
        CALLS.labels(module=module, status=status).inc()
        micros = int(cost_micros) if cost_micros is not None else int(cost_cents) * 10_000
        if micros > 0:
            SPEND.labels(module=module).inc(micros)
    except Exception:  # metrics never break a call
        log.debug("observe_call failed", exc_info=True)


def provider_error(module: str, kind: str) -> None:
    """Count one upstream failure of ``module`` (``kind``: timeout, connect, http_5xx, …)."""
    try:
        PROVIDER_ERRORS.labels(module=module, kind=kind).inc()
    except Exception:
        log.debug("provider_error metric failed", exc_info=True)


def statement_groups(statement: str, outcome: str) -> None:
    """Count a grouped ``statement`` ending in ``outcome`` (see STATEMENT_GROUPS)."""
    try:
        STATEMENT_GROUPS.labels(statement=statement, outcome=outcome).inc()
    except Exception:
        log.debug("statement_groups metric failed", exc_info=True)


def finalize_writer(outcome: str, n: int = 1) -> None:
    """Count ``n`` deferred finalizations ending in ``outcome`` (see FINALIZE_WRITER)."""
    try:
        FINALIZE_WRITER.labels(outcome=outcome).inc(n)
    except Exception:
        log.debug("finalize_writer metric failed", exc_info=True)


def route_label() -> str:
    """The URL rule of the current request (bounded cardinality), or ``<unmatched>``."""
    rule = request.url_rule
    return rule.rule if rule is not None else UNMATCHED_ROUTE


def request_elapsed() -> float | None:
    """Seconds since this request started (None outside a timed request)."""
    t0 = g.get("request_started")
    return time.perf_counter() - t0 if t0 is not None else None


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def init_metrics(app: Flask) -> None:
    """Time every request (``g.request_started``, also used by the access log) and count
    it by method, route and status."""

    def _start_timer():
        g.request_started = time.perf_counter()

    # First of all before_request hooks, so a request another hook rejects is timed too.
    app.before_request_funcs.setdefault(None, []).insert(0, _start_timer)

    @app.after_request
    def _record(response):
        observe_request(request.method, route_label(), response.status_code, request_elapsed())
        return response


def observe_request(method: str, route: str, status: int, elapsed: float | None) -> None:
    """Count one served request and its duration in seconds (never raises)."""
    try:
        labels = (method if method in _METHODS else "other", route, str(status))
        HTTP_REQUESTS.labels(*labels).inc()
        if elapsed is not None:
            HTTP_LATENCY.labels(*labels).observe(elapsed)
    except Exception:
        log.debug("request metrics failed", exc_info=True)


class _ScrapeTimeCollector:
    """Figures read when scraped: RQ queue depth, failed jobs, last worker heartbeat."""

    def __init__(self, app: Flask):
        self.app = app

    def collect(self):
        depth = GaugeMetricFamily("gateway_queue_depth", "Jobs waiting in the RQ queue.", labels=["queue"])
        failed = GaugeMetricFamily("gateway_queue_failed_jobs", "Jobs in the RQ failed-job registry.",
                                   labels=["queue"])
        scheduled = GaugeMetricFamily("gateway_queue_scheduled_jobs", "Jobs scheduled for later in RQ.",
                                      labels=["queue"])
        up = GaugeMetricFamily("gateway_redis_up", "1 when Redis answered this scrape, else 0.")
        heartbeat = GaugeMetricFamily(
            "gateway_worker_heartbeat_timestamp_seconds",
            "Unix time of the last heartbeat job run by an RQ worker (enqueued by the scheduler).")
        with self.app.app_context():
            from app.extensions import get_redis

            redis = get_redis()
            if redis is not None:
                try:
                    from app.tasks import get_queue

                    queue = get_queue()
                    depth.add_metric([queue.name], queue.count)
                    failed.add_metric([queue.name], queue.failed_job_registry.count)
                    scheduled.add_metric([queue.name], queue.scheduled_job_registry.count)
                    from app.tasks.maintenance import last_heartbeat

                    beat = last_heartbeat()
                    if beat is not None:
                        heartbeat.add_metric([], beat)
                    up.add_metric([], 1)
                except Exception:
                    log.warning("metrics: Redis unavailable at scrape time")
                    up.add_metric([], 0)
        yield from (depth, failed, scheduled, up, heartbeat)


def render(accept: str | None = None) -> tuple[bytes, str]:
    """The exposition of every metric (all processes in multiprocess mode), in the format
    the ``Accept`` header asks for (Prometheus text 0.0.4 by default, or OpenMetrics)."""
    registry = CollectorRegistry(auto_describe=False)
    if MULTIPROCESS:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        for metric in _OWN_METRICS:
            registry.register(metric)
    registry.register(_ScrapeTimeCollector(current_app._get_current_object()))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
