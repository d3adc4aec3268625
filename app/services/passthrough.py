"""Benchmark passthrough: forward a body to the fixed loopback bench upstream.

Used only by the ``bench`` blueprint (``BENCH_PASSTHROUGH=1``). One pooled
``requests.Session`` per process, like the production forwarding path should use.
"""
from __future__ import annotations

import ipaddress
import threading
from urllib.parse import urlsplit

import requests
from flask import current_app

from app.errors import UpstreamError

_local = threading.local()


def check_upstream(url: str | None) -> str:
    """Validate ``BENCH_UPSTREAM_URL``: http(s) on a loopback address only."""
    if not url:
        raise RuntimeError("BENCH_PASSTHROUGH=1 needs BENCH_UPSTREAM_URL")
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


def forward(body: bytes) -> tuple[int, bytes, str]:
    """POST ``body`` to the bench upstream; returns (status, body, content type)."""
    url = current_app.config["BENCH_UPSTREAM_URL"]
    try:
        resp = _session().post(url, data=body, headers={"Content-Type": "application/json"},
                               timeout=10)
    except requests.RequestException as exc:
        raise UpstreamError(f"bench upstream failed: {type(exc).__name__}") from exc
    return resp.status_code, resp.content, resp.headers.get("Content-Type", "application/json")
