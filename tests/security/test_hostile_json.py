"""Hostile input shapes (findings 7 and 8): JSON nested past the limit is refused (400)
before any charge, in module calls and every other body; a signed processor webhook with
wrongly typed fields is refused (400) and changes nothing; Idempotency-Key counts
characters (UTF-8 read as UTF-8) with a separate byte cap."""
from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import func, select

from app.blueprints.fields import MAX_JSON_DEPTH
from app.extensions import db
from app.models import ModuleCall, PaymentEvent
from app.services.billing.processors import sandbox_webhook_secret, sign_payload
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401
from tests.support.errors import error_code, error_message


def nested(depth: int, leaf="x"):
    """A JSON value nesting ``depth`` arrays/objects (alternating)."""
    value = leaf
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


@pytest.mark.parametrize("shape", [
    lambda: {"action": "ok", "deep": nested(MAX_JSON_DEPTH)},
    lambda: {"action": "ok", "deep": nested(900)},
    lambda: {"action": "ok", "deep": nested(5000)},
    lambda: {"action": "ok", "list": [nested(40)] * 3},
])
def test_deep_json_refused_before_any_charge(app, client, account, mod, shape):
    before = balance_cents(app, account.id)
    r = client.post("/v1/module/svc/call", data=json.dumps(shape()).encode(),
                    headers={"Authorization": f"Bearer {account.key}", "Content-Type": "application/json"})
    assert r.status_code == 400 and error_code(r.get_json()) == "invalid_request", r.get_json()
    assert balance_cents(app, account.id) == before
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(ModuleCall)).scalar_one() == 0


def test_json_at_the_limit_is_accepted(app, client, account, mod):
    r = call(client, account, {"action": "ok", "deep": nested(MAX_JSON_DEPTH - 1)})
    assert r.status_code == 200, r.get_json()


@pytest.mark.parametrize("path", ["/api/alerts", "/api/keys", "/api/contact", "/v1/chat/completions"])
def test_deep_json_refused_on_every_body(client, account, path):
    r = client.post(path, json={"name": nested(100), "messages": nested(100)}, headers=account.headers)
    assert r.status_code == 400 and "nested" in error_message(r.get_json())


@pytest.mark.parametrize("field,value", [
    ("amount_refunded", "abc"), ("amount_refunded", -5), ("amount_refunded", 1.5), ("amount_refunded", True),
    ("amount_refunded", 10**30), ("payment_intent", {"x": 1}), ("id", ["a"]), ("metadata", "str"),
    ("amount_total", "100"), ("currency", 5),
])
def test_signed_webhook_with_wrong_types_refused(app, client, field, value):
    event = {"id": f"evt_sec_{field}", "object": "event", "type": "charge.refunded", "created": int(time.time()),
             "data": {"object": {"id": "ch_1", "payment_intent": "pi_x", "amount_refunded": 100, field: value}}}
    payload = json.dumps(event).encode()
    with app.app_context():
        sig = sign_payload(payload, sandbox_webhook_secret())
    r = client.post("/api/pay/webhook", data=payload, headers={"Stripe-Signature": sig,
                                                               "Content-Type": "application/json"})
    assert r.status_code == 400 and error_code(r.get_json()) == "invalid_request", r.get_json()
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(PaymentEvent)).scalar_one() == 0


@pytest.mark.parametrize("key,status", [
    ("é" * 128, 200), ("k" * 128, 200), ("日" * 85, 200), ("\U0001F600" * 64, 200),
    # ≤ 128 characters is the document's maxLength, whatever the bytes: a byte cap of 256
    # refused these schema-valid keys until 2026-11-29
    ("日" * 86, 200), ("\U0001F600" * 65, 200), ("日" * 128, 200), ("\U0001F600" * 128, 200),
    ("é" * 129, 400), ("k" * 129, 400), ("日" * 129, 400),  # 129 characters
])
def test_idempotency_key_counts_characters(client, account, mod, key, status):
    # WSGI hands headers over as latin-1: send the UTF-8 bytes as a client would.
    raw = key.encode("utf-8").decode("latin-1")
    r = call(client, account, {"action": "ok"}, headers={"Idempotency-Key": raw})
    assert r.status_code == status, (len(key), len(key.encode()), r.get_json())
