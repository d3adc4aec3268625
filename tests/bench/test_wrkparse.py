"""The benchmark harness's parsing of wrk output (bench/wrkparse.py). Not timed."""
from __future__ import annotations

import pytest

from bench.wrkparse import parse

TEXT = """Running 3s test @ http://127.0.0.1:39847/bench/passthrough
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    22.43ms   11.38ms   1.08s    80.80%
    Req/Sec   725.17    239.10     1.16k    63.33%
  Latency Distribution
     50%  817.00us
     75%   28.68ms
     90%   39.63ms
     99%    1.20s
  2171 requests in 3.01s, 617.52KB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 7
Requests/sec:    721.56
Transfer/sec:    205.24KB
"""

JSON_LINE = ('WRK_JSON {"requests":2171,"duration_us":3008766,"bytes":632343,"connect":0,"read":2,'
             '"write":0,"status":7,"timeout":1,"p50_us":817,"p90_us":39629,"p99_us":1200000,'
             '"max_us":1080000,"mean_us":22433.4}')


def test_text_report_units_and_errors():
    r = parse(TEXT)
    assert r["requests"] == 2171 and r["rps"] == 721.56 and r["duration_s"] == 3.01
    assert r["p50_ms"] == 0.817 and r["p90_ms"] == 39.63 and r["p99_ms"] == 1200.0
    assert r["max_ms"] == 1080.0
    assert (r["status_errors"], r["socket_errors"], r["errors"]) == (7, 3, 10)


def test_json_summary_line_wins_over_text():
    r = parse(TEXT + JSON_LINE + "\n")
    assert r["p50_ms"] == 0.817 and r["p99_ms"] == 1200.0
    assert r["rps"] == round(2171 / 3.008766, 1)
    assert r["errors"] == 10 and r["socket_errors"] == 3


def test_clean_run_has_no_errors():
    clean = "\n".join(line for line in TEXT.splitlines()
                      if "Socket errors" not in line and "Non-2xx" not in line)
    assert parse(clean)["errors"] == 0


def test_garbage_is_refused():
    with pytest.raises(ValueError):
        parse("unable to connect to 127.0.0.1:1 Connection refused")
