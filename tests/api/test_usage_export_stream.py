"""The usage export reads its rows with ONE statement streamed in one round trip
(``export._statement`` through ``uow.stream``), not one server-side cursor per call log
merged in Python; a download stopped half-way gives its connection back to the pool idle."""
from __future__ import annotations

import csv
import io
from datetime import timedelta

from sqlalchemy import text

from app.extensions import db
from app.models import ChatCompletion, ModuleCall
from app.models.base import utcnow
from app.ids import new_id
from app.services.platform import uow
from tests.support.sqlevents import listening


def _seed(account_id: str, n_calls: int = 3) -> None:
    now = utcnow() - timedelta(minutes=5)
    for i in range(n_calls):
        db.session.add(ModuleCall(id=new_id("call"), account_id=account_id, module_id=1, module_slug="echo",
                                  action="run", mode="live", status="refunded" if i == 1 else "succeeded",
                                  price_micros=10_000 + i, charged=True, ok=True, actor="key_x",
                                  created_at=now + timedelta(seconds=2 * i), deadline_at=now,
                                  receipt={"hash": f"h{i}"}))
    for i, status in enumerate(("settled", "released")):
        db.session.add(ChatCompletion(id=f"chatcmpl-s{i}-{account_id[-6:]}", account_id=account_id, mode="live",
                                      requested_model="auto", model="tiny", status=status, cost_micros=777,
                                      list_cost_micros=900, prompt_tokens=3, completion_tokens=4, actor="key_x",
                                      created_at=now + timedelta(seconds=2 * i + 1), settled_at=now))


def _export(client, headers, **q):
    frm, to = (utcnow() - timedelta(hours=1)).isoformat(), (utcnow() + timedelta(minutes=1)).isoformat()
    r = client.get("/api/usage/export", query_string={"from": frm, "to": to, **q}, headers=headers)
    assert r.status_code == 200, r.get_data(as_text=True)
    return list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))


def test_the_export_is_one_statement_with_both_logs_interleaved(app, client, make_account):
    acct = make_account()
    with app.app_context():
        _seed(acct.id)
        db.session.commit()
    selects = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if "chat_completions" in statement or "module_calls" in statement:
            selects.append(statement)

    with app.app_context(), listening(db.engine, ("before_cursor_execute", count)):
        rows = _export(client, acct.headers)
    assert len(selects) == 1, selects  # was 2: a server-side cursor per call log
    assert [(r["module"], r["status"], r["cost_micros"], r["receipt_hash"]) for r in rows] == [
        ("echo", "succeeded", "10000", "h0"), ("chat", "settled", "777", ""),
        ("echo", "refunded", "0", "h1"), ("chat", "released", "0", ""), ("echo", "succeeded", "10002", "h2")]
    assert [r["provider_cost_micros"] for r in rows if r["module"] == "chat"] == ["900", ""]

    # the production path (psycopg's stream, no statement events) answers the same rows
    assert _export(client, acct.headers) == rows
    assert [r["status"] for r in _export(client, acct.headers, model="tiny")] == ["settled", "released"]
    assert _export(client, acct.headers, module="echo", model="tiny") == []


def test_a_stream_closed_early_leaves_its_connection_idle_in_the_pool(app):
    with app.app_context():
        db.engine.dispose()
        rows = uow.stream("SELECT g FROM generate_series(1, 200000) AS g", {}, size=10)
        assert [next(rows) for _ in range(3)] == [(1,), (2,), (3,)]
        rows.close()  # the client went away mid-download
        assert db.engine.pool.checkedout() == 0
        assert uow.read(text("SELECT 1")) == [(1,)]  # the pool's connection works, idle, no transaction
        assert db.engine.pool.checkedout() == 0
        active = uow.read(text("SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                               "'SELECT g FROM generate_series%' AND state = 'active'"))
        assert active == [(0,)]


def test_a_stream_inside_a_unit_of_work_is_refused(app):
    import pytest

    with app.app_context(), uow.unit_of_work():
        with pytest.raises(RuntimeError):
            next(uow.stream("SELECT 1", {}))
