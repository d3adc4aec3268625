"""Bring your own key (issue 39 item 4): provider keys checked, stored sealed, shown by
prefix; completions they serve go to the provider with the caller's key and are charged the
platform fee (5 % of the list cost) through the chat hold/settle; fallback to the
platform's keys only when the account allows it; reasoning tokens metered at the output price.

Figures (tests/chatfakes.py): healthy OpenAI-shaped fakes report 100 prompt + 50 completion
tokens; m-small at cheap costs 100 × 1 + 50 × 2 = 200 micros → fee 10 micros; at pricey
100 × 3 + 50 × 6 = 600 micros.
"""
from __future__ import annotations

import json
import subprocess

import pytest
from sqlalchemy import select

from app.extensions import db
from app.models import ChatCompletion, LedgerTransaction, ProviderKey
from app.services.money import ledger
from tests.chatfakes import fakes, upstreams  # noqa: F401

MSGS = [{"role": "user", "content": "hello there"}]
OWN = "sk-own-cheap-1234567890"


@pytest.fixture
def acct(make_account):
    return make_account(cents=100, test_key=True)


def add_key(client, acct, provider="cheap", api_key=OWN, key=None):
    return client.post("/api/provider-keys", json={"provider": provider, "api_key": api_key},
                       headers={"Authorization": f"Bearer {key or acct.key}"})


def chat(client, acct, **body):
    body.setdefault("messages", MSGS)
    return client.post("/v1/chat/completions", json=body, headers=acct.headers)


def balance(app, account_id):
    with app.app_context():
        out = ledger.balance(ledger.customer(account_id))
        db.session.remove()
    return out


def test_provider_key_is_checked_sealed_and_shown_by_prefix_only(app, client, fakes, acct):
    fakes.cheap.accept_keys = {OWN}
    r = add_key(client, acct, api_key="sk-wrong-123456789")  # the provider refuses it: nothing stored
    assert r.status_code == 422 and r.get_json()["error"] == "provider_key_invalid", r.get_json()
    assert "refused this key" in r.get_json()["message"]
    r = add_key(client, acct)
    assert r.status_code == 201, r.get_json()
    created = r.get_json()
    assert set(created) == {"id", "provider", "prefix", "created_at", "checked_at"}
    assert created["provider"] == "cheap" and created["prefix"] == OWN[:8] and OWN not in r.get_data(as_text=True)
    assert fakes.cheap.key_checks == ["sk-wrong-123456789", OWN]  # one check call per attempt
    listed = client.get("/api/provider-keys", headers=acct.headers).get_json()
    assert listed == {"provider_keys": [created], "byok_only": False, "byok_fallback": False}
    assert OWN not in str(listed)
    with app.app_context():
        row = db.session.get(ProviderKey, created["id"])
        assert row.owner_kind == "account" and row.owner_id == acct.id
        assert OWN.encode() not in bytes(row.ciphertext)
        db.session.remove()
    assert add_key(client, acct).get_json()["error"] == "provider_key_exists"  # one per provider: 409
    assert add_key(client, acct, provider="nope").status_code == 404  # not in the catalog: does not exist
    assert add_key(client, acct, api_key="has space inside").status_code == 400
    assert add_key(client, acct, key=acct.test_key).status_code == 403  # live keys only
    other = client.delete(f"/api/provider-keys/{created['id']}",
                          headers={"Authorization": f"Bearer {acct.test_key}"})
    assert other.status_code == 403
    r = client.delete(f"/api/provider-keys/{created['id']}", headers=acct.headers)
    assert r.status_code == 200 and r.get_json() == {"deleted": True, "id": created["id"]}
    assert client.delete(f"/api/provider-keys/{created['id']}", headers=acct.headers).status_code == 404


def test_unreachable_provider_stores_nothing(app, client, fakes, acct):
    fakes.cheap.mode = "503"
    r = add_key(client, acct)
    assert r.status_code == 502 and r.get_json()["error"] == "provider_error"
    assert client.get("/api/provider-keys", headers=acct.headers).get_json()["provider_keys"] == []


def test_another_accounts_provider_key_is_not_found(client, fakes, acct, make_account):
    kid = add_key(client, acct).get_json()["id"]
    other = make_account()
    assert client.delete(f"/api/provider-keys/{kid}", headers=other.headers).status_code == 404
    assert client.get("/api/provider-keys", headers=other.headers).get_json()["provider_keys"] == []


