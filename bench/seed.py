"""Benchmark data: the bench module and chat model (pointing at the fake upstream), and the
scale data set (10,000,000 recorded calls) written with set-based SQL (``generate_series``)."""
from __future__ import annotations

import os
import time

from bench import setup

MODULE_SLUG = "bench-echo"
SCALE_CALLS = int(os.environ.get("BENCH_SCALE_CALLS", "10000000"))
SCALE_PRODUCTS = 20          # module slugs the bench account used


def load_bench_module(ctx) -> None:
    """Catalog YAML for the bench module, loaded with ``flask catalog load``."""
    path = ctx.work / "catalog-bench.yaml"
    path.write_text(f"""slug: {MODULE_SLUG}
name: Bench echo
description: Fixed answer from the bench upstream (nginx).
owner: Bench
status: approved
upstream_url: {ctx.upstream}/module/bench
sandbox_url: {ctx.upstream}/module/bench-sandbox
provider_auth: {{type: header, header: X-Provider-Key, env: BENCH_PROVIDER_SECRET}}
actions:
  - name: echo
    description: Echo.
    price_cents: 1
    method: POST
    path: /
    timeout_seconds: 10
""")
    setup.flask(ctx.env, "catalog", "load", str(path))


CHAT_MODEL = "bench-model"


def write_chat_catalog(work, upstream: str) -> str:
    """The chat model catalog of the run (CHAT_CATALOG must be set before gunicorn starts):
    one model served by one OpenAI-compatible provider, the fake upstream."""
    path = work / "models-bench.yaml"
    path.write_text(f"""providers:
  bench_llm:
    type: openai
    base_url: {upstream}/v1
    requires_key: true
models:
  - id: {CHAT_MODEL}
    description: Bench model (fixed answer from the bench upstream).
    context_window: 16384
    max_output_tokens: 4096
    capabilities: [tools, json_mode, streaming]
    providers:
      - {{provider: bench_llm, upstream_model: {CHAT_MODEL}, input_usd_per_mtok: "0.50", output_usd_per_mtok: "1.50"}}
""")
    return str(path)


def load_bench_chat_model(ctx) -> str:
    return CHAT_MODEL


def chat_headers(ctx) -> dict:
    return {}


def _q(sql: str) -> str:
    return setup.psql(sql, setup.DB_NAME)


SPAN_DAYS = 365              # the seeded call log covers the last year
BENCH_SHARE = 10             # every 10th seeded call is the bench account's (1M of 10M)
NOISE_ACCOUNTS = 300         # the other accounts (one product each)
_MONTHS_BACK = 13


