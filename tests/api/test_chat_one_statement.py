"""The chat path's database statements (issue 18 item 4): on PostgreSQL the hold is ONE
statement run alone in autocommit (``gw_chat_hold``) and the settle ONE statement
(``gw_chat_settle``); a spend-limited key reserves its room in the hold's transaction and
gets the unused part back at settle; a refused hold writes nothing (both databases)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import event, func, select

from app.extensions import db
from app.models import ChatCompletion, KeySpend
from app.services.accounts import spend
from app.services.platform import uow
from tests.api.test_chat import START, acct, chat, fakes, figures, upstreams  # noqa: F401

MONEY_TABLES = ("chat_completions", "ledger_", "accounts", "key_spend")


@pytest.fixture
def statements(app):
    """(statement, ran in autocommit) of every SQL statement the app runs (pre-pings excluded)."""
    seen: list[tuple[str, bool]] = []

    def _sql(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.strip().upper() != "SELECT 1":
            seen.append((statement, bool(getattr(conn.connection.dbapi_connection, "autocommit", False))))

    with app.app_context():  # the session's engine and the autocommit one (uow.one_statement)
        engines = [db.engine] + ([uow._autocommit_engine()] if db.engine.dialect.name == "postgresql" else [])
    for engine in engines:
        event.listen(engine, "before_cursor_execute", _sql)
    yield seen
    for engine in engines:
        event.remove(engine, "before_cursor_execute", _sql)


def _pg(app) -> bool:
    with app.app_context():
        return db.engine.dialect.name == "postgresql"


def _key(client, acct, **body):  # noqa: F811
    r = client.post("/api/keys", json={"name": "k", **body}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def _spent(app, key_id) -> int:
    with app.app_context():
        out = spend.spent(key_id, "day", datetime.now(timezone.utc))
        db.session.remove()
    return out


def test_hold_alone_in_autocommit_and_settle_in_one_statement(app, client, fakes, acct, statements,  # noqa: F811
                                                              ledger_clean):
    if not _pg(app):
        pytest.skip("the one-statement path is PostgreSQL's (SQLite keeps the simple path)")
    assert chat(client, acct, model="m-small", max_tokens=100).status_code == 200  # warm the caches
    statements.clear()
    r = chat(client, acct, model="m-small", max_tokens=100)
    assert r.status_code == 200, r.get_json()
    money = [(s, auto) for s, auto in statements if "gw_chat_" in s or (
        s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) and any(t in s for t in MONEY_TABLES))]
    # hold and settle: one autocommit statement each (no BEGIN/COMMIT), and nothing else
    assert [("gw_chat_hold" in s, "gw_chat_settle" in s, auto) for s, auto in money] == [
        (True, False, True), (False, True, True)], money
    f = figures(app, acct.id)
    assert f["balance"] == START - 2 * 200 and f["revenue"] == 400 and f["held"] == 0
    ledger_clean()


def test_limited_key_holds_within_its_limit_and_gets_the_unused_part_back(app, client, fakes, acct,  # noqa: F811
                                                                          ledger_clean):
    key = _key(client, acct, spend_limit_cents=1, spend_limit_period="day")  # 10,000 micros
    # the hold (10 × 3 + 100 × 6 = 630 micros) fits; the exact cost is 200 micros
    r = chat(client, acct, key=key["key"], model="m-small", max_tokens=100)
    assert r.status_code == 200, r.get_json()
    assert _spent(app, key["id"]) == 200  # the unused 430 micros of the hold came back
    # a hold of 10 × 3 + 4 choices × 500 × 6 = 12,030 micros does not fit: 402, nothing written
    r = chat(client, acct, key=key["key"], model="m-small", max_tokens=500, n=4)
    assert r.status_code == 402 and r.get_json()["error"] == "key_spend_limit_reached", r.get_json()
    assert _spent(app, key["id"]) == 200
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(ChatCompletion)
                                  .where(ChatCompletion.account_id == acct.id)).scalar_one() == 1
        db.session.remove()
    assert figures(app, acct.id)["balance"] == START - 200
    ledger_clean()


def test_limited_key_short_balance_is_402_and_leaves_the_limit_untouched(app, client, fakes,  # noqa: F811
                                                                          make_account, ledger_clean):
    poor = make_account(cents=0)
    key = _key(client, poor, spend_limit_cents=5, spend_limit_period="day")
    r = chat(client, poor, key=key["key"], model="m-small", max_tokens=100)
    assert r.status_code == 402 and r.get_json()["error"] == "payment_required", r.get_json()
    assert r.headers["X-Price-Micros"] == "630"
    with app.app_context():
        # the key's reservation was rolled back with the refused hold
        assert db.session.execute(select(func.coalesce(func.sum(KeySpend.spent_micros), 0))
                                  .where(KeySpend.key_id == key["id"])).scalar_one() == 0
        assert db.session.execute(select(func.count()).select_from(ChatCompletion)
                                  .where(ChatCompletion.account_id == poor.id)).scalar_one() == 0
        db.session.remove()
    ledger_clean()


def test_chat_phases_are_spans(app, client, fakes, acct, monkeypatch):  # noqa: F811
    from contextlib import nullcontext

    from app import telemetry

    names = []
    monkeypatch.setattr(telemetry, "span", lambda name: names.append(name) or nullcontext())
    assert chat(client, acct, model="m-small", max_tokens=100).status_code == 200
    assert names == ["chat.route", "chat.hold", "chat.provider", "chat.settle"]
    names.clear()
    r = chat(client, acct, model="m-small", max_tokens=100, stream=True)
    assert r.status_code == 200 and r.data.endswith(b"data: [DONE]\n\n")
    assert names == ["chat.route", "chat.hold", "chat.provider", "chat.settle"]
