"""PostgreSQL CPU per chat completion (hold + settle) when one statement carries one
completion against when it carries several (bench/DIARY.md, "Grouped chat holds and
settles").

    python bench/chat_groups.py DB [ROUNDS] [COMPLETIONS]

DB is a throw-away migrated database (it writes completions and postings). The script
seeds one funded account (``bench.pg_ab.SEED``), then per round sends COMPLETIONS
(default 2,000) holds and settles through ``gw_chat_holds`` / ``gw_chat_settles`` on one
autocommit connection, 1 and 8 completions per statement in turn, and reads the backend's
CPU time from ``/proc/<pid>/schedstat`` (same machine only). It prints the median CPU per
completion of each group size over ROUNDS (default 6) rounds.
"""
from __future__ import annotations

import json
import statistics
import sys
import uuid
from datetime import datetime, timezone

import psycopg

from bench.pg_ab import SEED

HOLDS = "SELECT count(*) FROM gw_chat_holds(%(rows)s::jsonb, 0)"
SETTLES = "SELECT count(*) FROM gw_chat_settles(%(rows)s::jsonb, 0)"


def main() -> int:
    db = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    total = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    conn = psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{db}", autocommit=True)
    conn.execute(SEED)
    pid = conn.info.backend_pid

    def cpu_ns() -> int:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])

    now = datetime.now(timezone.utc).isoformat()
    per: dict[int, list[float]] = {}
    for _ in range(rounds):
        for size in (1, 8):
            base = uuid.uuid4().hex[:10]
            start = cpu_ns()
            for i in range(total // size):
                ids = [f"cc{base}-{i}-{n}" for n in range(size)]
                holds = [{"id": c, "account_id": "acct_pgab", "actor": "key_pgab", "requested_model": "m",
                          "stream": False, "hold": 5000, "spend_key": None, "now": now,
                          "codes": ["acct:acct_pgab", "hold:chat"], "amounts": [-5000, 5000]} for c in ids]
                settles = [{"id": c, "created_at": now, "account_id": "acct_pgab", "customer": "acct:acct_pgab",
                            "hold_code": "hold:chat", "revenue": "revenue:platform", "hold": 5000, "cost": 1200,
                            "model": "m", "provider": "p", "prompt_tokens": 10, "completion_tokens": 5,
                            "estimated": False, "attempts": 1, "latency_ms": 3, "error": None, "now": now}
                           for c in ids]
                conn.execute(HOLDS, {"rows": json.dumps(holds)})
                conn.execute(SETTLES, {"rows": json.dumps(settles)})
            per.setdefault(size, []).append((cpu_ns() - start) / (total // size * size) / 1e6)
    for size, values in per.items():
        print(f"{size} completion(s) per statement: median {statistics.median(values):.3f} ms backend CPU "
              f"per hold + settle ({rounds} rounds of {total})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
