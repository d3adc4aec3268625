"""The suite's per-test cleanup (tests/conftest.py ``_empty_tables``): what the next test
starts from — every table empty, every sequence at its start — also after rows in the
append-only tables (which refuse DELETE), rows that reference each other, and a sequence
advanced by an insert that was rolled back."""
from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.extensions import db
from tests import conftest


def _state():
    tables = [t.name for t in db.metadata.sorted_tables]
    counts = db.session.execute(text(
        "SELECT " + ", ".join(f'(SELECT count(*) FROM "{t}")' for t in tables))).one()
    used = db.session.execute(text(
        "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema() "
        "AND last_value IS NOT NULL")).scalars().all()
    return {t: n for t, n in zip(tables, counts) if n}, used


@pytest.fixture(params=["delete", "truncate"])
def cleanup_way(request, monkeypatch):
    """The cleanup as a superuser runs it (DELETE with the triggers off for its transaction)
    and as any other role does (TRUNCATE of the tables that hold rows)."""
    if request.param == "truncate":
        emptying = conftest._emptying
        monkeypatch.setattr(conftest, "_emptying", lambda tables: (emptying(tables)[0], False))
    return request.param


def test_every_table_is_emptied_and_every_sequence_restarted(app, make_account, cleanup_way):
    make_account()  # accounts, keys and the promo grant's ledger transaction and entries
    with app.app_context():
        db.session.execute(text(
            "INSERT INTO org_audit (org_id, action, created_at) VALUES ('org_x', 'test', now())"))
        db.session.commit()
        db.session.execute(text("INSERT INTO track_events (event, created_at) VALUES ('x', now())"))
        db.session.rollback()  # the row is gone, the sequence stays advanced
        filled, used = _state()
        assert {"accounts", "api_keys", "ledger_transactions", "ledger_entries", "org_audit"} <= set(filled)
        assert {"ledger_transactions_id_seq", "track_events_id_seq"} <= set(used)
        db.session.remove()

    conftest._empty_tables(app)

    with app.app_context():
        assert _state() == ({}, [])
        # the append-only guard is on again: only the cleanup's own transaction went around it
        with pytest.raises(DBAPIError, match="append-only"):
            db.session.execute(text("DELETE FROM ledger_transactions"))
        db.session.rollback()