def seed_scale(ctx) -> dict:
    """SCALE_CALLS (default 10,000,000) calls in the call log ``module_calls``, spread
    evenly over the SPAN_DAYS days before the current hour across the bench account (1 call in BENCH_SHARE,
    20 products) and NOISE_ACCOUNTS other accounts; 1 in 50 refunded (provider_error),
    1 in 23 in test mode (not charged); then the hourly rollups ``usage_hourly`` those
    calls imply, aggregated from the call log itself (calls, refunds as errors, spend of
    what was not refunded), and the daily ones ``usage_daily`` of the fully rolled days,
    as the rollup job would write them. Set-based SQL only
    (``generate_series``), in chunks of 1M rows; monthly partitions are created first when
    the schema has them. The seeded calls carry no ledger postings (history before the
    run): ``flask ledger check`` and reconcile cover the run's own calls."""
    t0 = time.monotonic()
    acct = ctx.account_id
    has_calls = _q("SELECT to_regclass('public.module_calls') IS NOT NULL") == "t"
    if not has_calls:
        raise RuntimeError("this build has no module_calls table")
    if _q("SELECT to_regproc('gw_create_month_partition') IS NOT NULL") == "t":
        for table in ("module_calls", "chat_completions", "ledger_entries"):
            _q(f"SELECT gw_create_month_partition('{table}', (date_trunc('month', now() AT TIME ZONE 'UTC')"
               f" - make_interval(months => m))::date) FROM generate_series(0, {_MONTHS_BACK}) AS m")
    step_us = SPAN_DAYS * 86400 * 1_000_000 // SCALE_CALLS
    # the seeded calls end at the rollup mark (an hour; the migration sets it, the roll job
    # moves it): the hours before it are never rolled again, so the rollups written below
    # are the only ones of the seeded calls while the usage-roll job runs beside the seed
    if _q("SELECT to_regclass('public.usage_rollup_state') IS NOT NULL") == "t":
        _q("INSERT INTO usage_rollup_state (id, rolled_through) VALUES (1, date_trunc('hour', now())) "
           "ON CONFLICT (id) DO NOTHING")
        end = _q("SELECT to_char(rolled_through AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
                 "FROM usage_rollup_state WHERE id = 1")
    else:
        end = _q("SELECT to_char(date_trunc('hour', now() AT TIME ZONE 'UTC'), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
    chunk = 1_000_000
    for lo in range(0, SCALE_CALLS, chunk):
        hi = min(SCALE_CALLS, lo + chunk) - 1
        _q(f"""
SET synchronous_commit = off;
INSERT INTO module_calls (id, account_id, module_id, module_slug, action, mode, status,
                          price_micros, charged, ok, provider_status, error, receipt,
                          created_at, deadline_at, finished_at)
SELECT 'call_seed' || lpad(g::text, 9, '0'), acc, 0, slug, 'run', mode,
       CASE WHEN refunded THEN 'refunded' ELSE 'succeeded' END,
       10000, mode = 'live', CASE WHEN refunded THEN NULL ELSE true END,
       CASE WHEN refunded THEN 502 ELSE 200 END,
       CASE WHEN refunded THEN 'provider_error' END,
       CASE WHEN acc = '{acct}' AND NOT refunded THEN jsonb_build_object('hash', md5(g::text)) END,
       ts, ts + interval '70 seconds', ts + interval '40 milliseconds'
FROM (SELECT g,
             CASE WHEN g % {BENCH_SHARE} = 0 THEN '{acct}' ELSE 'acct_noise' || (g % {NOISE_ACCOUNTS}) END AS acc,
             CASE WHEN g % {BENCH_SHARE} = 0 THEN 'seed-mod-' || ((g / {BENCH_SHARE}) % {SCALE_PRODUCTS})
                  ELSE 'seed-mod-' || (g % {NOISE_ACCOUNTS} % 7) END AS slug,
             CASE WHEN g % 23 = 0 THEN 'test' ELSE 'live' END AS mode,
             g % 50 = 7 AS refunded,
             timestamptz '{end}' - interval '{SPAN_DAYS} days' + make_interval(secs => (g::bigint * {step_us}) / 1e6) AS ts
      FROM generate_series({lo}, {hi}) AS g) s""")
    _q("""
SET synchronous_commit = off;
INSERT INTO usage_hourly AS u (account_id, product, mode, hour, calls, errors, spend_micros)
SELECT account_id, module_slug, mode,
       date_trunc('hour', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
       count(*), count(*) FILTER (WHERE status = 'refunded'),
       coalesce(sum(price_micros) FILTER (WHERE status <> 'refunded'), 0)
FROM module_calls WHERE id LIKE 'call_seed%'
GROUP BY 1, 2, 3, 4
ON CONFLICT (account_id, product, mode, hour) DO UPDATE
  SET calls = u.calls + excluded.calls, errors = u.errors + excluded.errors,
      spend_micros = u.spend_micros + excluded.spend_micros""")
    if _q("SELECT to_regclass('public.usage_daily') IS NOT NULL") == "t":
        # the days before the mark's day are fully rolled: their daily rollups, summed from
        # usage_hourly as the roll job writes them (readers take whole days from usage_daily);
        # one transaction holding the state row, as the roll job does (a day it rolls meanwhile)
        _q("""
SELECT 1 FROM usage_rollup_state WHERE id = 1 FOR UPDATE;
UPDATE usage_rollup_state SET days_rolled_through = date_trunc('day', rolled_through AT TIME ZONE 'UTC')
                                                    AT TIME ZONE 'UTC' WHERE id = 1;
DELETE FROM usage_daily WHERE day < (SELECT days_rolled_through FROM usage_rollup_state WHERE id = 1);
INSERT INTO usage_daily (account_id, product, mode, day, calls, errors, spend_micros)
SELECT account_id, product, mode, date_trunc('day', hour AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
       sum(calls), sum(errors), sum(spend_micros)
FROM usage_hourly WHERE hour < (SELECT days_rolled_through FROM usage_rollup_state WHERE id = 1)
GROUP BY 1, 2, 3, 4""")
        _q("VACUUM ANALYZE usage_daily")
    # a bulk load leaves the visibility map unset; autovacuum sets it soon after on a live
    # database (insert thresholds), and the index-only scans of the reads depend on it
    _q("VACUUM ANALYZE usage_hourly")
    _q("VACUUM ANALYZE module_calls")
    # flush the load's dirty pages now, not in a checkpoint that lands in the middle of a
    # scenario (a live database is not bulk-loaded seconds before its traffic)
    _q("CHECKPOINT")
    seeded = int(_q(f"SELECT coalesce(sum(calls), 0) FROM usage_hourly WHERE account_id = '{acct}' "
                    f"AND product LIKE 'seed-mod-%'"))
    info = {"calls": SCALE_CALLS, "bench_account_calls": seeded, "accounts": NOISE_ACCOUNTS + 1,
            "span_days": SPAN_DAYS, "end": end,
            "usage_hourly_rows": int(_q("SELECT count(*) FROM usage_hourly")),
            "module_calls_rows": int(_q("SELECT count(*) FROM module_calls")),
            "partitions": int(_q("SELECT count(*) FROM pg_inherits WHERE inhparent = 'module_calls'::regclass")),
            "seconds": round(time.monotonic() - t0, 1),
            "method": "INSERT … SELECT generate_series (call log), rollups aggregated from it"}
    ctx.log(f"scale seed: {info}")
    return info


def tail_calls(ctx) -> int | None:
    """The bench account's calls a usage read aggregates from the call log itself (those
    after the tail mark, else the rollup mark: not counted in ``usage_hourly`` yet)."""
    has = _q("SELECT count(*) FROM information_schema.columns WHERE table_name = 'usage_rollup_state' "
             "AND column_name IN ('rolled_through', 'tail_through')")
    if has == "0":
        return None
    mark = ("coalesce(tail_through, rolled_through)" if has == "2" else "rolled_through")
    return int(_q(f"SELECT count(*) FROM module_calls WHERE account_id = '{ctx.account_id}' "
                  f"AND created_at >= (SELECT {mark} FROM usage_rollup_state WHERE id = 1)"))
