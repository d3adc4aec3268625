"""The usage filters of issue 40 (``key_id``, ``module``, ``model``) on every usage route and
the export: the figures of only the calls named, from the rollups for a module or a model and
from the call logs for a key; unknown values give zeros, not another account's calls."""
from __future__ import annotations

import csv
import io
from datetime import timedelta

from app.extensions import db
from app.models import ChatCompletion, ModuleCall
from app.models.base import utcnow
from app.ids import new_id
from tests import usage_seed


def _seed(account_id: str, key_a: str, key_b: str) -> None:
    now = utcnow() - timedelta(minutes=3)
    for i, (slug, price, key) in enumerate((("echo", 10_000, key_a), ("echo", 20_000, key_b),
                                            ("text", 5_000, key_a))):
        db.session.add(ModuleCall(id=new_id("call"), account_id=account_id, module_id=1, module_slug=slug,
                                  action="run", mode="live", status="succeeded", price_micros=price, charged=True,
                                  ok=True, actor=key, created_at=now + timedelta(seconds=i), deadline_at=now))
    for i, (model, cost, key) in enumerate((("tiny", 123, key_a), ("big", 4_567, key_b))):
        db.session.add(ChatCompletion(id=f"chatcmpl-f{i}-{account_id[-6:]}", account_id=account_id, mode="live",
                                      requested_model="auto", model=model, status="settled", cost_micros=cost,
                                      prompt_tokens=3, completion_tokens=4, actor=key,
                                      created_at=now + timedelta(seconds=10 + i), settled_at=now))


def test_usage_routes_and_export_filter_by_key_module_and_model(app, client, make_account):
    acct, other = make_account(plan="scale"), make_account()  # scale: the test sends 20 reads at once
    with app.app_context():
        from app.models import ApiKey
        key_a = db.session.query(ApiKey.id).filter_by(account_id=acct.id).scalar()
        _seed(acct.id, key_a, "key_other")
        usage_seed.record(acct.id, "echo", spend_micros=1_000_000, calls=7, at=utcnow() - timedelta(days=1))
        usage_seed.record(other.id, "echo", spend_micros=9_000_000, calls=9)
        db.session.commit()
    h = acct.headers

    def get(path, **q):
        r = client.get(path, query_string=q, headers=h)
        assert r.status_code == 200, r.get_data(as_text=True)
        return r.get_json()

    month_start = utcnow().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    seeded_this_month = utcnow() - timedelta(days=1) >= month_start
    echo_calls = 2 + (7 if seeded_this_month else 0)
    assert get("/api/usage/current", module="echo")["calls"] == echo_calls
    assert get("/api/usage/current", model="tiny")["calls"] == 1
    assert get("/api/usage/current", key_id=key_a)["calls"] == 3  # echo 10k, text 5k, tiny (the seeded rollup has no key)
    assert get("/api/usage/current", key_id=key_a)["spend_cents"] == 1  # 15,123 micros
    assert get("/api/usage/current", key_id="key_nobody")["calls"] == 0
    assert get("/api/usage/current", module="echo", model="tiny")["calls"] == 0  # all filters apply

    by = get("/api/usage/by-module", key_id=key_a)
    assert sorted((m["slug"], m["calls"]) for m in by["by_module"]) == [("echo", 1), ("text", 1)]
    assert [(m["model"], m["spend_micros"]) for m in by["by_model"]] == [("tiny", 123)]
    by = get("/api/usage/by-module", model="big")
    assert by["by_module"] == [] and [(m["model"], m["calls"]) for m in by["by_model"]] == [("big", 1)]
    by = get("/api/usage/by-module")  # unfiltered: every module and model
    assert {m["model"] for m in by["by_model"]} == {"tiny", "big"}

    days = get("/api/usage/daily", days=2, module="text")["days"]
    assert [d["calls"] for d in days] == [0, 1]
    days = get("/api/usage/daily", days=2, key_id=key_a, model="tiny")["days"]
    assert [d["calls"] for d in days] == [0, 1]

    frm, to = (utcnow() - timedelta(hours=1)).isoformat(), (utcnow() + timedelta(minutes=1)).isoformat()

    def export(**q):
        r = client.get("/api/usage/export", query_string={"from": frm, "to": to, **q}, headers=h)
        assert r.status_code == 200
        return list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))

    assert len(export()) == 5
    assert [(r["module"], r["cost_micros"]) for r in export(key_id=key_a)] == [
        ("echo", "10000"), ("text", "5000"), ("chat", "123")]
    assert [r["action"] for r in export(model="big")] == ["big"]
    assert [r["cost_micros"] for r in export(module="echo")] == ["10000", "20000"]
    assert export(module="echo", model="big") == []

    for path in ("/api/usage/current", "/api/usage/by-module"):
        r = client.get(path, query_string={"key_id": "x" * 33}, headers=h)
        assert r.status_code == 400  # beyond the documented length: refused, clear JSON


def test_the_openapi_document_lists_the_filters(client):
    doc = client.get("/openapi.json").get_json()
    for route in ("/api/usage/current", "/api/usage/by-module", "/api/usage/daily", "/api/usage/export"):
        names = {p["name"] for p in doc["paths"][route]["get"].get("parameters", []) if p["in"] == "query"}
        assert {"key_id", "module", "model"} <= names, route
