"""Usage endpoints (SPEC 25–26): current billing period and per-module breakdown."""
from __future__ import annotations

from datetime import datetime, timezone

from app.extensions import db
from app.services.billing import usage
from tests import usage_seed
from tests.gateway_helpers import call, create_module, mod, provider, provider_server  # noqa: F401


def test_usage_current_and_by_module(app, client, make_account, mod, provider):
    create_module(app, "other", provider, {"ok": (4, "/ok")})
    acct = make_account(cents=100, test_key=True)
    empty = client.get("/api/usage/current", headers=acct.headers)
    assert empty.status_code == 200
    data = empty.get_json()
    assert (data["calls"], data["spend_cents"], data["plan_cents"]) == (0, 0, 2000)
    now = datetime.now(timezone.utc)
    start = datetime.fromisoformat(data["period_start"])
    end = datetime.fromisoformat(data["period_end"])
    assert start <= now < end and start.day == 1 and start.hour == 0 and end.day == 1
    call(client, acct, {"action": "ok"})                   # 3 cents
    call(client, acct, {"action": "bad"})                  # 2 cents, ok=false, charged
    call(client, acct, {"action": "boom"})                 # refunded: a call, no spend
    call(client, acct, {"action": "ok"}, slug="other")     # 4 cents
    call(client, acct, {"action": "ok"}, bearer=acct.test_key)  # test mode: not live usage
    cur = client.get("/api/usage/current", headers=acct.headers).get_json()
    assert (cur["calls"], cur["spend_cents"]) == (4, 9)
    by = client.get("/api/usage/by-module", headers=acct.headers).get_json()
    assert by == {"by_module": [{"slug": "svc", "calls": 3, "spend_cents": 5},
                                {"slug": "other", "calls": 1, "spend_cents": 4}], "by_model": []}
    with app.app_context():
        start, end = usage.billing_period()
        t = usage.totals(acct.id, start, end, mode="test")
        db.session.remove()
    assert (t["calls"], t["spend_micros"]) == (1, 30_000)


def test_usage_needs_call_read(client, make_account):
    acct = make_account(scopes=["call:write"])
    for path in ("/api/usage/current", "/api/usage/by-module"):
        r = client.get(path, headers=acct.headers)
        assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"
        assert client.get(path).status_code == 401


def test_chat_products_are_not_modules_but_listed_by_model(app, client, make_account):
    """Issue 40: chat completions are in by-module too, per model, with the sub-cent spend exact."""
    acct = make_account()
    with app.app_context():
        usage_seed.record(acct.id, "chat:gpt-x", spend_micros=1234)
        usage_seed.record(acct.id, "chat:gpt-x", spend_micros=1000)
        usage_seed.record(acct.id, "chat:small", spend_micros=123)
        usage_seed.record(acct.id, "chat:small", spend_micros=999, mode="test")  # test mode: not live usage
        usage_seed.record(acct.id, "echo", spend_micros=10_000)
        db.session.commit()
        db.session.remove()
    body = client.get("/api/usage/by-module", headers=acct.headers).get_json()
    assert body["by_module"] == [{"slug": "echo", "calls": 1, "spend_cents": 1}]
    assert body["by_model"] == [{"model": "gpt-x", "calls": 2, "spend_cents": 0, "spend_micros": 2234},
                                {"model": "small", "calls": 1, "spend_cents": 0, "spend_micros": 123}]
