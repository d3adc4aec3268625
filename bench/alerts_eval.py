"""Benchmark: one alert evaluation pass (``app.services.billing.alerts.evaluate_all``).

Seeds, with set-based SQL on PostgreSQL, N alert rules (5 per account; 10% of them due to
fire) and rollups worth M calls (10 calls per hourly rollup row, spread over twice as many
accounts as have rules, over the last 30 days; the rollup marks where the roll job leaves
them — hours final up to the current one, days rolled up to today — and the daily rollups
``usage_daily`` of the rolled days summed from them in SQL, as the roll job writes them;
then ``VACUUM ANALYZE``, as autovacuum soon does after a load — not timed), then times:

* ``cold``: the first pass, which fires the due rules (events + outbox messages written,
  delivery left to the outbox: ``dispatch=False``) — median of 3 (firings forgotten
  between runs);
* ``steady``: a pass in the same period, when nothing new fires (what the every-minute
  schedule costs almost always) — median of 3.

It repeats this for (N, M) = (10,000, 10,000,000) — issue 18's target: a pass under 1 s —,
(20,000, 10,000,000) and (10,000, 1,000,000) (growth with the rules and with the calls),
and reports seconds and SQL statements of each pass.

Runs in its own schema ``bench_alerts`` (dropped and re-created) of the database named
by ``BENCH_DATABASE_URL`` or ``DATABASE_URL`` (default postgresql://postgres@127.0.0.1/postgres),
so it never touches the application tables. Not part of ``make test``.

    python bench/alerts_eval.py            # table
    python bench/alerts_eval.py --json     # machine-readable (for bench/run.py)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import event, text  # noqa: E402

SCHEMA = "bench_alerts"
CALLS_PER_ROW = 10
RULES_PER_ACCOUNT = 5


def make_app(url: str):
    """The app, connected with ``search_path`` = SCHEMA. The option rides in the URL (libpq
    ``options``): the config replaces SQLALCHEMY_ENGINE_OPTIONS, so connect_args set there
    were lost and the bench ran on (and truncated) the application tables."""
    from app import create_app

    url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{SCHEMA}"
    return create_app({
        "APP_ENV": "test", "SQLALCHEMY_DATABASE_URI": url, "REDIS_URL": None, "JOBS_INLINE": True,
        "INSTANCE_PATH": "/tmp/bench-alerts-instance", "RATELIMIT_ENABLED": False,
        "LOG_LEVEL": "WARNING",
    })


def reset_schema(app) -> None:
    from flask_migrate import upgrade

    from app.extensions import db

    with app.app_context():
        with db.engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
            conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
        upgrade()


def seed(rules: int, calls: int) -> int:
    """Replace all bench data; returns the number of rollup rows."""
    from app.extensions import db

    accounts = max(1, rules // RULES_PER_ACCOUNT)
    usage_accounts = 2 * accounts  # half of the accounts with usage have no rules
    rows = calls // CALLS_PER_ROW
    s = db.session
    s.execute(text("TRUNCATE accounts, alerts, alert_events, outbox, usage_hourly, usage_daily CASCADE"))
    s.execute(text("""
        INSERT INTO accounts (id, email, plan, kind, is_admin, balance_micros, created_at)
        SELECT 'acct_b' || i, 'b' || i || '@bench.local',
               (ARRAY['starter','pro','scale','enterprise'])[1 + i % 4], 'human', false, 0, now()
        FROM generate_series(0, :n - 1) AS i"""), {"n": accounts})
    s.execute(text("""
        INSERT INTO alerts (id, account_id, name, metric, op, threshold, "window", channel,
                            target, secret, created_at)
        SELECT 'alrt_b' || i, 'acct_b' || (i % :accts), 'rule ' || i,
               (ARRAY['spend_cents','calls','error_rate','plan_pct'])[1 + i % 4],
               CASE WHEN i % 10 = 0 THEN '>=' ELSE '>' END,
               CASE WHEN i % 10 = 0 THEN 0 ELSE 1e9 END,
               (ARRAY['hour','day','week','month'])[1 + (i / 4) % 4],
               (ARRAY['email','webhook','chat'])[1 + i % 3],
               CASE i % 3 WHEN 0 THEN 'ops' || i || '@bench.local'
                          ELSE 'https://hooks.bench.example/' || i END,
               CASE WHEN i % 3 = 1 THEN 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' END, now()
        FROM generate_series(0, :n - 1) AS i"""), {"n": rules, "accts": accounts})
    # row k: account k mod U; its j-th row (j = k div U) lands in hour (29·j mod 720) back
    # from now, product mod<j div 720>: unique (account, product, hour), spread over 30 days.
    s.execute(text("""
        INSERT INTO usage_hourly (account_id, product, mode, hour, calls, errors, spend_micros)
        SELECT 'acct_b' || (k % :u), 'mod' || ((k / :u) / 720), 'live',
               date_trunc('hour', now()) - make_interval(hours => ((k / :u) * 29) % 720),
               :cpr, CASE WHEN k % 7 = 0 THEN 1 ELSE 0 END, :cpr * (1000 + k % 50000)
        FROM generate_series(0, :rows - 1) AS k"""),
              {"u": usage_accounts, "rows": rows, "cpr": CALLS_PER_ROW})
    # the rollup marks as the roll job leaves them: the hours before the current one final
    # (rolled_through), the days before its day rolled daily (days_rolled_through), no
    # minute-rolled tail. The migrations no longer write this row (the baseline of
    # 2026-11-27; the old chain's 0016 did): without it the reads took no day from
    # usage_daily and read the call log from the epoch, a state no rolled database is in.
    s.execute(text("""
        INSERT INTO usage_rollup_state (id, rolled_through, days_rolled_through, tail_through)
        VALUES (1, date_trunc('hour', now()),
                date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', NULL)
        ON CONFLICT (id) DO UPDATE SET rolled_through = excluded.rolled_through,
            days_rolled_through = excluded.days_rolled_through, tail_through = NULL"""))
    # the days before days_rolled_through are rolled: their daily rows
    s.execute(text("""
        INSERT INTO usage_daily (account_id, product, mode, day, calls, errors, spend_micros)
        SELECT account_id, product, mode, date_trunc('day', hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
               sum(calls), sum(errors), sum(spend_micros)
        FROM usage_hourly WHERE hour < (SELECT days_rolled_through FROM usage_rollup_state WHERE id = 1)
        GROUP BY 1, 2, 3, 4"""))
    s.commit()
    # VACUUM as well: a bulk load leaves the visibility map unset (every index-only scan
    # visits the heap) until autovacuum sets it, as it soon does on a live database
    with db.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("accounts", "alerts", "alert_events", "outbox", "usage_hourly", "usage_daily"):
            conn.execute(text(f"VACUUM ANALYZE {table}"))
    return rows


def timed_pass() -> dict:
    from app.extensions import db
    from app.services.billing import alerts

    count = {"n": 0}

    def before(*args, **kwargs):
        count["n"] += 1

    event.listen(db.engine, "before_cursor_execute", before)
    try:
        t0 = time.perf_counter()
        out = alerts.evaluate_all(dispatch=False)
        seconds = time.perf_counter() - t0
    finally:
        event.remove(db.engine, "before_cursor_execute", before)
    db.session.remove()
    return {"seconds": round(seconds, 3), "queries": count["n"], "rules": out["rules"],
            "fired": out["fired"]}


def _forget_firings() -> None:
    from app.extensions import db

    db.session.execute(text("TRUNCATE alert_events, outbox"))
    db.session.commit()


def run_case(app, rules: int, calls: int, repeat: int = 3) -> dict:
    """Median of ``repeat`` cold passes (firings forgotten in between) and of
    ``repeat`` steady passes."""
    with app.app_context():
        rows = seed(rules, calls)
        cold = []
        for _ in range(repeat):
            _forget_firings()
            cold.append(timed_pass())
        steady = [timed_pass() for _ in range(repeat)]

    def summary(passes):
        return {"seconds": statistics.median(p["seconds"] for p in passes),
                "queries": max(p["queries"] for p in passes), "fired": passes[0]["fired"]}

    return {"rules": rules, "calls": calls, "rollup_rows": rows, "cold": summary(cold),
            "steady": summary(steady)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--rules", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=10_000_000)
    args = parser.parse_args()
    url = os.environ.get("BENCH_DATABASE_URL") or os.environ.get("DATABASE_URL") \
        or "postgresql://postgres@127.0.0.1/postgres"
    if not url.startswith("postgresql"):
        parser.error("needs PostgreSQL (BENCH_DATABASE_URL or DATABASE_URL)")
    app = make_app(url)
    reset_schema(app)
    cases = [(args.rules, args.calls), (2 * args.rules, args.calls), (args.rules, args.calls // 10)]
    results = [run_case(app, r, c) for r, c in cases]
    base = results[0]
    for res in results[1:]:
        res["growth_vs_base"] = {k: round(res[k]["seconds"] / base[k]["seconds"], 2)
                                 for k in ("cold", "steady") if base[k]["seconds"]}
    with app.app_context():
        from app.extensions import db

        with db.engine.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    report = {"benchmark": "alerts_eval", "results": results}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{'rules':>7} {'calls':>9} {'rollups':>8} | {'cold s':>7} {'q':>5} {'fired':>5} "
          f"| {'steady s':>8} {'q':>3} | growth (cold, steady)")
    for r in results:
        g = r.get("growth_vs_base", {})
        print(f"{r['rules']:>7} {r['calls']:>9} {r['rollup_rows']:>8} | {r['cold']['seconds']:>7} "
              f"{r['cold']['queries']:>5} {r['cold']['fired']:>5} | {r['steady']['seconds']:>8} "
              f"{r['steady']['queries']:>3} | {g.get('cold', '-')}x, {g.get('steady', '-')}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
