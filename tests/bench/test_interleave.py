"""bench/interleave.py's summary: per-pair ratios and medians of alternated runs."""
from bench.interleave import summary


def _row(pair, c, p_rps, m_rps, p_cpu=2.0, m_cpu=3.0, m_pg=1.0, p_p50=2.0, m_p50=4.0):
    return {"pair": pair, "c": c,
            "passthrough": {"rps": p_rps, "server_cpu_ms_per_req": p_cpu, "p50_ms": p_p50},
            "metered": {"rps": m_rps, "server_cpu_ms_per_req": m_cpu, "pg_cpu_ms_per_req": m_pg, "p50_ms": m_p50}}


def test_ratios_are_per_pair_and_the_median_is_of_the_pairs():
    rows = [_row(0, 16, 1000, 500), _row(0, 1, 400, 200, m_p50=5.0),
            _row(1, 16, 500, 400), _row(1, 1, 400, 200, m_p50=3.0),
            _row(2, 16, 800, 480, m_cpu=2.0), _row(2, 1, 400, 200, m_p50=4.5)]
    s = summary(rows)
    assert s["throughput_ratio_c16"] == [0.5, 0.8, 0.6]
    assert s["cpu_ratio_c16"] == [2.0, 2.0, 1.5]
    assert s["median"] == {"throughput_ratio_c16": 0.6, "cpu_ratio_c16": 2.0,
                           "metered_p50_c1_ms": 4.5, "metered_minus_passthrough_p50_c1_ms": 2.5}
