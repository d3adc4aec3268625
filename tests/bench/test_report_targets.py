"""``bench/report.targets`` judges issue 18's targets against their goals (the goals
themselves, and that a figure measured at the wrong size is not judged)."""
from __future__ import annotations

from bench import report


def _row(rps, p50, p99=None, cpu=None, pg=0.0, errors=0):
    row = {"rps": rps, "p50_ms": p50, "p99_ms": p99 if p99 is not None else p50, "errors": errors}
    if cpu is not None:
        row.update(server_cpu_ms_per_req=cpu, pg_cpu_ms_per_req=pg)
    return row


def _results(*, metered_rps=700, metered_cpu=3.0, usage_p99=12.0, calls=10_000_000, alert_s=0.4,
             reconcile_clean=True):
    sc = {
        "direct": {"1": _row(5000, 0.3), "16": _row(9000, 1.0)},
        "passthrough": {"1": _row(600, 1.8), "16": _row(1000, 12, cpu=1.9)},
        "metered": {"1": _row(300, 2.1), "16": _row(metered_rps, 20, cpu=metered_cpu, pg=0.5)},
        "portkey": {"1": _row(400, 1.5), "16": _row(750, 18, cpu=1.5)},
        "chat": {"1": _row(200, 3.0), "16": _row(250, 50, cpu=4.0)},
        "litellm": {"1": _row(100, 9.7), "16": _row(100, 150, cpu=10.0)},
        **{n: {"1": _row(200, 5, usage_p99), "16": _row(600, 20, 60)}
           for n in ("usage-current", "usage-by-module", "usage-daily", "usage-export")},
    }
    clean = {"exit_code": 0, "clean": True, "output": ""}
    return {
        "settings": {"concurrency": [1, 16]},
        "scenarios": {n: {"by_concurrency": rows} for n, rows in sc.items()},
        "checks": {"scale_seed": {"calls": calls},
                   "after_scenario": {"metered": {"ledger check": clean,
                                                  "money reconcile": dict(clean, clean=reconcile_clean)}}},
        "alerts": [{"rules": 10_000, "calls": 10_000_000, "rollup_rows": 1_000_000,
                    "cold": {"seconds": alert_s, "fired": 1000}, "steady": {"seconds": alert_s / 2}}],
        "memory": {"after_load_run_1": {"0": 100_000}, "after_load_run_2": {"0": 100_500}},
    }


def _status(results) -> dict:
    return {t["name"]: t["status"] for t in report.targets(results)}


def test_every_issue_18_target_is_reported_and_met():
    status = _status(_results())
    assert len(status) == 14
    assert set(status.values()) == {"met"}, status


def test_each_goal_is_the_issue_18_goal():
    goals = {t["name"].split(" (")[0]: t["goal"] for t in report.targets(_results())}
    assert goals["metered throughput / passthrough"] == "≥ 0.6"
    assert goals["metered server CPU per request / passthrough's"] == "≤ 2"
    assert goals["metered added p50 latency"] == "≤ 2 ms"
    assert goals["metered throughput / Portkey"] == "≥ 0.9"
    assert goals["chat throughput / LiteLLM"] == "≥ 2"
    assert goals["chat added p50 / LiteLLM added p50"] == "≤ 0.5"
    assert goals["usage-export p99"] == "≤ 20 ms"
    assert goals["alert pass, 10,000 rules at 10M calls"] == "< 1 s"


def test_misses_are_reported():
    status = _status(_results(metered_rps=500, metered_cpu=4.0, usage_p99=25.0, alert_s=1.2,
                              reconcile_clean=False))
    missed = {n for n, s in status.items() if s == "MISSED"}
    assert "metered throughput / passthrough (c=16)" in missed          # 0.5 < 0.6
    assert "metered throughput / Portkey (c=16)" in missed              # 500 / 750 < 0.9
    assert "metered server CPU per request / passthrough's (c=16)" in missed  # 2.1 > 2
    assert "usage-daily p99 (c=1) at 10M calls" in missed
    assert any(n.startswith("alert pass") for n in missed)
    assert "flask ledger check + flask money reconcile after every scenario" in missed


def test_reads_measured_below_10m_calls_are_not_judged():
    status = _status(_results(calls=1_000_000, usage_p99=5.0))
    assert status["usage-current p99 (c=1) at 10M calls"] == "n/a"