def test_byok_completion_uses_the_own_key_and_is_charged_the_fee(app, client, fakes, acct, ledger_clean):
    fakes.cheap.accept_keys = {OWN}
    kid = add_key(client, acct).get_json()["id"]
    before = balance(app, acct.id)
    r = chat(client, acct, model="m-small")
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["provider"] == "cheap" and r.headers["X-Chat-Byok"] == kid
    assert fakes.cheap.headers[-1]["Authorization"] == f"Bearer {OWN}"
    usage = body["usage"]
    # the fee: 5 % of the 200-micro list cost; the list cost is the caller's provider's bill
    assert usage["cost_micros"] == 10 and usage["provider_cost_micros"] == 200
    assert usage["byok"] is True and usage["byok_fee_pct"] == 5.0
    assert r.headers["X-Gateway-Cost-Micros"] == "10"
    # savings compare the caller's whole cost (200 + 10) with the reference (pricey: 600)
    assert usage["savings_pct"] == 65.0
    assert balance(app, acct.id) == before - 10
    with app.app_context():
        row = db.session.execute(select(ChatCompletion).where(ChatCompletion.id == body["id"])).scalar_one()
        assert (row.status, row.cost_micros, row.byok_key_id, row.list_cost_micros) == ("settled", 10, kid, 200)
        settle = db.session.execute(select(LedgerTransaction).where(
            LedgerTransaction.ref == f"chat_settle:{body['id']}")).scalar_one()
        assert settle.kind == "chat_settle"
        db.session.remove()
    ledger_clean()


def test_fee_percent_is_configurable_and_rounded_half_up(app, client, fakes, acct, monkeypatch, ledger_clean):
    monkeypatch.setitem(app.config, "CHAT_BYOK_FEE_PERCENT", "2.25")
    add_key(client, acct)
    r = chat(client, acct, model="m-small")
    # 200 × 2.25 % = 4.5 micros → 5 (half up, once)
    assert r.get_json()["usage"]["cost_micros"] == 5 and r.get_json()["usage"]["byok_fee_pct"] == 2.25
    ledger_clean()


def test_hold_is_the_fee_of_the_estimated_maximum(app, client, fakes, acct, ledger_clean):
    """A balance far below the model price can chat with its own key: the hold is the fee."""
    add_key(client, acct)
    drain = balance(app, acct.id) - 3  # leave 3 micros: the list-price hold would not fit
    with app.app_context():
        from app.services.platform.uow import unit_of_work

        with unit_of_work():
            ledger.post("operator_adjustment", [(ledger.customer(acct.id), -drain), (ledger.ADJUST, drain)],
                        ref="test:drain", account_id=acct.id)
        db.session.remove()
    r = chat(client, acct, model="m-small", max_tokens=20)  # list maximum 10 + 40 = 50 micros; fee 3
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["usage"]["cost_micros"] == 3  # 200 × 5 % = 10, capped at the 3-micro hold
    ledger_clean()


def test_failing_own_key_does_not_fall_back_unless_allowed(app, client, fakes, acct, ledger_clean):
    add_key(client, acct)
    fakes.cheap.accept_keys = {"sk-rotated-at-the-provider"}  # the stored key stopped working
    before = balance(app, acct.id)
    r = chat(client, acct, model="m-small")
    assert r.status_code == 502 and r.get_json()["error"]["code"] == "provider_error"
    assert fakes.pricey.calls == 0 and balance(app, acct.id) == before  # never the platform's key
    r = client.patch("/api/provider-keys/settings", json={"byok_fallback": True}, headers=acct.headers)
    assert r.status_code == 200 and r.get_json() == {"byok_only": False, "byok_fallback": True}
    r = chat(client, acct, model="m-small")
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["provider"] == "pricey" and "byok" not in body["usage"] and "X-Chat-Byok" not in r.headers
    # own key, then the platform's key of cheap (refused by this fake too), then pricey
    assert body["usage"]["cost_micros"] == 600 and r.headers["X-Chat-Attempts"] == "3"
    assert balance(app, acct.id) == before - 600
    ledger_clean()


