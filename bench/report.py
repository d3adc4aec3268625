"""Issue 18's targets (ratios within one run; the throughput ratios at the top concurrency
as the median of the run's interleaved ratio rounds), the Markdown report of a benchmark run, and the one
writer of its results: everything a run reports goes under ``bench/results/`` and nowhere
else (no tracked file outside it is ever rewritten)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _row(results: dict, name: str, c: str) -> dict | None:
    sc = results["scenarios"].get(name)
    return sc["by_concurrency"].get(c) if sc else None


def _target(name: str, value, goal: str, ok: bool | None, detail: str) -> dict:
    return {"name": name, "value": value, "goal": goal,
            "status": ("info" if goal == "info" else "n/a") if ok is None else ("met" if ok else "MISSED"),
            "detail": detail}


SCALE_CALLS = 10_000_000  # issue 18: the account-scoped reads and the alert pass at 10M calls
ALERT_RULES = 10_000


def _cpu(results: dict, name: str, c: str) -> tuple[float, float] | None:
    """(server CPU ms, PostgreSQL CPU ms) per request of a scenario at concurrency c."""
    row = _row(results, name, c) or {}
    if "server_cpu_ms_per_req" not in row:
        return None
    return row["server_cpu_ms_per_req"], row.get("pg_cpu_ms_per_req", 0.0)


def _ratio_target(out: list, label: str, goal: str, pair, value_fn, ok_fn, detail_fn, missing: str) -> None:
    if all(pair):
        v = value_fn(*pair)
        out.append(_target(label, round(v, 3), goal, ok_fn(v), detail_fn(*pair)))
    else:
        out.append(_target(label, None, goal, None, missing))


# what the ratio rounds measure (bench/scenarios.py RatioRounds), in their order, and the
# throughput ratios judged on them: (scenario, over scenario, label of the latter)
ROUND_SCENARIOS = ("passthrough", "metered", "portkey", "chat", "litellm")
ROUND_RATIOS = (("metered", "passthrough", "passthrough"), ("metered", "portkey", "Portkey"),
                ("chat", "litellm", "LiteLLM"))


def round_ratios(results: dict, name: str, other: str, c: str) -> list[float]:
    """``name``'s req/s over ``other``'s within each ratio round at concurrency ``c`` that
    measured both (none when the run had no rounds: an old result file, BENCH_RATIO_ROUNDS=0)."""
    rr = results.get("ratio_rounds") or {}
    if str(rr.get("concurrency")) != c:
        return []
    return [r["rows"][name]["rps"] / r["rows"][other]["rps"] for r in rr.get("rounds", [])
            if name in r["rows"] and other in r["rows"] and r["rows"][other]["rps"]]


def _throughput_target(out: list, results: dict, c: str, name: str, other: str, other_label: str,
                       minimum: float) -> None:
    """Scenario ``name``'s requests per second over ``other``'s at concurrency ``c``: at
    least ``minimum``; judged on the median of the per-round ratios of the ratio rounds
    when there are any, else on the single runs of the scenario table."""
    label, goal = f"{name} throughput / {other_label} (c={c})", f"≥ {minimum:g}"
    single = (_row(results, name, c), _row(results, other, c))
    per_round = round_ratios(results, name, other, c)
    if per_round:
        v = statistics.median(per_round)
        runs = f"{single[0]['rps']} vs {single[1]['rps']} req/s" if all(single) else "not measured"
        out.append(_target(label, round(v, 3), goal, v >= minimum,
                           f"median of {len(per_round)} rounds ({', '.join(f'{x:.2f}' for x in per_round)}); "
                           f"single runs: {runs}"))
        return
    _ratio_target(out, label, goal, single,
                  lambda a, b: a["rps"] / b["rps"] if b["rps"] else 0.0, lambda v: v >= minimum,
                  lambda a, b: f"single runs: {a['rps']} vs {b['rps']} req/s (no ratio rounds)",
                  f"{name} or {other_label} not measured")


def targets(results: dict) -> list[dict]:
    """Issue 18's and issue 36's targets against their goals, from one run (ratios within the run)."""
    conc = [str(c) for c in results.get("settings", {}).get("concurrency", [1, 16])]
    lo, hi = conc[0], conc[-1]
    out: list[dict] = []
    _throughput_target(out, results, hi, "metered", "passthrough", "passthrough", 0.6)
    _ratio_target(out, f"metered server CPU per request / passthrough's (c={hi})", "≤ 2",
                  (_cpu(results, "metered", hi), _cpu(results, "passthrough", hi)),
                  lambda m, p: m[0] / p[0] if p[0] else float("inf"), lambda v: v <= 2.0,
                  lambda m, p: f"{m[0]:.2f} (+{m[1]:.2f} PostgreSQL) vs {p[0]:.2f} ms CPU per request",
                  "metered or passthrough CPU not measured")
    dir1 = _row(results, "direct", lo)
    _ratio_target(out, f"metered added p50 latency (c={lo})", "≤ 2 ms",
                  (_row(results, "metered", lo), dir1), lambda m, d: m["p50_ms"] - d["p50_ms"],
                  lambda v: v <= 2.0, lambda m, d: f"{m['p50_ms']} − {d['p50_ms']} ms (direct)",
                  "metered or direct not measured")
    # issue 36: Portkey's gateway meters nothing; the metered call must keep up with it
    _throughput_target(out, results, hi, "metered", "portkey", "Portkey", 0.9)
    _throughput_target(out, results, hi, "chat", "litellm", "LiteLLM", 2.0)
    _ratio_target(out, f"chat added p50 / LiteLLM added p50 (c={lo})", "≤ 0.5",
                  (_row(results, "chat", lo), _row(results, "litellm", lo), dir1),
                  lambda c, li, d: ((c["p50_ms"] - d["p50_ms"]) / (li["p50_ms"] - d["p50_ms"])
                                    if li["p50_ms"] > d["p50_ms"] else float("inf")),
                  lambda v: v <= 0.5,
                  lambda c, li, d: (f"{c['p50_ms'] - d['p50_ms']:.3f} ms vs {li['p50_ms'] - d['p50_ms']:.3f} ms "
                                    "over direct"), "chat, LiteLLM or direct not measured")
    # each account-scoped read's own latency at c=1 (at c=16, 16 requests queue for
    # 2 workers on 2 cores, and p99 measures that queue; in the detail)
    calls = results.get("checks", {}).get("scale_seed", {}).get("calls") or 0
    for name in ("usage-current", "usage-by-module", "usage-daily", "usage-export"):
        sc = results["scenarios"].get(name)
        label = f"{name} p99 (c={lo}) at 10M calls"
        if not sc or lo not in sc["by_concurrency"]:
            out.append(_target(label, None, "≤ 20 ms", None, f"{name} not measured"))
            continue
        p99 = sc["by_concurrency"][lo]["p99_ms"]
        at_hi = sc["by_concurrency"].get(hi, {}).get("p99_ms")
        detail = f"{calls:,} calls recorded" + (f"; c={hi} p99 {at_hi} ms" if at_hi is not None else "")
        out.append(_target(label, p99, "≤ 20 ms", p99 <= 20.0 if calls >= SCALE_CALLS else None,
                           detail if calls >= SCALE_CALLS else detail + f" (fewer than {SCALE_CALLS:,}: not judged)"))
    case = next((r for r in results.get("alerts", [])
                 if r["rules"] == ALERT_RULES and r["calls"] == SCALE_CALLS), None)
    label = f"alert pass, {ALERT_RULES:,} rules at 10M calls (slowest of cold / steady, median of 3)"
    if case:
        worst = max(case["cold"]["seconds"], case["steady"]["seconds"])
        out.append(_target(label, round(worst, 3), "< 1 s", worst < 1.0,
                           f"cold {case['cold']['seconds']:.3f} s ({case['cold']['fired']} fired), "
                           f"steady {case['steady']['seconds']:.3f} s"))
    else:
        out.append(_target(label, None, "< 1 s", None, "alerts not measured at this size"))
    errors = {f"{n} c={c}": row["errors"] for n, sc in results["scenarios"].items()
              for c, row in sc["by_concurrency"].items() if row["errors"]}
    errors.update({f"{n} round {i}": row["errors"]
                   for i, r in enumerate((results.get("ratio_rounds") or {}).get("rounds", []), 1)
                   for n, row in r["rows"].items() if row["errors"]})
    total = sum(errors.values())
    out.append(_target("errors in all scenarios", total, "0", total == 0,
                       ", ".join(f"{k}: {v}" for k, v in errors.items()) or "none"))
    after = results.get("checks", {}).get("after_scenario", {})
    dirty = [f"{n}: {check}" for n, checks in after.items() for check, r in checks.items() if not r["clean"]]
    out.append(_target("flask ledger check + flask money reconcile after every scenario",
                       None if not after else ("clean" if not dirty else "VIOLATIONS"), "clean",
                       None if not after else not dirty,
                       "not run" if not after else (", ".join(dirty) or f"clean after {', '.join(after)}")))
    mem = results.get("memory", {})
    r1, r2 = mem.get("after_load_run_1"), mem.get("after_load_run_2")
    if r1 and r2:
        growth = {w: (r2.get(w) or 0) - (r1.get(w) or 0) for w in r1}
        worst = max(growth.values()) if growth else 0
        out.append(_target("worker RSS growth between two identical runs", f"{worst / 1024:.1f} MiB",
                           "≤ 2 MiB per worker", worst <= 2048,
                           ", ".join(f"worker {w}: {g / 1024:+.1f} MiB" for w, g in growth.items())))
    else:
        out.append(_target("worker RSS growth between two identical runs", None, "≤ 2 MiB per worker",
                           None, "needs the metered scenario"))
    return out


def _jobs_line(results: dict) -> list[str]:
    if "jobs" not in results:
        return []
    line = ("`flask worker` and `flask scheduler` ran beside gunicorn (deploy/Procfile)." if results["jobs"]
            else "No worker or scheduler ran (`BENCH_JOBS=0`): no periodic job, no usage roll.")
    seed = results.get("checks", {}).get("scale_seed") or {}
    if seed.get("tail_calls") is not None:
        line += (f" Usage reads: {seed['calls']:,} seeded calls ending {seed.get('end')}; "
                 f"{seed['tail_calls']:,} of the bench account's calls were after the rollup's tail mark "
                 "when the reads began (read from the call log itself).")
    return [line, ""]


def _rounds_table(results: dict) -> list[str]:
    """The ratio rounds: each round's req/s per scenario and its ratios, and the medians."""
    rr = results.get("ratio_rounds") or {}
    rounds = rr.get("rounds") or []
    if not rounds:
        return []
    names = [n for n in ROUND_SCENARIOS if any(n in r["rows"] for r in rounds)]
    pairs = [(a, b, lab) for a, b, lab in ROUND_RATIOS if a in names and b in names]

    def ratio(r, a, b):
        return r["rows"][a]["rps"] / r["rows"][b]["rps"] if a in r["rows"] and r["rows"].get(b, {}).get("rps") else None

    def fmt(v, spec):
        return "" if v is None else format(v, spec)

    lines = ["", f"Ratio rounds (c={rr['concurrency']}, {rr['duration_s']} s per run, order reversed every "
             "other round; the throughput targets are the median of the per-round ratios):", "",
             "| round | order | " + " | ".join(f"{n} req/s" for n in names) + " | "
             + " | ".join(f"{a} / {lab}" for a, _b, lab in pairs) + " |",
             "|---:|---|" + "---:|" * (len(names) + len(pairs))]
    for i, r in enumerate(rounds, 1):
        lines.append(f"| {i} | {' → '.join(r['order'])} | "
                     + " | ".join(fmt(r["rows"].get(n, {}).get("rps"), ",.0f") for n in names) + " | "
                     + " | ".join(fmt(ratio(r, a, b), ".3f") for a, b, _lab in pairs) + " |")

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    lines.append("| median | | " + " | ".join(fmt(med(r["rows"].get(n, {}).get("rps") for r in rounds), ",.0f")
                                              for n in names) + " | "
                 + " | ".join(fmt(med(ratio(r, a, b) for r in rounds), ".3f") for a, b, _lab in pairs) + " |")
    return lines


