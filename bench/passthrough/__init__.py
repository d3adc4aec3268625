"""Benchmark baseline: the gateway app plus one bare forwarding route (no auth, metering
or receipts), served only by ``make bench``'s own gunicorn as ``bench.passthrough:app``.

It measures what this stack (gunicorn gthread + Flask + a pooled ``requests`` session)
costs by itself, so ``bench/`` can report the metered call as a ratio against it. The
product (``wsgi:app``) never contains this route. The upstream is fixed by
``BENCH_UPSTREAM_URL`` and must be a loopback address, so the route can never be used as
an open proxy.
"""
from __future__ import annotations

import ipaddress
import os
import threading
from urllib.parse import urlsplit

import requests
from flask import Flask, Response, request
from flask.views import MethodView
from marshmallow import Schema, fields

from app import create_app
from app.auth import public
from app.errors import UpstreamError
from app.extensions import Blueprint

blp = Blueprint("bench", __name__, url_prefix="/bench",
                description="Benchmark-only baseline (served only by bench.passthrough:app).")
_local = threading.local()


class PassthroughResultSchema(Schema):
    """Whatever JSON the configured upstream answered, returned unchanged."""

    class Meta:
        unknown = "include"

    ok = fields.Boolean(metadata={"description": "As answered by the upstream (free-form object)."})


def check_upstream(url: str | None) -> str:
    """Validate ``BENCH_UPSTREAM_URL``: http(s) on a loopback address only."""
    if not url:
        raise RuntimeError("the bench passthrough needs BENCH_UPSTREAM_URL")
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme not in ("http", "https") or not loopback:
        raise RuntimeError("BENCH_UPSTREAM_URL must be an http(s) URL on a loopback address")
    return url


def _session() -> requests.Session:
    session = getattr(_local, "session", None)
    if session is None:
        session = requests.Session()
        session.trust_env = False  # no proxies from the environment: loopback only
        _local.session = session
    return session


@blp.route("/passthrough")
class PassthroughView(MethodView):
    @public
    @blp.response(200, PassthroughResultSchema)
    def post(self):
        """Forward the raw request body to the bench upstream and return its answer
        unchanged. Benchmark baseline only."""
        try:
            resp = _session().post(blp_upstream(), data=request.get_data(),
                                   headers={"Content-Type": "application/json"}, timeout=10)
        except requests.RequestException as exc:
            raise UpstreamError(f"bench upstream failed: {type(exc).__name__}") from exc
        return Response(resp.content, status=resp.status_code,
                        content_type=resp.headers.get("Content-Type", "application/json"))


def blp_upstream() -> str:
    from flask import current_app

    return current_app.config["BENCH_UPSTREAM_URL"]


# The plan of the bench's first account (``bench.fixtures``), which ``metered-1acct`` loads
# alone and the usage reads read: the enterprise plan with its rate-limit windows times ten
# (bench only; the product's plans are ``config.PLANS``). One account at c=16 reaches about
# 1,000 calls a second on a fast host, the enterprise plan's limit, and the scenario, meant
# to measure every call updating one balance row, measured the plan's 429s instead (174 of
# 9,576 answers on 2026-11-28). Same windows, so the same rate-limit code runs.
BENCH_PLAN = "bench"  # (accounts.plan holds 16 characters)


def add_bench_plan(app: Flask) -> None:
    """Add ``BENCH_PLAN`` to ``app``'s plan table (the bench server and the fixtures)."""
    enterprise = app.config["PLANS"]["enterprise"]
    app.config["PLANS"] = {**app.config["PLANS"], BENCH_PLAN: {
        "plan_cents": enterprise["plan_cents"], "rate_limit": "600000/minute;10000/second"}}


def create_bench_app(upstream_url: str | None = None, overrides: dict | None = None) -> Flask:
    """The product app with the passthrough route and ``BENCH_PLAN`` added (benchmarks and
    their tests only)."""
    url = check_upstream(upstream_url if upstream_url is not None else os.environ.get("BENCH_UPSTREAM_URL"))
    app = create_app(overrides)
    app.config["BENCH_UPSTREAM_URL"] = url
    add_bench_plan(app)
    from app.extensions import api_of

    api_of(app).register_blueprint(blp)
    return app
