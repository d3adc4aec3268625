"""Benchmark data: the bench module and chat model (pointing at the fake upstream), and the
scale data set (1,000,000 recorded calls) written with set-based SQL (``generate_series``)."""
from __future__ import annotations

import os
import time

from bench import setup

MODULE_SLUG = "bench-echo"
SCALE_CALLS = int(os.environ.get("BENCH_SCALE_CALLS", "1000000"))
SCALE_PRODUCTS = 20          # module slugs the bench account used
NOISE_ACCOUNTS = 2000        # other accounts' rollups, so the indexes have real work


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


def seed_scale(ctx) -> dict:
    """Record SCALE_CALLS calls for the first bench account inside the current billing
    period (the call log ``module_calls`` when this build has it, and the hourly rollups
    ``usage_hourly`` they imply), the same volume again as history in the 60 days before,
    and other accounts' rollups — all with set-based SQL."""
    t0 = time.monotonic()
    acct = ctx.account_id
    # whole hours from the start of the month (UTC) to the current hour, at least one
    hours = max(1, int(_q("SELECT floor(extract(epoch FROM date_trunc('hour', now() AT TIME ZONE 'UTC')"
                          " - date_trunc('month', now() AT TIME ZONE 'UTC')) / 3600)")))
    slots = hours * SCALE_PRODUCTS
    per, extra = divmod(SCALE_CALLS, slots)  # the first `extra` slots get one more call
    # slot i = hour offset h (0 = start of the month) × product p
    hour_expr = "(date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') + (h || ' hours')::interval"
    has_calls = _q("SELECT to_regclass('public.module_calls') IS NOT NULL") == "t"
    if has_calls:
        # one call row per call (status succeeded, charged=false: history rows carry no
        # ledger posting, so `flask ledger check` stays meaningful)
        _q(f"""
INSERT INTO module_calls (id, account_id, module_id, module_slug, action, mode, status,
                          price_micros, charged, ok, provider_status, created_at,
                          deadline_at, finished_at)
SELECT 'call_seed' || lpad(g::text, 9, '0'), '{acct}', 0, 'seed-mod-' || (g % {SCALE_PRODUCTS}),
       'run', 'live', 'succeeded', 10000, false, true, 200, ts, ts, ts
FROM (SELECT g, {hour_expr.replace("h ||", "(g % " + str(hours) + ") ||")} AS ts
      FROM generate_series(0, {SCALE_CALLS - 1}) AS g) s""")
    _q(f"""
INSERT INTO usage_hourly (account_id, product, mode, hour, calls, errors, spend_micros)
SELECT '{acct}', 'seed-mod-' || p, 'live', {hour_expr}, c, 0, c * 10000
FROM (SELECT h, p, {per} + CASE WHEN h * {SCALE_PRODUCTS} + p < {extra} THEN 1 ELSE 0 END AS c
      FROM generate_series(0, {hours - 1}) AS h, generate_series(0, {SCALE_PRODUCTS - 1}) AS p) s
WHERE c > 0
ON CONFLICT (account_id, product, mode, hour) DO UPDATE
  SET calls = usage_hourly.calls + excluded.calls,
      spend_micros = usage_hourly.spend_micros + excluded.spend_micros""")
    # history before this period (must not be counted by /api/usage/current)
    hist_hours = 60 * 24
    _q(f"""
INSERT INTO usage_hourly (account_id, product, mode, hour, calls, errors, spend_micros)
SELECT '{acct}', 'seed-mod-' || p, 'live',
       (date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') - ((h + 1) || ' hours')::interval,
       {max(1, SCALE_CALLS // (hist_hours * SCALE_PRODUCTS))}, 0, 10000
FROM generate_series(0, {hist_hours - 1}) AS h, generate_series(0, {SCALE_PRODUCTS - 1}) AS p
ON CONFLICT DO NOTHING""")
    _q(f"""
INSERT INTO usage_hourly (account_id, product, mode, hour, calls, errors, spend_micros)
SELECT 'acct_noise' || a, 'seed-mod-' || (a % 7), 'live',
       date_trunc('hour', now()) - (h || ' hours')::interval, 3, 0, 30000
FROM generate_series(1, {NOISE_ACCOUNTS}) AS a, generate_series(0, 71) AS h
ON CONFLICT DO NOTHING""")
    if _q("SELECT to_regclass('public.usage_rollup_state') IS NOT NULL") == "t":
        # usage is read as usage_hourly + the call log after the rollup mark: the seeded
        # hours (all before the current one) are rolled hours, so their calls count once
        _q("INSERT INTO usage_rollup_state (id, rolled_through) VALUES (1, date_trunc('hour', now())) "
           "ON CONFLICT (id) DO UPDATE SET rolled_through = greatest(usage_rollup_state.rolled_through, "
           "excluded.rolled_through)")
    _q("ANALYZE usage_hourly")
    if has_calls:
        _q("ANALYZE module_calls")
    seeded = int(_q(f"SELECT coalesce(sum(calls), 0) FROM usage_hourly WHERE account_id = '{acct}' "
                    f"AND hour >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' "
                    f"AND product LIKE 'seed-mod-%'"))
    info = {"calls": seeded, "period_hours": hours,
            "usage_hourly_rows": int(_q("SELECT count(*) FROM usage_hourly")),
            "module_calls_rows": int(_q("SELECT count(*) FROM module_calls")) if has_calls else 0,
            "seconds": round(time.monotonic() - t0, 1),
            "method": "INSERT … SELECT generate_series (call log + hourly rollups)"}
    ctx.log(f"scale seed: {info}")
    return info
