"""Parse wrk's output: the ``WRK_JSON`` line printed by ``bench/lua/report.lua`` (exact
numbers), falling back to wrk's own text report (``--latency``) when that line is missing."""
from __future__ import annotations

import json
import re

_UNITS_US = {"us": 1.0, "ms": 1_000.0, "s": 1_000_000.0, "m": 60_000_000.0}


def _to_ms(value: str, unit: str) -> float:
    return float(value) * _UNITS_US[unit] / 1000.0


def parse(output: str) -> dict:
    """Return ``{requests, rps, p50_ms, p90_ms, p99_ms, max_ms, errors, socket_errors,
    status_errors, duration_s}`` from wrk's stdout. Raises ValueError if unparseable."""
    for line in output.splitlines():
        if line.startswith("WRK_JSON "):
            d = json.loads(line[len("WRK_JSON "):])
            duration_s = d["duration_us"] / 1e6
            socket_errors = d["connect"] + d["read"] + d["write"] + d["timeout"]
            return {
                "requests": d["requests"],
                "duration_s": round(duration_s, 3),
                "rps": round(d["requests"] / duration_s, 1) if duration_s else 0.0,
                "p50_ms": round(d["p50_us"] / 1000, 3),
                "p90_ms": round(d["p90_us"] / 1000, 3),
                "p99_ms": round(d["p99_us"] / 1000, 3),
                "max_ms": round(d["max_us"] / 1000, 3),
                "status_errors": d["status"],
                "socket_errors": socket_errors,
                "errors": d["status"] + socket_errors,
            }
    return _parse_text(output)


def _parse_text(output: str) -> dict:
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", output)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if not m or not rps:
        raise ValueError("not a wrk report")
    pct = {p: _to_ms(v, u) for p, v, u in
           re.findall(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s|m)\s*$", output, re.M)}
    if "50" not in pct or "99" not in pct:
        raise ValueError("wrk report without --latency percentiles")
    socket_errors = 0
    se = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    if se:
        socket_errors = sum(int(x) for x in se.groups())
    status = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    status_errors = int(status.group(1)) if status else 0
    mx = re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s|m)", output)
    return {
        "requests": int(m.group(1)),
        "duration_s": round(_to_ms(m.group(2), m.group(3)) / 1000, 3),
        "rps": float(rps.group(1)),
        "p50_ms": round(pct["50"], 3),
        "p90_ms": round(pct.get("90", 0.0), 3),
        "p99_ms": round(pct["99"], 3),
        "max_ms": round(_to_ms(*mx.groups()), 3) if mx else None,
        "status_errors": status_errors,
        "socket_errors": socket_errors,
        "errors": status_errors + socket_errors,
    }
