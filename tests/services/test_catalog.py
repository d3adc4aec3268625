"""Catalog YAML: idempotent load, price/action changes without touching history, env
expansion, validation errors, and the public listing."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import Module, ModuleAction, ModuleCall
from app.services.gateway import catalog
from tests.gateway_helpers import PROVIDER, call, provider, provider_server  # noqa: F401

YAML = """
slug: cat
name: Cat
description: test
owner: Tests
upstream_url: ${{CAT_URL:-{url}}}
sandbox_url: ${{CAT_URL:-{url}}}/sandbox
provider_auth: {{type: header, header: X-Provider-Key, env: TEST_PROVIDER_SECRET, default: s}}
actions:
  - name: ok
    price_cents: {price}
    path: /ok
  - name: bad
    price_cents: 1
    path: /bad
"""


def _write(tmp_path, url, price=2, extra=""):
    d = tmp_path / "modules"
    d.mkdir(exist_ok=True)
    (d / "cat.yaml").write_text(YAML.format(url=url, price=price) + extra)
    return str(d)


def test_demo_catalog_loads_idempotently(app):
    runner = app.test_cli_runner()
    r1 = runner.invoke(args=["catalog", "load"])
    assert r1.exit_code == 0, r1.output
    assert set(json.loads(r1.output)["created"]) >= {"echo", "text", "weather"}
    r2 = runner.invoke(args=["catalog", "load"])
    assert json.loads(r2.output) == {"created": [], "updated": [],
                                     "unchanged": json.loads(r1.output)["created"]}
    with app.app_context():
        assert db.session.execute(select(Module.slug).order_by(Module.slug)).scalars().all() \
            == ["echo", "text", "weather"]
        db.session.remove()


def test_price_and_action_changes_keep_history(app, client, make_account, provider, tmp_path, ledger_clean):
    path = _write(tmp_path, provider, price=2)
    with app.app_context():
        assert catalog.load(path)["created"] == ["cat"]
    acct = make_account(cents=20)
    first = call(client, acct, {"action": "ok"}, slug="cat")
    assert first.get_json()["cost_cents"] == 2
    # new price, and the "bad" action removed
    d = tmp_path / "modules" / "cat.yaml"
    d.write_text(d.read_text().replace("price_cents: 2", "price_cents: 5").split("  - name: bad")[0])
    with app.app_context():
        assert catalog.load(path)["updated"] == ["cat"]
        assert catalog.load(path)["unchanged"] == ["cat"]
        rows = db.session.execute(select(ModuleAction.name, ModuleAction.active, ModuleAction.price_cents)
                                  .order_by(ModuleAction.name)).all()
        db.session.remove()
    assert [tuple(r) for r in rows] == [("bad", False, 1), ("ok", True, 5)]
    assert call(client, acct, {"action": "ok"}, slug="cat").get_json()["cost_cents"] == 5
    r = call(client, acct, {"action": "bad"}, slug="cat")
    assert r.status_code == 404 and r.get_json()["error"] == "unknown_action"
    with app.app_context():
        prices = db.session.execute(select(ModuleCall.price_micros).order_by(ModuleCall.created_at)).scalars().all()
        db.session.remove()
    assert prices == [20_000, 50_000]
    ledger_clean()


def test_env_expansion(app, tmp_path, monkeypatch):
    monkeypatch.setenv("CAT_URL", "http://provider.example:9000")
    path = _write(tmp_path, "http://unused")
    with app.app_context():
        catalog.load(path)
        m = db.session.execute(select(Module).where(Module.slug == "cat")).scalar_one()
        assert (m.upstream_url, m.sandbox_url) == ("http://provider.example:9000",
                                                   "http://provider.example:9000/sandbox")
        db.session.remove()


@pytest.mark.parametrize("mutate,needle", [
    (lambda s: s.replace("slug: cat", "slug: Bad Slug"), "slug"),
    (lambda s: s.replace("price_cents: 1", "price_cents: -1"), "price_cents"),
    (lambda s: s.replace("path: /ok", "path: ok"), "path"),
    (lambda s: s.replace("${CAT_URL:-", "${CAT_URL_UNSET_X}${CAT_URL:-"), "CAT_URL_UNSET_X"),
    (lambda s: s.replace("type: header", "type: magic"), "provider_auth"),
    (lambda s: s + "  - name: ok\n    price_cents: 1\n", "duplicated"),
    # a dot would make the MCP tool name <slug>__<action> one no model API accepts (before: loaded)
    (lambda s: s.replace("  - name: ok", "  - name: v1.ok"), "'v1.ok' missing, invalid"),
    (lambda s: s.replace("name: Cat", "name: [unclosed"), "YAML"),
])
def test_invalid_catalog_is_refused_and_changes_nothing(app, tmp_path, mutate, needle):
    d = tmp_path / "modules"
    d.mkdir()
    (d / "cat.yaml").write_text(mutate(YAML.format(url="http://x.example", price=1)))
    r = app.test_cli_runner().invoke(args=["catalog", "load", str(d)])
    assert r.exit_code != 0 and needle in r.output, r.output
    with app.app_context():
        assert db.session.execute(select(Module)).first() is None
        db.session.remove()


def test_public_listing(app, client, provider, tmp_path):
    with app.app_context():
        catalog.load(_write(tmp_path, provider))
        assert db.session.execute(select(Module).where(Module.slug == "cat")).scalar_one().status == "approved"
        hidden = Module(slug="hidden", name="Hidden", upstream_url=provider, status="review")
        db.session.add(hidden)
        db.session.commit()
        db.session.remove()
    r = client.get("/api/modules")
    assert r.status_code == 200
    mods = r.get_json()["modules"]
    assert [m["slug"] for m in mods] == ["cat"]
    assert mods[0]["actions"] == [{"name": "bad", "description": "", "price_cents": 1},
                                  {"name": "ok", "description": "", "price_cents": 2}]
    assert "upstream_url" not in mods[0] and "provider_auth" not in mods[0]
    assert client.get("/api/modules/cat").get_json()["slug"] == "cat"
    r = client.get("/api/modules/hidden")
    assert r.status_code == 404 and r.get_json()["error"] == "module_not_found"
