"""The usage endpoints' reads (issue 18, p99 at 10M calls): a range of whole UTC days runs
a statement built once (``usage_log.whole_day_rows`` with bind parameters) as ONE
statement — on PostgreSQL on the autocommit connection, outside any session transaction
— and gives exactly the numbers of the general path (``usage_rows``) and of the calls."""
from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy import Engine, func, select

from tests.support.sqlevents import listening
from app.errors import NotFound
from app.extensions import db
from app.models import ModuleCall
from app.models.base import utcnow
from app.services.billing import usage, usage_log
from app.services.platform.uow import unit_of_work
from tests.services.test_usage_daily import D, T, _expect, _seed_calls


@pytest.fixture
def statements(app):  # noqa: ARG001
    """SQL statements run on any engine while the test runs (pool pre-pings excluded)."""
    seen: list[str] = []

    def _sql(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.strip().upper() != "SELECT 1":
            seen.append(statement)

    with listening(Engine, ("before_cursor_execute", _sql)):
        yield seen


def _general(acct, start, end, mode="live"):
    """The sums through the general path (``usage_rows`` built for the literal range)."""
    u = usage_log.usage_rows(start, end, acct, (mode,))
    row = db.session.execute(select(func.coalesce(func.sum(u.c.calls), 0), func.coalesce(func.sum(u.c.errors), 0),
                                    func.coalesce(func.sum(u.c.spend_micros), 0))).one()
    return dict(zip(("calls", "errors", "spend_micros"), map(int, row)))


def test_whole_day_reads_match_the_general_path_and_the_calls(app, make_account):
    rng = random.Random(1918)
    with app.app_context():
        accts = [make_account().id for _ in range(2)]
        calls = _seed_calls(rng, accts)
        db.session.commit()  # nothing open on the session: PostgreSQL reads on autocommit
        first = usage_log.day_of(T) - 40 * D
        for _ in range(25):
            start = first + D * rng.randrange(41)
            end = start + D * rng.randrange(1, 10)
            assert usage_log.is_whole_days(start, end)
            for acct in accts:
                for mode in ("live", "test"):
                    got = usage.totals(acct, start, end, mode=mode)
                    assert not db.session().in_transaction()
                    assert got == _expect(calls, acct, mode, start, end) == _general(acct, start, end, mode)
                    db.session.commit()
                    by = usage.by_product(acct, start, end, mode=mode)
                    assert sum(r["calls"] for r in by) == got["calls"]
                    assert sum(r["spend_micros"] for r in by) == got["spend_micros"]
        assert not usage_log.is_whole_days(first, first + D + timedelta(hours=1))
        assert not usage_log.is_whole_days(first + D, first)


def test_current_usage_is_one_statement_with_the_plan(app, make_account, statements):
    with app.app_context():
        acct = make_account(plan="pro").id
        db.session.commit()
        usage.current_usage(acct)  # warm: the statement is built once per process
        db.session.commit()
        statements.clear()
        cur = usage.current_usage(acct)
        from app.services.accounts.accounts import plan_cents
        assert cur["plan_cents"] == plan_cents("pro") and cur["calls"] == 0
        assert len(statements) == 1, statements  # the plan rides in the usage statement
        assert "usage_daily" in statements[0] and "accounts" in statements[0]
        assert not db.session().in_transaction()  # autocommit: no session transaction opened
        with pytest.raises(NotFound):
            usage.current_usage("acct_missing")
        db.session.remove()


def test_a_read_inside_a_unit_of_work_sees_its_writes(app, make_account):
    with app.app_context():
        acct = make_account().id
        start, end = usage.billing_period()
        before = usage.totals(acct, start, end)
        db.session.commit()
        now = utcnow()
        with pytest.raises(RuntimeError), unit_of_work():
            db.session.add(ModuleCall(id="call_uow_read", account_id=acct, module_id=1, module_slug="echo",
                                      action="ok", mode="live", status="succeeded", price_micros=5,
                                      charged=True, created_at=now, deadline_at=now + D))
            db.session.flush()
            inside = usage.totals(acct, start, end)  # on the session: sees the unflushed-to-commit row
            raise RuntimeError("roll back")
        assert inside["calls"] == before["calls"] + 1
        assert usage.totals(acct, start, end) == before
        db.session.remove()


def test_a_read_after_its_pooled_connection_died_still_answers(app, make_account):
    """The pool has no pre-ping: a pooled connection whose server process is gone (a
    restart) is replaced at checkout (or, dying under the statement, the read runs again
    on a fresh one)."""
    import psycopg

    from app.services.platform.uow import run_one

    with app.app_context():
        acct = make_account().id
        db.session.commit()
        start, end = usage.billing_period()
        expect = usage.totals(acct, start, end)
        pid = run_one("SELECT pg_backend_pid()", {})[0][0]
        url = db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(url, autocommit=True) as outside:  # not one of the pool's
            outside.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert usage.totals(acct, start, end) == expect
        db.session.remove()
