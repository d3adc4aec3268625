"""The chat path's database statements (issue 18 item 4): on PostgreSQL the hold is ONE
statement run alone in autocommit (``gw_chat_holds``) and the settle ONE statement
(``gw_chat_settles``), each possibly shared with other completions' (tests/services/
test_chat_groups.py); a spend-limited key reserves its room in the hold's transaction and
gets the unused part back at settle; a refused hold writes nothing (both databases)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from sqlalchemy import func, select

from tests.support.sqlevents import listening
from app.extensions import db
from app.models import ChatCompletion, KeySpend
from app.services.money import spend
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

    with app.app_context():  # the process's one engine (uow's statements included)
        engine = db.engine
    with listening(engine, ("before_cursor_execute", _sql)):
        yield seen


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
    assert chat(client, acct, model="m-small", max_tokens=100).status_code == 200  # warm the caches
    statements.clear()
    r = chat(client, acct, model="m-small", max_tokens=100)
    assert r.status_code == 200, r.get_json()
    money = [(s, auto) for s, auto in statements if "gw_chat_" in s or (
        s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) and any(t in s for t in MONEY_TABLES))]
    # hold and settle: one autocommit statement each (no BEGIN/COMMIT), and nothing else
    assert [("gw_chat_holds" in s, "gw_chat_settles" in s, auto) for s, auto in money] == [
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
    assert r.status_code == 402 and r.get_json()["error"]["code"] == "key_spend_limit_reached", r.get_json()
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
    assert r.status_code == 402 and r.get_json()["error"]["code"] == "payment_required", r.get_json()
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


# ---- issue 18, chat path v2 (migration 0020): one autocommit statement for every key ----

def _money(statements):
    return [(s, auto) for s, auto in statements if "gw_chat_" in s or (
        s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) and any(t in s for t in MONEY_TABLES))]


def _completions(app, account_id) -> list[tuple[str, str]]:
    with app.app_context():
        rows = db.session.execute(select(ChatCompletion.id, ChatCompletion.status)
                                  .where(ChatCompletion.account_id == account_id)).all()
        db.session.remove()
    return [tuple(r) for r in rows]


def test_limited_key_hold_and_settle_are_one_autocommit_statement_each(app, client, fakes, acct,  # noqa: F811
                                                                        statements, ledger_clean):
    key = _key(client, acct, spend_limit_cents=1, spend_limit_period="day")  # 10,000 micros
    assert chat(client, acct, key=key["key"], model="m-small", max_tokens=100).status_code == 200  # warm
    statements.clear()
    r = chat(client, acct, key=key["key"], model="m-small", max_tokens=100)
    assert r.status_code == 200, r.get_json()
    # the reservation is in gw_chat_hold, the give-back in gw_chat_settle: no key_spend
    # statement of Python's, no transaction
    assert [("gw_chat_holds" in s, "gw_chat_settles" in s, auto) for s, auto in _money(statements)] == [
        (True, False, True), (False, True, True)], _money(statements)
    assert _spent(app, key["id"]) == 2 * 200  # each hold's unused 430 micros came back in its settle
    with app.app_context():
        assert {r[0] for r in db.session.execute(select(ChatCompletion.spend_key_id)
                                                  .where(ChatCompletion.account_id == acct.id))} == {key["id"]}
        db.session.remove()
    ledger_clean()


def test_limited_key_refusal_is_one_statement_and_leaves_nothing(app, client, fakes, acct, statements,  # noqa: F811
                                                                 ledger_clean):
    key = _key(client, acct, spend_limit_cents=1, spend_limit_period="day")
    statements.clear()
    # a hold of 12,030 micros does not fit the 10,000-micro limit: 402, nothing written
    r = chat(client, acct, key=key["key"], model="m-small", max_tokens=500, n=4)
    assert r.status_code == 402 and r.get_json()["error"]["code"] == "key_spend_limit_reached", r.get_json()
    assert r.get_json()["limit_cents"] == 1 and r.get_json()["spent_cents"] == 0
    # the refusal was the hold statement's answer for the row, which left nothing of it
    assert [("gw_chat_holds" in s, auto) for s, auto in _money(statements)] == [(True, True)], statements
    assert _spent(app, key["id"]) == 0 and _completions(app, acct.id) == []
    assert figures(app, acct.id)["balance"] == START
    ledger_clean()


def test_settle_gives_the_keys_unused_reservation_back_and_never_charges_more_than_held(
        app, acct, client, ledger_clean):  # noqa: F811
    """Below the hold, the rest comes back to the key; a cost above the hold is charged as
    the hold (never more), so nothing comes back."""
    from app.services.money import holds

    key = _key(client, acct, spend_limit_cents=1, spend_limit_period="day")
    with app.test_request_context():
        at = holds.hold("chatcmpl-v2a", acct.id, "m-small", 600, False, key_id=key["id"])
        assert holds.settle("chatcmpl-v2a", acct.id, 600, 250, model="m-small", provider="p",
                            prompt_tokens=1, completion_tokens=1, estimated=False, attempts=1,
                            latency_ms=1, created_at=at) == 250
        at = holds.hold("chatcmpl-v2b", acct.id, "m-small", 600, False, key_id=key["id"])
        assert holds.settle("chatcmpl-v2b", acct.id, 600, 900, model="m-small", provider="p",
                            prompt_tokens=1, completion_tokens=1, estimated=False, attempts=1,
                            latency_ms=1, created_at=at) == 600
        db.session.remove()
    assert _spent(app, key["id"]) == 250 + 600
    assert figures(app, acct.id)["balance"] == START - 250 - 600
    ledger_clean()


def test_release_finds_the_completion_by_id_and_created_at(app, acct, client, statements,  # noqa: F811
                                                           ledger_clean):
    from datetime import timedelta

    from app.services.money import holds

    key = _key(client, acct, spend_limit_cents=1, spend_limit_period="day")
    with app.test_request_context():
        at = holds.hold("chatcmpl-v2r", acct.id, "m-small", 600, False, key_id=key["id"])
        db.session.remove()
    assert _spent(app, key["id"]) == 600
    with app.app_context():
        # another time is another row (another partition): nothing released
        assert holds.release("chatcmpl-v2r", error="x", created_at=at + timedelta(days=40)) is False
        statements.clear()
        assert holds.release("chatcmpl-v2r", error="no provider answered", created_at=at) is True
        reads = [s for s, _ in statements if "chat_completions" in s and "created_at" in s.split("WHERE", 1)[-1]]
        assert len(reads) >= 2, statements  # the read and the flip both name the partition key
        assert holds.release("chatcmpl-v2r", error="again", created_at=at) is False
        db.session.remove()
    assert _completions(app, acct.id) == [("chatcmpl-v2r", "released")]
    assert _spent(app, key["id"]) == 0 and figures(app, acct.id)["balance"] == START
    ledger_clean()


def _dying_first_connection(monkeypatch, commit: bool) -> list:
    """The first statement ``uow.run_one`` sends runs (and, in autocommit, commits) when
    ``commit`` is set, then its connection is lost, as a server restart between the
    COMMIT and the answer would; with ``commit`` unset it is lost before running it.
    Returns the list of connections the statements went to."""
    import psycopg

    from app.services.platform import uow

    real = psycopg.Cursor.execute
    used: list = []

    def flaky(cursor, query, params=None, **kwargs):
        if "gw_chat_" not in str(query):
            return real(cursor, query, params, **kwargs)
        used.append(cursor.connection)
        if len(used) > 1:
            return real(cursor, query, params, **kwargs)
        if commit:
            real(cursor, query, params, **kwargs)
        cursor.connection.close()  # what libpq reports after the server went away
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Cursor, "execute", flaky)  # how uow.run_one sends a statement
    return used


@pytest.mark.parametrize("committed", [True, False], ids=["died-after-commit", "died-before"])
def test_hold_and_settle_retry_on_a_dead_connection_never_hold_or_charge_twice(
        app, acct, client, monkeypatch, committed, ledger_clean):  # noqa: F811
    from app.services.money import holds

    key = _key(client, acct, spend_limit_cents=1, spend_limit_period="day")
    with app.test_request_context():
        used = _dying_first_connection(monkeypatch, committed)
        at = holds.hold("chatcmpl-v2x", acct.id, "m-small", 600, False, key_id=key["id"])
        assert len(used) == 2  # retried once
        db.session.remove()
    assert _completions(app, acct.id) == [("chatcmpl-v2x", "held")]
    assert _spent(app, key["id"]) == 600 and figures(app, acct.id)["balance"] == START - 600
    with app.test_request_context():
        used = _dying_first_connection(monkeypatch, committed)
        charged = holds.settle("chatcmpl-v2x", acct.id, 600, 250, model="m-small", provider="p",
                               prompt_tokens=1, completion_tokens=1, estimated=False, attempts=1,
                               latency_ms=1, created_at=at)
        assert len(used) == 2
        # a retry after a committed settle finds it settled, writes nothing and answers
        # what the first attempt charged (it answered None, and the caller reported cost 0
        # for a completion the ledger had charged: issue 42 item 13)
        assert charged == 250
        db.session.remove()
    assert _completions(app, acct.id) == [("chatcmpl-v2x", "settled")]
    f = figures(app, acct.id)
    assert f["balance"] == START - 250 and f["held"] == 0
    assert _spent(app, key["id"]) == 250
    ledger_clean()
