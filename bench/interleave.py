"""Passthrough and metered measured in alternation on one bench stack (``python
bench/interleave.py``; BENCH_DURATION, BENCH_PAIRS (default 6)).

On this shared 2-core machine the same work's CPU time swings about 2x from one minute
to the next. ``make bench`` judges its throughput ratios on interleaved ratio rounds at
c=16 (``scenarios.RatioRounds``); this tool is the narrower, quicker probe of passthrough
and metered alone, at c=1 as well, with CPU ratios and p50s. Each pair
is a passthrough run immediately followed by a metered run at the same concurrency
(c=16, then c=1), repeated; the per-pair ratios and their median are what both sides saw
under the same conditions. Writes only
``bench/results/interleave-<time>.{json,md}``.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import run as R  # noqa: E402
from bench import scenarios, seed, setup  # noqa: E402

PAIRS = int(os.environ.get("BENCH_PAIRS", "6"))


def start_stack(bench: R.Bench) -> tuple[str, list[str]]:
    """Start ``make bench``'s stack for ``bench`` (database, upstream, gunicorn), load the bench
    module and fund its accounts: (the gateway's base URL, the accounts' keys)."""
    bench.start()
    up, gw = (f"http://127.0.0.1:{bench.ports[n]}" for n in ("upstream", "gunicorn"))
    ctx = scenarios.Context(bench=bench, env=bench.env, ports=bench.ports, work=R.WORK, upstream=up,
                            gateway=gw, paths=bench.paths, log=R.log)
    seed.load_bench_module(ctx)
    return gw, ctx.all_keys()


def measure() -> list[dict]:
    bench = R.Bench()
    out = []
    try:
        gw, keys = start_stack(bench)
        url = f"{gw}/v1/module/{seed.MODULE_SLUG}/call"
        for i in range(PAIRS):
            for c in (16, 1):
                warm = 2 if i == 0 else 0
                p = bench.measure(f"passthrough-{i}-c{c}", f"{gw}/bench/passthrough", body=scenarios.MODULE_BODY,
                                  concurrencies=[c], warmup=warm)[str(c)]
                m = bench.measure(f"metered-{i}-c{c}", url, headers={"Authorization": f"Bearer {keys[0]}"},
                                  body=scenarios.MODULE_BODY, idempotency=True, auth_keys=keys,
                                  concurrencies=[c], warmup=warm)[str(c)]
                out.append({"pair": i, "c": c, "passthrough": p, "metered": m})
    finally:
        setup.RUNNING.stop_all()
        setup.drop_cached_state()
    return out


def summary(rows: list[dict]) -> dict:
    c16 = [r for r in rows if r["c"] == 16]
    c1 = [r for r in rows if r["c"] == 1]
    tput = [r["metered"]["rps"] / r["passthrough"]["rps"] for r in c16]
    cpu = [(r["metered"]["server_cpu_ms_per_req"] + r["metered"]["pg_cpu_ms_per_req"])
           / r["passthrough"]["server_cpu_ms_per_req"] for r in c16]
    p50 = [r["metered"]["p50_ms"] for r in c1]
    over = [r["metered"]["p50_ms"] - r["passthrough"]["p50_ms"] for r in c1]
    return {"throughput_ratio_c16": [round(x, 3) for x in tput], "cpu_ratio_c16": [round(x, 3) for x in cpu],
            "metered_p50_c1_ms": p50, "metered_minus_passthrough_p50_c1_ms": [round(x, 3) for x in over],
            "median": {"throughput_ratio_c16": round(statistics.median(tput), 3),
                       "cpu_ratio_c16": round(statistics.median(cpu), 3),
                       "metered_p50_c1_ms": round(statistics.median(p50), 3),
                       "metered_minus_passthrough_p50_c1_ms": round(statistics.median(over), 3)}}


def main() -> int:
    started = datetime.now(timezone.utc)
    load = setup.loadavg()
    rows = measure()
    result = {"started": started.isoformat(timespec="seconds"), "loadavg_start": load, "pairs": PAIRS,
              "duration_s": R.DURATION, "rows": rows, "summary": summary(rows)}
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    out = R.ROOT / "bench" / "results"
    (out / f"interleave-{stamp}.json").write_text(json.dumps(result, indent=1))
    s = result["summary"]
    md = [f"### Interleaved passthrough / metered, {result['started']}", "",
          f"{PAIRS} pairs, {R.DURATION} s per run; load average at start {load}.", "",
          "| pair | passthrough c=16 req/s | metered c=16 req/s | ratio | CPU ratio | passthrough c=1 p50 ms | metered c=1 p50 ms |",
          "|---:|---:|---:|---:|---:|---:|---:|"]
    for i in range(PAIRS):
        a, b = (next(r for r in rows if r["pair"] == i and r["c"] == c) for c in (16, 1))
        md.append(f"| {i} | {a['passthrough']['rps']:.0f} | {a['metered']['rps']:.0f} | {s['throughput_ratio_c16'][i]} "
                  f"| {s['cpu_ratio_c16'][i]} | {b['passthrough']['p50_ms']:.2f} | {b['metered']['p50_ms']:.2f} |")
    md += ["", "Medians: " + ", ".join(f"{k} {v}" for k, v in s["median"].items())]
    (out / f"interleave-{stamp}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
