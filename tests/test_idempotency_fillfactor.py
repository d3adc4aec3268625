"""idempotency_records keeps room on its pages (migration 0026, fillfactor 40), so the
finalize's rewrite of a record — its stored response, ~3.6 times the size the record was
inserted at — is a HOT update: same page, no new index entries."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from app.extensions import db
from app.models.base import utcnow

ROWS = 120
IN_FLIGHT = 8  # calls opened and not yet finalized (c=16 over two workers)
RESPONSE = '{"ok":true,"result":{"echo":"' + "x" * 480 + '"},"receipt":{}}'  # ~530 bytes, as on the bench


@pytest.fixture
def pg(app, ctx):
    yield
    db.session.rollback()


def test_the_table_keeps_sixty_percent_of_each_page_free(pg):
    options = db.session.execute(text(
        "SELECT reloptions FROM pg_class WHERE relname = 'idempotency_records'")).scalar_one()
    assert "fillfactor=40" in (options or [])


def _page(conn, key: str) -> int:
    return conn.execute(text("SELECT (ctid::text::point)[0]::bigint FROM idempotency_records "
                             "WHERE account_id = 'acct_ff' AND key = :k"), {"k": key}).scalar_one()


def test_a_record_is_finalized_on_the_page_it_was_opened_on(pg):
    """As the hot path writes them, each statement committed by itself: calls opened one
    after another with IN_FLIGHT of them unfinished at any time, each finalized (its record
    rewritten with the response) while later ones are opened. A rewrite that stays on its
    page with no indexed column changed is a HOT update. With fillfactor 100 the records
    opened meanwhile have filled the page: 50 of 120 stayed (2026-11-24)."""
    now = utcnow()
    opened, stayed = [], 0
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("DELETE FROM idempotency_records WHERE account_id = 'acct_ff'"))

        def finalize(key, page):
            conn.execute(text("UPDATE idempotency_records SET status = 'done', response_body = :body "
                              "WHERE account_id = 'acct_ff' AND key = :k"), {"k": key, "body": RESPONSE})
            return _page(conn, key) == page

        for i in range(ROWS):
            key = f"ff-{i}"
            conn.execute(text(
                "INSERT INTO idempotency_records (account_id, key, request_hash, call_id, status, created_at, "
                "expires_at) VALUES ('acct_ff', :k, :h, :c, 'in_flight', :now, :exp)"),
                {"k": key, "h": "0" * 64, "c": f"call_ff{i}", "now": now, "exp": now + timedelta(days=1)})
            opened.append((key, _page(conn, key)))
            if len(opened) > IN_FLIGHT:
                stayed += finalize(*opened.pop(0))
        stayed += sum(finalize(*o) for o in opened)
        conn.execute(text("DELETE FROM idempotency_records WHERE account_id = 'acct_ff'"))
    assert stayed >= ROWS * 0.9
