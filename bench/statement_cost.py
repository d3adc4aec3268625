"""Client CPU of one hot-path statement, in-process (``python bench/statement_cost.py``;
DATABASE_URL: any migrated or empty database of the gateway; BENCH_STATEMENTS (2000),
BENCH_ROUNDS (5)).

Times ``uow.run_one`` on a statement shaped like the hot path's (cast placeholders,
a JSON document) in the ways the process can send it, each as CPU per statement
(``time.thread_time``: what the worker pays, not the round trip's wait), the median of
the rounds:

* ``run_one``: the production path — a connection of the process's pool, a psycopg
  cursor kept on it, autocommit around the statement (app/services/platform/uow.py);
* ``run_one via exec_driver_sql``: the same while statement events are wanted
  (``uow.statement_events``: tracing, statement counters) — SQLAlchemy's execution;
* ``pool checkout + return`` and ``... with pre-ping``: what a checkout costs, and what
  ``pool_pre_ping`` would add to each (a ``SELECT 1`` round trip).

Run it on an older commit (``git worktree``) for that commit's ``run_one``. Prints one
line per way; nothing written.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("APP_ENV", "test")

SQL = "SELECT %(a)s::integer + 1, %(b)s::text, %(c)s::jsonb"
PARAMS = {"a": "41", "b": "x", "c": '{"rows": [1, 2, 3]}'}
N = int(os.environ.get("BENCH_STATEMENTS", "2000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))


def cpu_per_call(fn) -> tuple[float, list[float]]:
    for _ in range(300):  # warm: connections made, statements prepared
        fn()
    rounds = []
    for _ in range(ROUNDS):
        start = time.thread_time()
        for _ in range(N):
            fn()
        rounds.append((time.thread_time() - start) / N * 1e6)
    return statistics.median(rounds), rounds


def report(label: str, fn) -> None:
    median, rounds = cpu_per_call(fn)
    print(f"{label:42s} {median:7.1f} µs CPU per statement  (rounds: {', '.join(f'{r:.1f}' for r in rounds)})")


def main() -> None:
    from sqlalchemy import create_engine

    from app import create_app
    from app.extensions import db
    from app.services.platform import uow

    app = create_app({"TESTING": True})
    with app.app_context():
        report("run_one", lambda: uow.run_one(SQL, PARAMS))
        if hasattr(uow, "statement_events"):
            with uow.statement_events():
                report("run_one via exec_driver_sql", lambda: uow.run_one(SQL, PARAMS))
            report("pool checkout + return", lambda: db.engine.raw_connection().close())
            pinged = create_engine(db.engine.url, pool_size=1, pool_pre_ping=True)
            report("pool checkout + return with pre-ping", lambda: pinged.raw_connection().close())
            pinged.dispose()


if __name__ == "__main__":
    main()