def test_models_without_an_own_key_use_the_platform_unless_byok_only(app, client, fakes, acct, ledger_clean):
    add_key(client, acct)
    r = chat(client, acct, model="m-big")  # only pricey serves it: the platform's key, the price
    assert r.status_code == 200 and r.get_json()["provider"] == "pricey"
    assert "byok" not in r.get_json()["usage"]
    r = client.patch("/api/provider-keys/settings", json={"byok_only": True}, headers=acct.headers)
    assert r.get_json()["byok_only"] is True
    r = chat(client, acct, model="m-big")
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "no_matching_model"
    assert "byok_only" in r.get_json()["error"]["message"]
    r = chat(client, acct, model="auto")  # auto: only what the own keys serve
    assert r.status_code == 200 and r.get_json()["provider"] == "cheap" and r.get_json()["usage"]["byok"]
    # and GET /v1/models lists only what the own keys serve (before: m-big too)
    listed = {m["id"]: m["owned_by"] for m in client.get("/v1/models", headers=acct.headers).get_json()["data"]}
    assert "m-big" not in listed and listed["auto"] == "gateway"
    assert listed and all(owner == "cheap" for model, owner in listed.items() if model != "auto"), listed
    assert client.get("/v1/models/m-big", headers=acct.headers).status_code == 404
    assert client.patch("/api/provider-keys/settings", json={"byok_only": "yes"},
                        headers=acct.headers).status_code == 400
    ledger_clean()


def test_own_key_serves_a_provider_the_platform_has_no_key_for(app, client, fakes, acct, monkeypatch,
                                                                 ledger_clean):
    """claude requires a key: without the platform's, the own key alone makes m-claude
    available (Anthropic's x-api-key carries it)."""
    monkeypatch.setitem(app.config, "CHAT_PROVIDERS", {})
    app.extensions.pop("chat_catalog", None)
    assert chat(client, acct, model="m-claude").status_code == 404
    assert add_key(client, acct, provider="claude", api_key="sk-ant-own-123456").status_code == 201
    assert fakes.claude.headers == [] and fakes.claude.key_checks == ["sk-ant-own-123456"]
    r = chat(client, acct, model="m-claude")
    assert r.status_code == 200, r.get_json()
    assert fakes.claude.headers[-1]["x-api-key"] == "sk-ant-own-123456"
    # GET /v1/models lists it for this account now (before: only the platform's models)
    listed = {m["id"]: m for m in client.get("/v1/models", headers=acct.headers).get_json()["data"]}
    assert listed["m-claude"]["owned_by"] == "claude"
    assert client.get("/v1/models/m-claude", headers=acct.headers).status_code == 200
    test_key = {"Authorization": f"Bearer {acct.test_key}"}  # test mode never uses own keys
    assert "m-claude" not in {m["id"] for m in client.get("/v1/models", headers=test_key).get_json()["data"]}
    # 20 × 4 + 10 × 20 = 280 micros list; fee 14
    assert r.get_json()["usage"]["provider_cost_micros"] == 280 and r.get_json()["usage"]["cost_micros"] == 14
    ledger_clean()


def test_byok_stream_and_messages_api_carry_the_fee(app, client, fakes, acct, ledger_clean):
    add_key(client, acct)
    r = chat(client, acct, model="m-small", stream=True)
    assert r.status_code == 200
    text = r.get_data(as_text=True)
    assert '"byok":true' in text and '"cost_micros":10' in text and '"provider_cost_micros":200' in text
    r = client.post("/v1/messages", json={"model": "m-small", "max_tokens": 200, "messages": MSGS},
                    headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    usage = r.get_json()["usage"]
    assert usage["cost_micros"] == 10 and usage["byok"] is True and usage["provider_cost_micros"] == 200
    ledger_clean()


def test_test_mode_never_uses_own_keys(app, client, fakes, acct):
    add_key(client, acct)
    r = client.post("/v1/chat/completions", json={"model": "auto", "messages": MSGS},
                    headers={"Authorization": f"Bearer {acct.test_key}"})
    assert r.status_code == 200 and r.get_json()["provider"] == "demo_llm"
    assert fakes.cheap.calls == 0


def test_provider_keys_are_not_in_the_database_dump(app, client, fakes, acct):
    add_key(client, acct)
    url = app.config["SQLALCHEMY_DATABASE_URI"].replace("postgresql+psycopg://", "postgresql://")
    from app.services.platform import embedded_pg

    # the wheel's pg_dump (PostgreSQL 18): a system one older than the server (the embedded
    # default) refuses to dump it, and a fresh machine may have none
    dump = subprocess.run([embedded_pg.tool("pg_dump"), "--data-only", url], capture_output=True, check=True).stdout
    assert OWN.encode() not in dump and OWN[:8].encode() in dump


def test_usage_export_names_the_own_key_and_the_list_cost(app, client, fakes, acct):
    kid = add_key(client, acct).get_json()["id"]
    byok_id = chat(client, acct, model="m-small").get_json()["id"]
    plain_id = chat(client, acct, model="m-big").get_json()["id"]
    from datetime import datetime, timedelta, timezone

    now = datetime.now(timezone.utc)
    r = client.get("/api/usage/export", query_string={"from": (now - timedelta(hours=1)).isoformat(),
                                                      "to": (now + timedelta(hours=1)).isoformat(),
                                                      "format": "json"}, headers=acct.headers)
    import orjson

    rows = {row["call_id"]: row for row in map(orjson.loads, r.get_data().splitlines())}
    assert (rows[byok_id]["byok_key_id"], rows[byok_id]["cost_micros"], rows[byok_id]["provider_cost_micros"]) \
        == (kid, 10, 200)
    assert (rows[plain_id]["byok_key_id"], rows[plain_id]["provider_cost_micros"]) == (None, None)


def test_openai_sdk_byok_completion_is_charged_the_fee(app, fakes, acct, ledger_clean):
    """The real `openai` client against a real server: the usage shows the fee and BYOK."""
    import openai

    from tests.chatfakes import live_server

    fakes.cheap.accept_keys = {OWN}
    with app.test_client() as c:
        add_key(c, acct)
    before = balance(app, acct.id)
    with live_server(app, "byok") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key=acct.key, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model="m-small", messages=MSGS)
        done = raw.parse()
        extra = done.usage.model_extra
        assert (extra["cost_micros"], extra["byok"], extra["provider_cost_micros"]) == (10, True, 200)
        assert raw.headers["x-gateway-cost-micros"] == "10" and raw.headers["x-chat-byok"].startswith("pkey_")
        stream = client.chat.completions.create(model="m-small", messages=MSGS, stream=True)
        last = [chunk for chunk in stream][-1]
        assert last.usage.model_extra["cost_micros"] == 10 and last.usage.model_extra["byok"] is True
    assert balance(app, acct.id) == before - 20
    ledger_clean()