def _rounds(*per_round, concurrency=16):
    """Synthetic ratio rounds: each argument is {scenario: req/s} of one round."""
    return {"concurrency": concurrency, "duration_s": 5,
            "rounds": [{"order": list(r), "rows": {n: _row(rps, 20) for n, rps in r.items()}}
                       for r in per_round]}


def _target(results, name) -> dict:
    return next(t for t in report.targets(results) if t["name"] == name)


MP = "metered throughput / passthrough (c=16)"
MK = "metered throughput / Portkey (c=16)"
CL = "chat throughput / LiteLLM (c=16)"


def test_throughput_ratios_are_judged_on_the_median_of_the_rounds():
    # single runs: metered/passthrough 500/1000 = 0.5 (MISSED alone); the rounds' ratios
    # 0.7, 0.5, 0.65: median 0.65 (met)
    results = _results(metered_rps=500)
    results["ratio_rounds"] = _rounds(
        {"passthrough": 1000, "metered": 700, "portkey": 700, "chat": 250, "litellm": 100},
        {"passthrough": 1200, "metered": 600, "portkey": 800, "chat": 240, "litellm": 130},
        {"passthrough": 1000, "metered": 650, "portkey": 600, "chat": 230, "litellm": 100})
    mp, mk, cl = (_target(results, n) for n in (MP, MK, CL))
    assert (mp["value"], mp["status"]) == (0.65, "met")
    assert mp["detail"] == "median of 3 rounds (0.70, 0.50, 0.65); single runs: 500 vs 1000 req/s"
    assert (mk["value"], mk["status"]) == (1.0, "met")              # 1.0, 0.75, 1.083
    assert (cl["value"], cl["status"]) == (2.3, "met")              # 2.5, 1.846, 2.3


def test_a_median_below_the_goal_is_missed_even_if_the_single_run_met():
    results = _results(metered_rps=900)  # single run 0.9 ≥ 0.6
    results["ratio_rounds"] = _rounds({"passthrough": 1000, "metered": 500},
                                      {"passthrough": 1000, "metered": 550},
                                      {"passthrough": 1000, "metered": 900})
    mp = _target(results, MP)
    assert (mp["value"], mp["status"]) == (0.55, "MISSED")


def test_without_rounds_the_single_runs_are_judged():
    # an old result file or BENCH_RATIO_ROUNDS=0: no "ratio_rounds"; or rounds at another
    # concurrency than the target's
    for rounds in (None, _rounds({"passthrough": 1000, "metered": 100}, concurrency=8)):
        results = _results(metered_rps=500)
        if rounds:
            results["ratio_rounds"] = rounds
        mp = _target(results, MP)
        assert (mp["value"], mp["status"]) == (0.5, "MISSED")
        assert mp["detail"] == "single runs: 500 vs 1000 req/s (no ratio rounds)"


def test_a_peer_missing_from_the_run_leaves_its_ratio_unjudged():
    results = _results()
    del results["scenarios"]["portkey"]
    results["ratio_rounds"] = _rounds({"passthrough": 1000, "metered": 700, "chat": 250, "litellm": 100})
    assert _target(results, MK)["status"] == "n/a"
    assert _target(results, MP)["status"] == "met"


def test_errors_in_the_rounds_count():
    results = _results()
    results["ratio_rounds"] = _rounds({"passthrough": 1000, "metered": 700})
    results["ratio_rounds"]["rounds"][0]["rows"]["metered"]["errors"] = 3
    errors = _target(results, "errors in all scenarios")
    assert (errors["value"], errors["status"], errors["detail"]) == (3, "MISSED", "metered round 1: 3")


def test_the_report_shows_each_round_and_the_medians():
    results = _results()
    results["ratio_rounds"] = _rounds({"passthrough": 1000, "metered": 700},
                                      {"metered": 600, "passthrough": 1200})
    md = report.markdown(results)
    assert "| round | order | passthrough req/s | metered req/s | metered / passthrough |" in md
    assert "| 1 | passthrough → metered | 1,000 | 700 | 0.700 |" in md
    assert "| 2 | metered → passthrough | 1,200 | 600 | 0.500 |" in md
    assert "| median | | 1,100 | 650 | 0.600 |" in md
