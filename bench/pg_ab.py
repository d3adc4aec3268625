"""PostgreSQL CPU of the metered call's open + finalize, variants A/B interleaved
(bench/DIARY.md, 2026-11-27 "the hot routes' entry, the worker, and the engine's
PostgreSQL cost").

    python bench/pg_ab.py DB_A,DB_B[,…] CHUNKS GROUPS_PER_CHUNK

Each database is a fresh copy of one migrated database (``CREATE DATABASE x TEMPLATE y``)
with a variant's SQL applied (e.g. another ``gw_post.sql``). The script seeds each with
one funded account and one API key (no spend limit), then sends ``gw_open_calls`` and
``gw_finalize_calls`` (rows as ``charging`` builds them, ``BENCH_PG_AB_GROUP`` rows per
statement, default 1) on one autocommit connection per database, CHUNKS times
GROUPS_PER_CHUNK groups to each database in turn (the order reversed every chunk), and
reads each backend's CPU time from ``/proc/<pid>/schedstat`` (same machine only). It prints the median CPU per call and the
median per-chunk ratio of every database to the first: on a shared machine only ratios
within one run mean anything. Give it throw-away databases: it writes calls and postings.
``BENCH_PG_AB=chat``: the chat completion's ``gw_chat_holds`` + ``gw_chat_settles`` instead.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
from datetime import datetime, timedelta, timezone

import psycopg

SEED = """
SET synchronous_commit = off;
INSERT INTO accounts (id, plan, kind, is_admin, balance_micros, created_at)
VALUES ('acct_pgab', 'starter', 'user', false, 9000000000000000, now()) ON CONFLICT DO NOTHING;
INSERT INTO api_keys (id, account_id, name, prefix, key_hash, mode, scopes, created_at)
VALUES ('key_pgab', 'acct_pgab', 'pg_ab', 'p', 'h', 'live', '[]', now()) ON CONFLICT DO NOTHING;
"""
# The rows as the app sends them (charging.open_row / finalize_pg, holds_pg.hold / settle):
# one JSON document per statement, GROUP rows each (BENCH_PG_AB_GROUP, default 1; the bench
# at c=16 shows about 3 opens and 10 finalizations per statement).
OPEN = "SELECT count(*) FROM gw_open_calls(%s::jsonb, 100)"
FIN = "SELECT count(*) FROM gw_finalize_calls(%s::jsonb)"
HOLDS = "SELECT count(*) FROM gw_chat_holds(%s::jsonb, 100)"
SETTLES = "SELECT count(*) FROM gw_chat_settles(%s::jsonb, 100)"
CHAT = os.environ.get("BENCH_PG_AB") == "chat"
GROUP = int(os.environ.get("BENCH_PG_AB_GROUP", "1"))


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _rows(t: datetime) -> tuple[list[dict], list[dict]]:
    """One group's first and second statement rows (open + finalize, or hold + settle)."""
    first, second = [], []
    for _ in range(GROUP):
        i = str(random.getrandbits(62))
        if CHAT:
            first.append({"id": "cc" + i, "account_id": "acct_pgab", "actor": "key_pgab",
                          "requested_model": "auto", "stream": False, "hold": 5000, "spend_key": "key_pgab",
                          "now": t, "codes": ["acct:acct_pgab", "hold:chat"], "amounts": [-5000, 5000]})
            second.append({"id": "cc" + i, "created_at": t, "account_id": "acct_pgab",
                           "customer": "acct:acct_pgab", "hold_code": "hold:chat", "revenue": "revenue:platform",
                           "hold": 5000, "cost": 1200, "model": "m", "provider": "p", "prompt_tokens": 10,
                           "completion_tokens": 5, "estimated": False, "attempts": 1, "latency_ms": 3,
                           "error": None, "now": t})
        else:
            first.append({"call_id": "c" + i, "account_id": "acct_pgab", "actor": "key_pgab", "module_id": 1,
                          "slug": "m", "action": "a", "mode": "live", "price": 1000, "charged": True,
                          "owner_agent_id": None, "idem_key": "k" + i, "req_hash": "h", "now": t,
                          "deadline": t + timedelta(minutes=1), "idem_expires": t + timedelta(days=1),
                          "codes": ["acct:acct_pgab", "revenue:platform"], "amounts": [-1000, 1000],
                          "spend_key": "key_pgab"})
            second.append({"id": "c" + i, "created_at": t, "ok": True, "provider_status": 200,
                           "receipt": {"a": 1}, "finished_at": t, "account_id": "acct_pgab",
                           "idem_key": "k" + i, "response_body": '{"ok": true}'})
    return first, second


def _one(conn) -> None:
    first, second = _rows(datetime.now(timezone.utc))
    conn.execute(HOLDS if CHAT else OPEN, (json.dumps(first, default=str),))
    conn.execute(SETTLES if CHAT else FIN, (json.dumps(second, default=str),))


def main(dbs: list[str], chunks: int, per: int, base: str = "postgresql://postgres@127.0.0.1:5432") -> None:
    conns = {d: psycopg.connect(f"{base}/{d}", autocommit=True) for d in dbs}
    pids = {}
    for d, conn in conns.items():
        for stmt in filter(str.strip, SEED.split(";")):
            conn.execute(stmt)
        conn.execute("RESET synchronous_commit")  # the statements commit as in the app
        pids[d] = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        for _ in range(50):  # warm: plans cached
            _one(conn)
    res: dict[str, list[float]] = {d: [] for d in dbs}
    for k in range(chunks):
        for d in (dbs if k % 2 == 0 else dbs[::-1]):
            before = _cpu_ns(pids[d])
            for _ in range(per):
                _one(conns[d])
            res[d].append((_cpu_ns(pids[d]) - before) / (per * GROUP) / 1e6)
    for d in dbs:
        print(f"{d}: median {statistics.median(res[d]):.4f} ms backend CPU per "
              + ("chat hold+settle" if CHAT else "open+finalize") + f" (groups of {GROUP})")
    for d in dbs[1:]:
        ratios = [b / a for a, b in zip(res[dbs[0]], res[d])]
        q = statistics.quantiles(ratios, n=4)
        print(f"{d}/{dbs[0]}: per-chunk ratio median {statistics.median(ratios):.3f} "
              f"(IQR {q[0]:.3f}-{q[2]:.3f}, {len(ratios)} chunks)")


if __name__ == "__main__":
    main(sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]))