def markdown(results: dict) -> str:
    conc = [str(c) for c in results.get("settings", {}).get("concurrency", [1, 16])]
    m = results.get("machine", {})
    v = results.get("versions", {})
    s = results.get("settings", {})
    g = s.get("gunicorn", {})
    lines = [f"### Benchmark run {results.get('generated_at', '')}", "",
             f"Machine: {m.get('nproc')} CPUs ({m.get('cpu')}), {m.get('memory_mib', 0):,} MiB RAM, "
             f"Linux {m.get('kernel')}. Everything on loopback on this one machine (load generator included); "
             f"load average at start {results.get('loadavg_start')}, at end {m.get('loadavg_end')}.",
             "",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val), "",
             f"Settings: gunicorn {g.get('workers')} workers ({g.get('worker_class')}"
             + (f", {g['worker_connections']} connections each" if g.get("worker_connections") else
                f", {g.get('threads')} threads each") + "), APP_ENV=production, PostgreSQL + Redis; wrk 1 thread, "
             f"{s.get('duration_s')} s per measurement after a {s.get('warmup_s')} s warm-up; "
             f"errors = non-2xx/3xx responses + socket errors.", "",
             *_jobs_line(results),
             "| scenario | " + " | ".join(f"c={c} req/s | c={c} p50 ms | c={c} p99 ms | c={c} errors"
                                         for c in conc) + f" | CPU ms/req (server + PostgreSQL, c={conc[-1]}) |",
             "|---|" + "---:|" * (4 * len(conc)) + "---:|"]
    for name, sc in results["scenarios"].items():
        cells = []
        for c in conc:
            row = sc["by_concurrency"].get(c)
            cells += ([f"{row['rps']:,.0f}", f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}",
                       str(row["errors"])] if row else ["", "", "", ""])
        top = sc["by_concurrency"].get(conc[-1]) or {}
        cpu = f"{top['server_cpu_ms_per_req']:.2f}" if "server_cpu_ms_per_req" in top else ""
        if "pg_cpu_ms_per_req" in top:
            cpu += f" + {top['pg_cpu_ms_per_req']:.2f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {cpu} |")
    if results.get("unavailable"):
        lines += ["", "Not measured: " + "; ".join(f"`{k}`: {v}" for k, v in results["unavailable"].items())]
    lines += ["", "| target | value | goal | status | detail |", "|---|---:|---|---|---|"]
    for t in results.get("targets", []):
        val = "—" if t["value"] is None else t["value"]
        lines.append(f"| {t['name']} | {val} | {t['goal']} | {t['status']} | {t['detail']} |")
    mem = results.get("memory", {})
    if mem:
        lines += ["", "Gunicorn worker RSS (MiB): " + "; ".join(
            f"{label}: " + ", ".join(f"{(kib or 0) / 1024:.1f}" for kib in workers.values())
            for label, workers in mem.items())]
    lines += _rounds_table(results)
    if results.get("roundtrips"):
        lines += ["", "Round trips of one warm request (counted, not timed; `bench/roundtrips.py`):", "",
                  "| path | status | SQL statements | PostgreSQL round trips | commits | Redis commands "
                  "| upstream requests |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, c in results["roundtrips"].items():
            lines.append(f"| {name} | {c['status']} | {c['sql']} | {c.get('pg', '–')} | {c['commits']} | "
                         f"{c['redis']} | {c['upstream_http']} |")
    if results.get("alerts"):
        lines += ["", "Alert evaluation (`bench/alerts_eval.py`, one pass of all rules; median of 3):", "",
                  "| rules | calls | rollup rows | cold pass s (fired) | steady pass s |",
                  "|---:|---:|---:|---:|---:|"]
        for r in results["alerts"]:
            lines.append(f"| {r['rules']:,} | {r['calls']:,} | {r['rollup_rows']:,} | "
                         f"{r['cold']['seconds']:.3f} ({r['cold']['fired']}) | {r['steady']['seconds']:.3f} |")
    notes = [f"- `{n}`: {sc['note']}" for n, sc in results["scenarios"].items() if sc.get("note")]
    if notes:
        lines += ["", "Scenarios:", *notes]
    for name, prof in results.get("profiles", {}).items():
        if "error" in prof:
            lines += ["", f"Profile `{name}`: {prof['error']}"]
            continue
        lines += ["", f"Profile `{name}` (py-spy, {prof['samples']} samples, `{prof['file']}`), "
                      "inclusive time in project code:"]
        lines += [f"- {r['pct']}% {r['frame']}" for r in prof["top_inclusive_project"][:8]]
    lines.append("")
    return "\n".join(lines)


def write(results: dict, *, partial: bool, results_dir: Path = RESULTS) -> list[Path]:
    """Write the report of one run, only under ``results_dir`` (``bench/results/``): the
    run's own ``run-<time>.{json,md}`` and ``latest.{json,md}`` (``partial.{json,md}`` for
    a BENCH_ONLY or what-if run, which never replaces the full results). Returns the paths."""
    stamp = str(results.get("generated_at") or "unknown").replace(":", "").replace("-", "")
    stems = [f"run-{stamp}" + ("-partial" if partial else ""), "partial" if partial else "latest"]
    text_json = json.dumps(results, indent=2, sort_keys=True)
    text_md = markdown(results)
    results_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem in stems:
        for suffix, text in ((".json", text_json), (".md", text_md)):
            path = results_dir / (stem + suffix)
            path.write_text(text)
            written.append(path)
    return written
