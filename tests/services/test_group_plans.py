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
from datetime import datetime, timedelta, timezone

import orjson
import psycopg
from sqlalchemy.engine import make_url

from app.services.money import holds, ledger

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


def _rows(account_id: str, key_id: str, now: datetime) -> tuple[dict, dict, dict, dict]:
    """One call's open and finalize rows and one completion's hold and settle rows, in the
    shapes ``charging.open_row`` / ``finalize_pg`` and ``holds_pg`` send."""
    call, cc, customer = uuid.uuid4().hex, uuid.uuid4().hex, ledger.customer(account_id)
    opened = {"call_id": call, "account_id": account_id, "actor": key_id, "module_id": 1, "slug": "m",
              "action": "a", "mode": "live", "price": 1_000, "charged": True, "owner_agent_id": None,
              "idem_key": f"k-{call}", "req_hash": "h", "now": now, "deadline": now + timedelta(minutes=1),
              "idem_expires": now + timedelta(days=1), "codes": [customer, ledger.REVENUE],
              "amounts": [-1_000, 1_000], "spend_key": key_id}
    finalized = {"id": call, "created_at": now, "ok": True, "provider_status": 200, "receipt": {"a": 1},
                 "finished_at": now, "account_id": account_id, "idem_key": f"k-{call}",
                 "response_body": "{}"}
    held = {"id": cc, "account_id": account_id, "actor": key_id, "requested_model": "m", "stream": False,
            "hold": 5_000, "spend_key": key_id, "now": now, "codes": [customer, holds.HOLD],
            "amounts": [-5_000, 5_000]}
    settled = {"id": cc, "created_at": now, "account_id": account_id, "customer": customer,
               "hold_code": holds.HOLD, "revenue": ledger.REVENUE, "hold": 5_000, "cost": 1_200,
               "model": "m", "provider": "p", "prompt_tokens": 1, "completion_tokens": 1, "estimated": False,
               "attempts": 1, "latency_ms": 1, "error": None, "now": now}
    return opened, finalized, held, settled


def test_group_statements_find_rows_by_key_on_tables_analyzed_empty(app, make_account):
    acct = make_account(cents=1_000)
    url = make_url(app.config["SQLALCHEMY_DATABASE_URI"]).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as other:
        key_id = other.execute("SELECT id FROM api_keys WHERE account_id = %s", (acct.id,)).fetchone()[0]
        other.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")  # statistics of (nearly) empty tables
    # a new backend (its counters are its own: pg_stat_xact_*), one transaction rolled back
    with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
        for _ in range(8):  # past the plan cache's five custom plans: the generic ones too
            opened, finalized, held, settled = _rows(acct.id, key_id, datetime.now(timezone.utc))
            for sql, rows in (("SELECT call_id, outcome FROM gw_open_calls(%s::jsonb, 0)", opened),
                              ("SELECT count(*) FROM gw_finalize_calls(%s::jsonb)", finalized),
                              ("SELECT count(*) FROM gw_chat_holds(%s::jsonb, 0)", held),
                              ("SELECT count(*) FROM gw_chat_settles(%s::jsonb, 0)", settled)):
                answer = conn.execute(sql, (orjson.dumps([rows]).decode(),)).fetchone()
                assert answer[-1] in (1, "opened"), (sql, answer)
        scans = dict(conn.execute(SEQ_SCANS, (list(TABLES),)).fetchall())
        conn.rollback()
    assert scans == {}, f"sequential scans in the group statements: {scans}"
