"""The module call's hand-written loaders (``fields.FastLoad``) accept exactly what the
marshmallow schemas accept, return the same data, and leave every refusal to the schema
(so the 400 bodies of the input policy do not change)."""
from __future__ import annotations

import marshmallow as ma
import pytest
from werkzeug.datastructures import Headers

from app.blueprints.fields import MAX_JSON_DEPTH
from app.blueprints.gateway.schemas import ModuleCallHeadersSchema, ModuleCallRequestSchema
from webargs.multidictproxy import MultiDictProxy


def _nest(depth):
    doc = {}
    for _ in range(depth - 1):
        doc = {"x": doc}
    return {"action": "ok", "deep": doc}


BODIES = [
    {"action": "ok"}, {"action": "ok", "n": 3, "text": "a\x00b", "x": [1, {"y": None}]},
    {"n": 1}, {"action": ""}, {"action": "a" * 64}, {"action": "a" * 65}, {"action": 5},
    {"action": None}, {"action": "ok\n"}, {"action": "ok\x85"}, {"action": "ok\x7f"}, {"action": "é✓"},
    [{"action": "ok"}], "ok", 5, None, {}, _nest(MAX_JSON_DEPTH - 1), _nest(MAX_JSON_DEPTH),
    _nest(MAX_JSON_DEPTH + 5),
]


@pytest.mark.parametrize("body", BODIES)
def test_body_loader_agrees_with_the_schema(body):
    schema = ModuleCallRequestSchema()
    try:
        expected = schema.load(body)
    except ma.ValidationError:
        expected = None
    fast = schema.fast_load(body)
    if fast is not None:  # accepted: the same data (marshmallow's key order is a set's: any)
        assert fast == expected
    # declined: marshmallow decides, and every valid body of this list is taken fast
    assert (fast is None) == (expected is None)


HEADERS = [
    {}, {"Idempotency-Key": "k-1"}, {"Idempotency-Key": ""}, {"Idempotency-Key": "k" * 128},
    {"Idempotency-Key": "k" * 129}, {"Idempotency-Key": "k\x01"},
    {"Idempotency-Key": "é".encode().decode("latin-1") * 100},   # 100 chars, 200 bytes: fine
    {"Idempotency-Key": "€".encode().decode("latin-1") * 100},   # 100 chars, 300 bytes: refused
    {"X-Payment": "abc", "PAYMENT-SIGNATURE": "def", "Other": "x"}, {"X-Payment": "a" * 8001},
    {"PAYMENT-SIGNATURE": "a\tb"},
]


@pytest.mark.parametrize("raw", HEADERS)
def test_header_loader_agrees_with_the_schema(raw):
    schema = ModuleCallHeadersSchema()
    data = MultiDictProxy(Headers(raw), schema)
    try:
        expected = schema.load(data)
    except ma.ValidationError:
        expected = None
    fast = schema.fast_load(data)
    assert fast == expected  # the same data, or None (declined) exactly when the schema refuses


def test_a_refused_body_still_gets_the_schema_400(client, make_account):
    from tests.gateway_helpers import call

    acct = make_account(cents=100)
    r = call(client, acct, {"action": "a" * 65})
    assert r.status_code == 400 and "action" in r.get_json()["message"]


@pytest.mark.parametrize("raw", HEADERS)
def test_header_loader_reads_the_request_headers_like_webargs(raw):
    """The route's fast path hands ``request.headers`` itself (no webargs proxy) to the
    loader: it must read them exactly as through webargs' proxy."""
    schema = ModuleCallHeadersSchema()
    assert schema.fast_load(Headers(raw)) == schema.fast_load(MultiDictProxy(Headers(raw), schema))


@pytest.mark.parametrize("headers,field", [({"Idempotency-Key": "k" * 129}, "Idempotency-Key"),
                                           ({"X-Payment": "a\tb"}, "X-Payment")])
def test_a_refused_header_still_gets_the_schema_400(client, make_account, headers, field):
    from tests.gateway_helpers import call

    acct = make_account(cents=100)
    r = call(client, acct, {"action": "ok"}, headers=headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    assert field in r.get_json()["message"]
