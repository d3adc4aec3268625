"""PostgreSQL CPU of the metered call's open + finalize, variants A/B interleaved
(bench/DIARY.md, 2026-11-27 "the hot routes' entry, the worker, and the engine's
PostgreSQL cost").

    python bench/pg_ab.py DB_A,DB_B[,…] CHUNKS CALLS_PER_CHUNK

Each database is a fresh copy of one migrated database (``CREATE DATABASE x TEMPLATE y``)
with a variant's SQL applied (e.g. another ``gw_post.sql``). The script seeds each with
one funded account and one API key (no spend limit), then sends ``gw_open_calls`` (one
row, as ``charging.open_row`` builds it) and ``gw_finalize_calls`` on one autocommit
connection per database, CHUNKS times CALLS_PER_CHUNK calls to each database in turn (the
order reversed every chunk), and reads each backend's CPU time from
``/proc/<pid>/schedstat`` (same machine only). It prints the median CPU per call and the
median per-chunk ratio of every database to the first: on a shared machine only ratios
within one run mean anything. Give it throw-away databases: it writes calls and postings.
``BENCH_PG_AB=chat``: the chat completion's ``gw_chat_hold`` + ``gw_chat_settle`` instead.
"""
from __future__ import annotations

import os
import random
import statistics
import sys

import psycopg

SEED = """
SET synchronous_commit = off;
INSERT INTO accounts (id, plan, kind, is_admin, balance_micros, created_at)
VALUES ('acct_pgab', 'starter', 'user', false, 9000000000000000, now()) ON CONFLICT DO NOTHING;
INSERT INTO api_keys (id, account_id, name, prefix, key_hash, mode, scopes, created_at)
VALUES ('key_pgab', 'acct_pgab', 'pg_ab', 'p', 'h', 'live', '[]', now()) ON CONFLICT DO NOTHING;
"""
OPEN_ROW = """jsonb_build_array(jsonb_build_object(
  'call_id', 'c' || %(id)s, 'account_id', 'acct_pgab', 'actor', 'key_pgab', 'module_id', 1,
  'slug', 'm', 'action', 'a', 'mode', 'live', 'price', 1000, 'charged', true, 'owner_agent_id', null,
  'idem_key', 'k' || %(id)s, 'req_hash', 'h', 'now', %(t)s::timestamptz,
  'deadline', %(t)s::timestamptz + interval '1 min', 'idem_expires', %(t)s::timestamptz + interval '1 day',
  'codes', array['acct:acct_pgab', 'revenue:platform'], 'amounts', array[-1000, 1000],
  'spend_key', 'key_pgab'))"""
FIN_ROW = """jsonb_build_array(jsonb_build_object(
  'id', 'c' || %(id)s, 'created_at', %(t)s::timestamptz, 'ok', true, 'provider_status', 200,
  'receipt', '{"a": 1}'::jsonb, 'finished_at', now(), 'account_id', 'acct_pgab',
  'idem_key', 'k' || %(id)s, 'response_body', '{"ok": true}'))"""
OPEN = f"SELECT count(*) FROM gw_open_calls({OPEN_ROW}, 100)"
FIN = f"SELECT count(*) FROM gw_finalize_calls({FIN_ROW})"
# BENCH_PG_AB=chat: the chat completion's hold + settle instead (money/holds_pg.py's shapes)
HOLD = """SELECT gw_chat_hold('cc' || %(id)s, 'acct_pgab', 'key_pgab', 'auto', false, 5000, 'key_pgab',
  %(t)s::timestamptz, array['acct:acct_pgab', 'hold:chat']::varchar[], array[-5000, 5000]::bigint[])"""
SETTLE = """SELECT count(*) FROM gw_chat_settle('cc' || %(id)s, %(t)s::timestamptz, 'acct_pgab', 'acct:acct_pgab',
  'hold:chat', 'revenue:platform', 5000, 1200, 'm', 'p', 10, 5, false, 1, 3, NULL, now())"""
CHAT = os.environ.get("BENCH_PG_AB") == "chat"


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _one(conn) -> None:
    args = {"id": str(random.getrandbits(62)), "t": conn.execute("SELECT now()").fetchone()[0]}
    conn.execute(HOLD if CHAT else OPEN, args)
    conn.execute(SETTLE if CHAT else FIN, args)


def main(dbs: list[str], chunks: int, per: int, base: str = "postgresql://postgres@127.0.0.1:5432") -> None:
    conns = {d: psycopg.connect(f"{base}/{d}", autocommit=True) for d in dbs}
    pids = {}
    for d, conn in conns.items():
        for stmt in filter(str.strip, SEED.split(";")):
            conn.execute(stmt)
        pids[d] = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        for _ in range(50):  # warm: plans cached
            _one(conn)
    res: dict[str, list[float]] = {d: [] for d in dbs}
    for k in range(chunks):
        for d in (dbs if k % 2 == 0 else dbs[::-1]):
            before = _cpu_ns(pids[d])
            for _ in range(per):
                _one(conns[d])
            res[d].append((_cpu_ns(pids[d]) - before) / per / 1e6)
    for d in dbs:
        print(f"{d}: median {statistics.median(res[d]):.4f} ms backend CPU per "
              + ("chat hold+settle" if CHAT else "open+finalize"))
    for d in dbs[1:]:
        ratios = [b / a for a, b in zip(res[dbs[0]], res[d])]
        q = statistics.quantiles(ratios, n=4)
        print(f"{d}/{dbs[0]}: per-chunk ratio median {statistics.median(ratios):.3f} "
              f"(IQR {q[0]:.3f}-{q[2]:.3f}, {len(ratios)} chunks)")


if __name__ == "__main__":
    main(sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]))
