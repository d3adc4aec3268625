"""The hot path's group statements find every row by its key, whatever the statistics said
when their plans were made (``gw_group_settings``: ``enable_seqscan = off`` for the
statement's transaction, nested functions and the ledger's foreign-key checks included).

PostgreSQL plans a statement from the table sizes of that moment and a backend keeps the
plan: one made while a table or this month's partition looked empty (an ANALYZE of a new
month's partition, a fresh deployment) scanned the table whole at every later use, so each
settle and each posting grew with the table until the next ANALYZE. Before, a statement
planned on just-analyzed tables scanned ``accounts``, ``chat_completions`` and
``ledger_transactions`` (the posting's foreign-key check) sequentially."""
from __future__ import annotations

import uuid
from datetime import datetime, timezone

import orjson
import psycopg
from sqlalchemy.engine import make_url

from tests.gateway_helpers import mod, provider, provider_server  # noqa: F401
from tests.services.test_chat_groups import _hold_row, _settle_row
from tests.services.test_group_opener import _key_id, _rows

# every table a group statement reads or writes (partitions counted with their parent)
TABLES = ("accounts", "api_keys", "org_members", "key_spend", "member_spend", "idempotency_records",
          "module_calls", "chat_completions", "ledger_transactions", "ledger_entries")
SEQ_SCANS = """
SELECT coalesce(p.relname, s.relname), sum(s.seq_scan)::int
  FROM pg_stat_xact_user_tables s
  LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
  LEFT JOIN pg_class p ON p.oid = i.inhparent
 WHERE coalesce(p.relname, s.relname) = ANY(%s) AND s.seq_scan > 0
 GROUP BY 1"""


def _statements(app, account_id: str, key_id: str) -> list[tuple[str, dict]]:
    """One call's open and finalize and one completion's hold and settle, each a group
    statement of one row (the rows as ``charging.open_row`` and ``holds_pg`` build them)."""
    with app.app_context():
        opened, open_row = _rows(app, [(account_id, f"k-{uuid.uuid4().hex}", key_id)])[0]
    now, cc = datetime.now(timezone.utc), uuid.uuid4().hex
    finalized = {"id": str(opened), "created_at": opened.created_at, "ok": True, "provider_status": 200,
                 "receipt": {"a": 1}, "finished_at": now, "account_id": account_id,
                 "idem_key": open_row["idem_key"], "response_body": "{}"}
    held = _hold_row(account_id, cc, key_id=key_id)
    return [("SELECT call_id, outcome FROM gw_open_calls(%s::jsonb, 0)", open_row),
            ("SELECT count(*) FROM gw_finalize_calls(%s::jsonb)", finalized),
            ("SELECT count(*) FROM gw_chat_holds(%s::jsonb, 0)", held),
            ("SELECT count(*) FROM gw_chat_settles(%s::jsonb, 0)", _settle_row(account_id, cc, held["now"], 1_200))]


def test_group_statements_find_rows_by_key_on_tables_analyzed_empty(app, make_account, mod):  # noqa: F811
    acct = make_account(cents=1_000)
    key_id = _key_id(app, acct.id)
    url = make_url(app.config["SQLALCHEMY_DATABASE_URI"]).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as other:
        other.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")  # statistics of (nearly) empty tables
    statements = [_statements(app, acct.id, key_id) for _ in range(8)]  # past the plan cache's five custom plans
    # a new backend (its counters are its own: pg_stat_xact_*), one transaction rolled back
    with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
        for batch in statements:
            for sql, row in batch:
                answer = conn.execute(sql, (orjson.dumps([row]).decode(),)).fetchone()
                assert answer[-1] in (1, "opened"), (sql, answer)
        scans = dict(conn.execute(SEQ_SCANS, (list(TABLES),)).fetchall())
        conn.rollback()
    assert scans == {}, f"sequential scans in the group statements: {scans}"
