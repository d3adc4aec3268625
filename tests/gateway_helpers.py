"""Helpers for module-call tests: a stand-in provider and a module factory."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from app.extensions import db
from tests.servers import http_server

PROVIDER_SECRET_ENV = "TEST_PROVIDER_SECRET"
PROVIDER_SECRET = "provider-secret-for-tests"


class StandInProvider(BaseHTTPRequestHandler):
    """Paths: /ok (echo body + selected headers), /bad (400), /boom (500), /slow (sleeps),
    /list (JSON array), /text (text/plain), /counter (a different answer every call),
    /redirect (302), /unauth (401), /empty (204). Every request is recorded in ``seen``."""

    seen: list = []
    counter = {"n": 0}
    lock = threading.Lock()
    slow_seconds = 2.0
    release = threading.Event()  # /block waits for it (at most 10 s)

    def log_message(self, *args):
        pass

    def _reply(self, status, payload=None, ctype="application/json", raw=None):
        data = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else b"")
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with self.lock:
            self.seen.append({"path": self.path, "method": self.command, "headers": dict(self.headers),
                              "body": body, "raw": raw})
        path = self.path.split("?")[0]
        if path.endswith("/ok"):
            return self._reply(200, {"echo": body, "provider_key": self.headers.get("X-Provider-Key"),
                                     "authorization": self.headers.get("Authorization")})
        if path.endswith("/bad"):
            return self._reply(422, {"error": "bad_input", "field": "text"})
        if path.endswith("/boom"):
            return self._reply(500, {"error": "internal"})
        if path.endswith("/slow"):
            time.sleep(self.slow_seconds)
            return self._reply(200, {"late": True})
        if path.endswith("/list"):
            return self._reply(200, [1, 2, 3])
        if path.endswith("/text"):
            return self._reply(200, raw=b"plain words", ctype="text/plain")
        if path.endswith("/counter"):
            with self.lock:
                self.counter["n"] += 1
                n = self.counter["n"]
            return self._reply(200, {"n": n})
        if path.endswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "http://example.com/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if path.endswith("/block"):
            self.release.wait(10)
            return self._reply(200, {"released": True})
        if path.endswith("/busy"):
            return self._reply(429, {"error": "slow down"})
        if path.endswith("/unauth"):
            return self._reply(401, {"error": "bad key"})
        if path.endswith("/empty"):
            self.send_response(204)
            self.end_headers()
            return None
        return self._reply(404, {"error": "no such path"})

    do_POST = do_GET = do_PUT = _handle


def create_module(app, slug: str, base_url: str, actions: dict, *, sandbox_url: str | None = None,
                  owner_agent_id: str | None = None, provider_auth: dict | None = "default",
                  status: str = "approved") -> int:
    """Insert a module; ``actions`` maps name -> (price_cents, path[, timeout[, method]])."""
    from app.models import Module, ModuleAction
    from app.services.gateway import catalog

    if provider_auth == "default":
        provider_auth = {"type": "header", "header": "X-Provider-Key", "env": PROVIDER_SECRET_ENV,
                         "default": PROVIDER_SECRET}
    with app.app_context():
        m = Module(slug=slug, name=slug.title(), description=f"{slug} test module", owner="Tests",
                   owner_agent_id=owner_agent_id, source="agent" if owner_agent_id else "catalog",
                   status=status, upstream_url=base_url, sandbox_url=sandbox_url,
                   provider_auth=provider_auth)
        for name, spec in actions.items():
            price, path, *rest = spec
            m.actions.append(ModuleAction(name=name, price_cents=price, path=path,
                                          timeout_seconds=rest[0] if rest else 5.0,
                                          method=rest[1] if len(rest) > 1 else "POST"))
        db.session.add(m)
        db.session.commit()
        mid = m.id
        db.session.remove()
    catalog.invalidate_cache()
    return mid


def balance_cents(app, account_id: str) -> int:
    from app.models import Account

    with app.app_context():
        value = db.session.get(Account, account_id).balance_micros
        db.session.remove()
    return value // 10_000


# --- fixtures (import them into a test module to use them) ---------------------------

@pytest.fixture(scope="module")
def provider_server():
    with http_server(StandInProvider) as (_server, url):
        yield url


@pytest.fixture
def provider(provider_server):
    StandInProvider.seen.clear()
    StandInProvider.counter["n"] = 0
    StandInProvider.slow_seconds = 2.0
    StandInProvider.release.clear()
    return provider_server


@pytest.fixture
def mod(app, provider):
    create_module(app, "svc", provider, {
        "ok": (3, "/ok"), "bad": (2, "/bad"), "boom": (3, "/boom"), "slow": (3, "/slow", 0.3),
        "list": (1, "/list"), "text": (1, "/text"),
        "counter": (1, "/counter"), "redirect": (1, "/redirect"), "unauth": (1, "/unauth"),
        "empty": (1, "/empty"), "free": (0, "/ok"), "get": (1, "/ok", 5.0, "GET"),
        "busy": (1, "/busy"), "block": (1, "/block", 15.0),
    }, sandbox_url=provider + "/sandbox")
    return "svc"


def call(client, acct, body, slug="svc", key=None, headers=None, bearer=None):
    h = {"Authorization": f"Bearer {bearer or acct.key}"}
    if key is not None:
        h["Idempotency-Key"] = key
    h.update(headers or {})
    return client.post(f"/v1/module/{slug}/call", json=body, headers=h)


