"""OpenTelemetry tracing for operators: off by default, on through the standard
``OTEL_*`` variables, nothing imported when off.

On when ``OTEL_TRACES_EXPORTER`` is set to anything but ``none``, or when
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (the
exporter then defaults to ``otlp``, over HTTP/protobuf); ``OTEL_SDK_DISABLED=true``
turns it off again. The SDK reads the rest itself (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, endpoints,
headers). ``console`` prints spans to stdout (for a look on one machine).

When on, Flask (one server span per request), requests (webhooks, facilitator, JSON-RPC),
SQLAlchemy (one span per statement, on every pool: ``gw_open_calls``, the finalize …) and Redis (the
rate-limit pipeline) are instrumented; the provider calls, sent on urllib3's pool directly
(``platform.http.Upstream``), open the same kind of CLIENT span through ``client_span``
(named by the method, with ``url.full`` without its query, ``server.address``,
``server.port``, ``http.response.status_code``, the trace context injected as
``traceparent``); and ``span(name)`` adds the phases of a metered call
(``call.open``, ``call.forward``, ``call.finalize``) and of a chat completion
(``chat.route``, ``chat.hold``, ``chat.provider``, ``chat.settle``), so one call's time
split is visible in a trace. When off, ``span()`` returns one shared no-op context manager and no
``opentelemetry`` module is imported. The batch span processor re-creates its export
thread after gunicorn forks its workers.
"""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

_NOOP = nullcontext()
_tracer = None


def enabled(env=os.environ) -> bool:
    """Whether the ``OTEL_*`` variables ask for tracing (see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def span(name: str):
    """A context manager timing one phase as a child span; a shared no-op when off."""
    return _NOOP if _tracer is None else _tracer.start_as_current_span(name)


def server_span(environ: dict, route: str):
    """The SERVER span of a request served outside Flask (the hot routes' thin entry,
    ``app.blueprints.gateway.hotpath``), named and attributed as the Flask instrumentation
    names the requests Flask serves (``"POST /v1/module/<string:slug>/call"``), its parent
    read from the request's trace headers; yields the span (None when off)."""
    return _NOOP if _tracer is None else _server_span(environ, route)


@contextmanager
def _server_span(environ, route):
    from opentelemetry import context, propagate, trace
    from opentelemetry.instrumentation.wsgi import collect_request_attributes, wsgi_getter

    attrs = collect_request_attributes(environ)
    attrs["http.route"] = route
    token = context.attach(propagate.extract(environ, getter=wsgi_getter))
    try:
        with _tracer.start_as_current_span(f"{environ.get('REQUEST_METHOD', 'GET')} {route}",
                                           kind=trace.SpanKind.SERVER, attributes=attrs) as sp:
            yield sp
    finally:
        context.detach(token)


def server_status(span, status_line: str, headers: list) -> None:
    """Record the response on a ``server_span`` span (5xx marks it an error)."""
    from opentelemetry.instrumentation.wsgi import add_response_attributes

    add_response_attributes(span, status_line, headers)


def client_span(method: str, scheme: str, host: str, port: int | None, path: str, headers: dict):
    """A CLIENT span for one outbound request sent on urllib3's pool directly (the requests
    instrumentation covers the other outbound requests), its trace context injected into
    ``headers``; yields the span (None when off: the shared no-op, no work done)."""
    return _NOOP if _tracer is None else _client_span(method, scheme, host, port, path, headers)


@contextmanager
def _client_span(method, scheme, host, port, path, headers):
    from opentelemetry import propagate, trace

    netloc = host if port is None else f"{host}:{port}"
    attrs = {"http.request.method": method, "url.full": f"{scheme}://{netloc}{path.split('?', 1)[0]}",
             "server.address": host.strip("[]"), "server.port": port or (443 if scheme == "https" else 80)}
    with _tracer.start_as_current_span(method, kind=trace.SpanKind.CLIENT, attributes=attrs) as sp:
        propagate.inject(headers)
        yield sp


def client_status(span, status: int) -> None:
    """Record the response status on a ``client_span`` span (4xx/5xx mark it an error)."""
    span.set_attribute("http.response.status_code", status)
    if status >= 400:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))


def init_app(app) -> None:
    """Instrument the app when ``enabled()``; otherwise do nothing (and import nothing)."""
    global _tracer
    if not enabled():
        return
    from opentelemetry import trace
    from opentelemetry.instrumentation.flask import FlaskInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if not isinstance(trace.get_tracer_provider(), TracerProvider):  # once per process
        provider = TracerProvider(resource=Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "gateway"}))
        names = (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(",")
        for name in (n.strip() for n in names):
            if name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            elif name == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        RequestsInstrumentor().instrument()
        RedisInstrumentor().instrument()
    FlaskInstrumentor().instrument_app(app)
    from app.extensions import db

    with app.app_context():
        # The instrumentation declares sqlalchemy < 2.1 and, checked, refuses to load on
        # 2.1 (no SQL span at all); the engine events it listens to are unchanged in 2.1,
        # which tests/services/test_telemetry.py shows. ``db.engine`` is the process's
        # one pool (uow.py); its hot-path statements go through SQLAlchemy's execution
        # from now on (``want_statement_events``), so they get spans too.
        SQLAlchemyInstrumentor().instrument(engine=db.engine, skip_dep_check=True)
    from app.services.platform import uow

    uow.want_statement_events()
    _tracer = trace.get_tracer("gateway")
