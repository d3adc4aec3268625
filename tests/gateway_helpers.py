"""Helpers for module-call tests: a stand-in provider and a module factory."""
from __future__ import annotations

import threading
import time

import pytest

from app.extensions import db
from tests.support.standin import Reply, Request, StandIn

PROVIDER_SECRET_ENV = "TEST_PROVIDER_SECRET"
PROVIDER_SECRET = "provider-secret-for-tests"


class ProviderStandIn(StandIn):
    """Paths: /ok (echo body + selected headers), /bad (422), /boom (500), /slow (sleeps),
    /list (JSON array), /text (text/plain), /counter (a different answer every call),
    /redirect (302), /block (waits for ``release``), /busy (429), /unauth (401), /empty (204).
    The path may come after any prefix. Every request is recorded in ``requests``."""

    ANSWERS = {"/bad": (422, {"error": "bad_input", "field": "text"}), "/boom": (500, {"error": "internal"}),
               "/list": (200, [1, 2, 3]), "/busy": (429, {"error": "slow down"}),
               "/unauth": (401, {"error": "bad key"})}

    def __init__(self):
        super().__init__()
        self.route("*", "*", self.answer)
        self.reset()

    def reset(self) -> None:
        self.requests.clear()
        self.counter = 0
        self.slow_seconds = 2.0
        self.release = threading.Event()

    def answer(self, req: Request):
        end = "/" + req.path.rsplit("/", 1)[-1]
        if end in self.ANSWERS:
            return self.ANSWERS[end]
        if end == "/ok":
            return 200, {"echo": req.json(), "provider_key": req.headers.get("X-Provider-Key"),
                         "authorization": req.headers.get("Authorization")}
        if end == "/slow":
            time.sleep(self.slow_seconds)
            return 200, {"late": True}
        if end == "/text":
            return Reply(200, b"plain words", content_type="text/plain")
        if end == "/counter":
            with self.lock:
                self.counter += 1
                return 200, {"n": self.counter}
        if end == "/redirect":
            return Reply(302, b"", headers={"Location": "http://example.com/"})
        if end == "/block":
            self.release.wait(10)
            return 200, {"released": True}
        if end == "/empty":
            return Reply(204)
        return 404, {"error": "no such path"}


PROVIDER = ProviderStandIn()


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
    with PROVIDER as url:
        yield url


@pytest.fixture
def provider(provider_server):
    PROVIDER.reset()
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