def test_statements_a_byok_completion_adds(app, client, fakes, acct, ledger_clean):
    """What BYOK and the key controls cost in round trips: a plain completion runs the hold and
    the settle only; a BYOK completion adds the read of the own keys and the record of the key
    before the settle; a key with rpm and tpm limits counting in PostgreSQL adds its three
    counts (the request, the tokens' admission, their correction)."""
    seen = []

    def _sql(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.strip().upper() != "SELECT 1":
            seen.append(statement)

    from contextlib import ExitStack

    from tests.support.sqlevents import listening

    with app.app_context():
        engines = [db.engine]  # the one pool: its autocommit view shares the engine's events

    def run(key, **body):
        assert chat(client, acct, model="m-small", **body).status_code == 200  # warm caches
        seen.clear()
        r = client.post("/v1/chat/completions", json={"model": "m-small", "messages": MSGS, **body},
                        headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.get_json()
        return list(seen)

    with ExitStack() as stack:
        for engine in engines:
            stack.enter_context(listening(engine, ("before_cursor_execute", _sql)))
        plain = run(acct.key)
        add_key(client, acct)
        byok = run(acct.key)
        limited_key = client.post("/api/keys", json={"name": "limited", "rpm_limit": 100, "tpm_limit": 100000},
                                  headers=acct.headers).get_json()["key"]
        limited = run(limited_key)
    assert [s for s in plain if "gw_chat_" in s] == [s for s in byok if "gw_chat_" in s]
    assert len(byok) - len(plain) == 2 and any("provider_keys" in s for s in byok)
    counted = [s for s in limited if "gw_rate_hit" in s]
    if app.config["RATELIMIT_STORAGE_URI"].startswith("redis"):
        assert counted == []
    else:  # the plan's count (every request), then the key's rpm, tpm and the tpm's settle
        assert len(counted) == 4 and len([s for s in plain if "gw_rate_hit" in s]) == 1
    ledger_clean()


def test_the_settings_path_is_not_a_provider_key_id(client, make_account):
    """``/api/provider-keys/settings`` and ``/api/provider-keys/{id}`` do not overlap: the id
    is the platform's id form, so OPTIONS on the settings advertises PATCH only and a
    DELETE there is 405, not an attempt to delete a key named "settings" (schemathesis:
    Allow header mismatch)."""
    acct = make_account()
    r = client.options("/api/provider-keys/settings", headers=acct.headers)
    assert set(r.headers["Allow"].split(", ")) == {"PATCH", "OPTIONS"}
    assert client.delete("/api/provider-keys/settings", headers=acct.headers).status_code == 405


KEY_A, KEY_B, KEY_C = "a1" * 32, "b2" * 32, "c3" * 32


def _sealed_under(app, key_id):
    """Which of KEY_A / KEY_B / KEY_C / the SECRET_KEY-derived key seals ``key_id``'s row."""
    from app.services.chat.byok import derived_key
    from app.services.platform import crypto

    with app.app_context():
        sealed = bytes(db.session.get(ProviderKey, key_id).ciphertext)
        db.session.remove()
    names = {"A": bytes.fromhex(KEY_A), "B": bytes.fromhex(KEY_B), "C": bytes.fromhex(KEY_C),
             "derived": derived_key(app.config["SECRET_KEY"])}
    return [n for n, k in names.items() if crypto.unseal(k, sealed) == OWN] or None


def test_encryption_key_rotation_keeps_own_keys_working(app, client, fakes, acct, make_account, monkeypatch,
                                                         ledger_clean):
    """Rotating BYOK_ENCRYPTION_KEY: with the old key in BYOK_PREVIOUS_KEYS the stored keys
    keep serving (before: skipped, the completion went to the platform at the full price);
    ``flask chat reseal-keys`` seals them under the new key, after which the old key can go.
    A key under none of the configured keys is counted, listed and left as it was (exit 1)."""
    fakes.cheap.accept_keys = {OWN}
    monkeypatch.setitem(app.config, "BYOK_ENCRYPTION_KEY", KEY_A)
    kid = add_key(client, acct).get_json()["id"]
    assert _sealed_under(app, kid) == ["A"]
    monkeypatch.setitem(app.config, "BYOK_ENCRYPTION_KEY", KEY_C)  # a key nobody will configure again
    lost = add_key(client, make_account()).get_json()["id"]

    monkeypatch.setitem(app.config, "BYOK_ENCRYPTION_KEY", KEY_B)  # rotated; A kept for reading
    monkeypatch.setitem(app.config, "BYOK_PREVIOUS_KEYS", f" {KEY_A} ")
    r = chat(client, acct, model="m-small")
    assert r.status_code == 200, r.get_json()
    assert r.headers["X-Chat-Byok"] == kid and r.get_json()["usage"]["cost_micros"] == 10
    assert fakes.cheap.headers[-1]["Authorization"] == f"Bearer {OWN}"

    runner = app.test_cli_runner()
    res = runner.invoke(args=["chat", "reseal-keys"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.output) == {"resealed": 1, "current": 0, "unreadable": 1, "unreadable_ids": [lost]}
    assert _sealed_under(app, kid) == ["B"] and _sealed_under(app, lost) == ["C"]  # the lost one untouched

    monkeypatch.setitem(app.config, "BYOK_PREVIOUS_KEYS", "")  # A retired
    r = chat(client, acct, model="m-small")
    assert r.status_code == 200 and r.headers["X-Chat-Byok"] == kid
    res = runner.invoke(args=["chat", "reseal-keys"])  # again: nothing left to reseal
    assert json.loads(res.output) == {"resealed": 0, "current": 1, "unreadable": 1, "unreadable_ids": [lost]}
    ledger_clean()


def test_setting_an_explicit_key_keeps_keys_sealed_under_the_derived_one(app, client, fakes, acct, monkeypatch,
                                                                        ledger_clean):
    """Keys stored while BYOK_ENCRYPTION_KEY was unset (sealed under the key derived from
    SECRET_KEY) keep serving once it is set, and reseal moves them to the explicit key."""
    fakes.cheap.accept_keys = {OWN}
    monkeypatch.setitem(app.config, "BYOK_ENCRYPTION_KEY", None)
    kid = add_key(client, acct).get_json()["id"]
    assert _sealed_under(app, kid) == ["derived"]
    monkeypatch.setitem(app.config, "BYOK_ENCRYPTION_KEY", KEY_B)
    r = chat(client, acct, model="m-small")
    assert r.status_code == 200 and r.headers["X-Chat-Byok"] == kid
    res = app.test_cli_runner().invoke(args=["chat", "reseal-keys"])
    assert res.exit_code == 0 and json.loads(res.output)["resealed"] == 1
    assert _sealed_under(app, kid) == ["B"]
    ledger_clean()


@pytest.mark.parametrize("previous", ["nothex" * 8, "ab" * 31, f"{KEY_A},{KEY_B[:-2]}"])
def test_previous_keys_are_checked_at_start(previous):
    from config import ConfigError, _check_byok

    with pytest.raises(ConfigError, match="BYOK_PREVIOUS_KEYS"):
        _check_byok({"CHAT_BYOK_FEE_PERCENT": "5", "BYOK_ENCRYPTION_KEY": KEY_A, "BYOK_PREVIOUS_KEYS": previous})
    _check_byok({"CHAT_BYOK_FEE_PERCENT": "5", "BYOK_ENCRYPTION_KEY": KEY_A, "BYOK_PREVIOUS_KEYS": f"{KEY_B}, {KEY_C}"})
