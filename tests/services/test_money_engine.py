"""The money engine's rules, written once in SQL (app/services/money/sql/): the database
itself refuses what the ledger promises never happens, every posting goes through
``gw_post``, spend reservations go back to the period they were taken in, and who acted
is recorded apart from who pays."""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError

from app.extensions import db
from app.services.money import ledger
from tests.gateway_helpers import call, create_module, provider, provider_server  # noqa: F401


def _sqlstate(exc: DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


def _post(conn, codes, amounts, *, ref=None, soft=False, payer=None):
    return conn.execute(text("SELECT gw_post('t', :ref, :payer, NULL, NULL, CAST(:c AS varchar[]), "
                             "CAST(:a AS bigint[]), now(), :soft)"),
                        {"ref": ref, "payer": payer, "c": codes, "a": amounts, "soft": soft}).scalar()


def test_gw_post_refuses_unbalanced_and_empty_postings(app, account):
    with app.app_context():
        for codes, amounts in ((["revenue:platform", "promo:grants"], [5, -4]), ([], []),
                               (["revenue:platform"], [0]), (["revenue:platform"], [1, -1])):
            with db.engine.connect() as conn, pytest.raises(DBAPIError) as err:
                _post(conn, codes, amounts)
            assert _sqlstate(err.value) == "GWUNB"


def test_an_unbalanced_posting_moves_no_balance(app, make_account, ledger_clean):
    """gw_post leaves the sum to the database's trigger, which runs after the balances
    moved: the error must undo them; a soft posting whose debit is uncovered is refused
    before the legs are written, unbalanced or not. Nothing is written either way."""
    a, b = make_account(cents=100), make_account(cents=0)

    def balances(conn):
        return conn.execute(text("SELECT id, balance_micros FROM accounts WHERE id IN (:a, :b) ORDER BY id"),
                            {"a": a.id, "b": b.id}).all()

    with app.app_context():
        with db.engine.connect() as conn:
            before = balances(conn)
        for soft in (False, True):
            with db.engine.connect() as conn, pytest.raises(DBAPIError) as err:
                _post(conn, [f"acct:{a.id}", f"acct:{b.id}", "revenue:platform"], [-500, 300, 100],
                      ref=f"unbalanced-{soft}", soft=soft)
            assert _sqlstate(err.value) == "GWUNB"
        with db.engine.begin() as conn:
            assert _post(conn, [f"acct:{b.id}", "revenue:platform"], [-500, 100], ref="uncovered", soft=True) is None
        with db.engine.connect() as conn:
            assert balances(conn) == before
            assert conn.execute(text("SELECT count(*) FROM ledger_transactions WHERE ref LIKE 'unbalanced-%' "
                                     "OR ref = 'uncovered'")).scalar() == 0
    ledger_clean()


def test_the_database_refuses_an_unbalanced_entry_written_around_the_engine(app, account, ledger_clean):
    with app.app_context():
        with db.engine.begin() as conn:
            txn = _post(conn, ["promo:grants", "revenue:platform"], [-3, 3])
        with db.engine.connect() as conn, pytest.raises(DBAPIError) as err:
            conn.execute(text("INSERT INTO ledger_entries (txn_id, ledger_account, amount_micros, created_at) "
                              "VALUES (:t, 'revenue:platform', 7, now())"), {"t": txn})
        assert _sqlstate(err.value) == "GWUNB"
    ledger_clean()


@pytest.mark.parametrize("statement", [
    "UPDATE ledger_entries SET amount_micros = amount_micros + 1",
    "DELETE FROM ledger_entries",
    "UPDATE ledger_transactions SET kind = 'x'",
    "DELETE FROM ledger_transactions",
])
def test_the_ledger_is_append_only(app, account, statement):
    with app.app_context(), db.engine.connect() as conn, pytest.raises(DBAPIError) as err:
        conn.execute(text(statement))
    assert _sqlstate(err.value) == "GWAPP"


def test_the_database_refuses_a_negative_balance(app, account):
    with app.app_context(), db.engine.connect() as conn, pytest.raises(IntegrityError):
        conn.execute(text("UPDATE accounts SET balance_micros = -1 WHERE id = :i"), {"i": account.id})


def test_an_uncovered_debit_leaves_nothing(app, make_account, ledger_clean):
    a, b = make_account(cents=1), make_account(cents=0)
    with app.app_context():
        with db.engine.begin() as conn:
            # a credit to a (ordered first) then b's debit refused: a's credit is undone
            assert _post(conn, [f"acct:{b.id}", f"acct:{a.id}"], [-5, 5], ref="soft", soft=True) is None
            with pytest.raises(DBAPIError) as err:
                with conn.begin_nested():
                    _post(conn, [f"acct:{b.id}", f"acct:{a.id}"], [-5, 5], ref="hard")
            assert _sqlstate(err.value) == "GW402"
            assert conn.execute(text("SELECT count(*) FROM ledger_transactions WHERE ref IN ('soft', 'hard')")
                                ).scalar() == 0
        with pytest.raises(ledger.InsufficientFunds) as err:
            ledger.post("t", [(ledger.customer(b.id), -1), (ledger.REVENUE, 1)])
        assert (err.value.account_id, err.value.needed_micros) == (b.id, 1)
        # the caller's transaction goes on after a refusal
        ledger.post("t", [(ledger.customer(a.id), -10_000), (ledger.customer(b.id), 10_000)])
        db.session.commit()
        assert ledger.cached_balance(a.id) == 0 and ledger.cached_balance(b.id) == 10_000
    ledger_clean()


@pytest.fixture
def priced(app, provider):
    create_module(app, "priced", provider, {"five": (5, "/ok"), "one": (1, "/ok"), "two": (2, "/ok")})
    return "priced"


def _limited_key(client, acct, cents, period):
    r = client.post("/api/keys", json={"name": "limited", "spend_limit_cents": cents,
                                       "spend_limit_period": period}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def test_a_refund_gives_room_back_to_the_period_it_was_reserved_in(app, client, make_account, priced,
                                                                    ledger_clean):
    """Issue 42 item 13: 7 cents/day, a 5-cent call in flight, the limit changed to 7
    cents/month, then the first call refunded: the refund gives its 5 cents back to the
    day's counter it was reserved in and takes nothing off the month's (it once dropped
    the month's to 0, and 7 more cents passed). Since 2026-11-29 a period change carries the
    count over (docs/decisions.md "A period change carries the count"): the month starts at
    the day's 5 cents, so a second 5-cent call does not fit and a 2-cent one does."""
    from app.services.gateway import calls, catalog
    from app.services.money import refunds

    acct = make_account(cents=100)
    key = _limited_key(client, acct, 7, "day")
    with app.app_context():
        mod = catalog.get_module(priced)
        in_flight = calls.open_call(account_id=acct.id, mode="live", mod=mod, act=catalog.get_action(mod, "five"),
                                    body={"action": "five"}, key_id=key["id"], actor=key["id"])
        db.session.remove()
    r = client.patch(f"/api/keys/{key['id']}", json={"spend_limit_period": "month"}, headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    assert call(client, acct, {"action": "five"}, slug=priced, bearer=key["key"]).status_code == 402
    assert call(client, acct, {"action": "two"}, slug=priced, bearer=key["key"]).status_code == 200
    with app.app_context():
        assert refunds.refund(in_flight, "provider_error")
        db.session.remove()
    assert call(client, acct, {"action": "one"}, slug=priced, bearer=key["key"]).status_code == 402
    ledger_clean()


def test_who_acted_is_recorded_apart_from_who_pays(app, client, make_account, priced):
    acct = make_account(cents=10)
    key = client.post("/api/keys", json={"name": "actor"}, headers=acct.headers).get_json()
    r = call(client, acct, {"action": "one"}, slug=priced, bearer=key["key"])
    assert r.status_code == 200, r.get_json()
    call_id = r.get_json()["call_id"]
    with app.app_context():
        row = db.session.execute(text("SELECT account_id, actor FROM module_calls WHERE id = :i"),
                                 {"i": call_id}).one()
        txn = db.session.execute(text("SELECT account_id, actor FROM ledger_transactions WHERE ref = :r"),
                                 {"r": f"call:{call_id}"}).one()
        db.session.remove()
    assert tuple(row) == tuple(txn) == (acct.id, key["id"])
