"""``make bench``: the load benchmark of the gateway against its limits and its peers.

Starts everything on loopback by itself — a fresh PostgreSQL database on the local
server, a Redis DB, a fast fake upstream (nginx answering fixed JSON), gunicorn with the
production config (``deploy/gunicorn.conf.py``, ``APP_ENV=production``, secrets generated
for this run), LiteLLM's proxy and Portkey's gateway as peers — drives them with wrk,
and writes its report only under ``bench/results/`` (``latest.{json,md}`` and the run's own
``run-<time>.{json,md}``; see ``bench.report.write``). Everything it
started is stopped at the end (also on errors and Ctrl-C). Only loopback is contacted.

Settings (environment): BENCH_DURATION (seconds per measurement, default 10),
BENCH_WARMUP (default 2), BENCH_CONCURRENCY (default "1,16"), BENCH_ONLY (comma list of
scenarios), BENCH_SCALE_CALLS (default 10000000), BENCH_DATABASE (default gw_bench),
BENCH_PG (default postgresql://postgres@127.0.0.1:5432), BENCH_REDIS_URL
(default redis://127.0.0.1:6379/6), BENCH_PROFILE (1: py-spy the metered/chat paths),
BENCH_APP_ENV ("K=V K=V": extra app environment for what-if runs; such a run writes
partial.* like a BENCH_ONLY run), BENCH_JOBS (0: do not start the worker and scheduler,
a what-if run that also writes partial.*), BENCH_RATIO_ROUNDS (default 5; 0: none) and
BENCH_RATIO_DURATION (seconds, default 5): the interleaved ratio rounds at the top
concurrency that the throughput-ratio targets are judged on (``scenarios.RatioRounds``).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procstat, report, scenarios, setup  # noqa: E402
from bench.wrkparse import parse  # noqa: E402
from tests.support import procs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
WORK = BENCH / ".work" / "run"
LUA_REPORT = BENCH / "lua" / "report.lua"

DURATION = int(os.environ.get("BENCH_DURATION", "10"))
WARMUP = int(os.environ.get("BENCH_WARMUP", "2"))
CONCURRENCY = [int(c) for c in os.environ.get("BENCH_CONCURRENCY", "1,16").split(",")]
ONLY = {s for s in os.environ.get("BENCH_ONLY", "").split(",") if s}
JOBS = os.environ.get("BENCH_JOBS", "1") != "0"
PROFILE = os.environ.get("BENCH_PROFILE", "1") == "1"
RATIO_ROUNDS = int(os.environ.get("BENCH_RATIO_ROUNDS", "5"))
RATIO_DURATION = int(os.environ.get("BENCH_RATIO_DURATION", "5"))


def log(msg: str) -> None:
    print(f"[bench {datetime.now(timezone.utc):%H:%M:%S}] {msg}", flush=True)


# --- wrk ------------------------------------------------------------------------------

def _lua_str(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid Lua string literal here


def wrk_script(method: str, headers: dict, body: bytes | None, idempotency: bool,
               auth_keys: list[str] | None = None) -> Path:
    """Generate the wrk Lua script for one measurement: a unique Idempotency-Key per request
    when ``idempotency``; ``Authorization`` rotating over ``auth_keys`` (round-robin per
    request) when given; ``bench/lua/report.lua`` appended for the summary line."""
    run_id = uuid.uuid4().hex[:12]
    lines = [f"wrk.method = {_lua_str(method)}"]
    if body is not None:
        lines.append(f"wrk.body = {_lua_str(body.decode())}")
    for k, v in headers.items():
        lines.append(f"wrk.headers[{_lua_str(k)}] = {_lua_str(v)}")
    if idempotency or auth_keys:
        lines += [
            "local thread_no = 0",
            "function setup(thread) thread_no = thread_no + 1; thread:set('tid', thread_no) end",
            "local counter = 0",
            f"local run_id = {_lua_str(run_id)}",
            "local auth = {" + ", ".join(_lua_str("Bearer " + k) for k in (auth_keys or [])) + "}",
            "function request()",
            "  counter = counter + 1",
        ]
        if idempotency:
            lines.append("  wrk.headers['Idempotency-Key'] = run_id .. '-' .. tostring(tid) .. '-' .. counter")
        if auth_keys:
            lines.append("  wrk.headers['Authorization'] = auth[(counter % #auth) + 1]")
        lines += ["  return wrk.format()", "end"]
    lines.append(LUA_REPORT.read_text())
    path = WORK / f"wrk-{run_id}.lua"
    path.write_text("\n".join(lines))
    return path


def run_wrk(url: str, script: Path, connections: int, duration: int) -> tuple[dict, str]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "10s", "--latency",
           "-s", str(script), url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    text = out.stdout + out.stderr
    return parse(text), text


# --- the run -----------------------------------------------------------------------------

class Bench:
    def __init__(self):
        self.results: dict = {"scenarios": {}, "unavailable": {}, "memory": {}, "profiles": {},
                              "checks": {}}
        self.env = None
        self.ports: dict[str, int] = {}
        self.gunicorn = None
        self.concurrency = CONCURRENCY
        self.request_specs: list[dict] = []
        # name -> (peer start function or None, measure() keyword arguments): what the
        # ratio rounds measure again (scenarios.RatioRounds)
        self.round_specs: dict[str, tuple] = {}
        self.ratio_rounds, self.ratio_duration = RATIO_ROUNDS, RATIO_DURATION

    def profile_enabled(self) -> bool:
        return PROFILE

    def wanted(self, name: str) -> bool:
        return not ONLY or name in ONLY or name.split("-")[0] in ONLY or name in ("roundtrips", "rounds")

    def measure(self, name: str, url: str, *, method: str = "POST", headers: dict | None = None,
                body: bytes | None = None, idempotency: bool = False, check=None,
                concurrencies=None, label: str | None = None, note: str = "",
                warmup: int | None = None, auth_keys: list[str] | None = None,
                server_pid: int | None = None, duration: int | None = None,
                record: bool = True) -> dict | None:
        """Warm up, then one wrk run per concurrency (``duration`` seconds each, default
        BENCH_DURATION); returns the rows and, when ``record``, stores them as scenario
        ``name`` (the ratio rounds do not: ``scenarios.RatioRounds`` keeps its own)."""
        headers = dict(headers or {})
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
        if idempotency:
            headers["Idempotency-Key"] = "probe-" + uuid.uuid4().hex
        status, resp = procs.http(url, method=method, body=body, headers=headers)
        headers.pop("Idempotency-Key", None)
        if not (200 <= status < 300) or (check and not check(resp)):
            if record:
                self.results["unavailable"][name] = f"probe answered {status}: {resp[:300]!r}"
            log(f"{name}: probe failed ({status}) {resp[:200]!r}")
            return None
        rows = {}
        warmup = WARMUP if warmup is None else warmup
        if warmup:
            run_wrk(url, wrk_script(method, headers, body, idempotency, auth_keys), max(CONCURRENCY), warmup)
        gw = f"http://127.0.0.1:{self.ports['gunicorn']}"
        if server_pid is None and url.startswith(gw):
            server_pid = self.gunicorn.pid
        for c in concurrencies or CONCURRENCY:
            # CPU time per request of the server's processes and of the PostgreSQL backends
            # of the bench database: a figure the machine's other load barely moves
            pids = procs.descendants(server_pid) if server_pid else []
            pg = setup.pg_backend_pids()
            cpu0, pg0 = procstat.cpu_seconds(pids), procstat.cpu_seconds(pg)
            stats, text = run_wrk(url, wrk_script(method, headers, body, idempotency, auth_keys), c,
                                  duration or DURATION)
            if pids and stats["requests"]:
                # processes (or connections) that appeared during the run count in full
                new = set(procs.descendants(server_pid)) - set(pids)
                used = procstat.cpu_seconds(pids) - cpu0 + procstat.cpu_seconds(list(new))
                stats["server_cpu_ms_per_req"] = round(max(0.0, 1000 * used / stats["requests"]), 3)
            if url.startswith(gw) and stats["requests"]:
                new = set(setup.pg_backend_pids()) - set(pg)
                used = procstat.cpu_seconds(pg) - pg0 + procstat.cpu_seconds(list(new))
                # (a connection closed during the run takes its CPU time with it: never < 0)
                stats["pg_cpu_ms_per_req"] = round(max(0.0, 1000 * used / stats["requests"]), 3)
            (WORK / f"wrk-{name}-c{c}.txt").write_text(text)
            rows[str(c)] = stats
            cpu = (f"  cpu/req {stats['server_cpu_ms_per_req']:.2f} ms" if "server_cpu_ms_per_req" in stats else "") + \
                (f" + pg {stats['pg_cpu_ms_per_req']:.2f} ms" if "pg_cpu_ms_per_req" in stats else "")
            log(f"{name:<18} c={c:<3} {stats['rps']:>9.1f} req/s  p50 {stats['p50_ms']:.2f} ms  "
                f"p99 {stats['p99_ms']:.2f} ms  errors {stats['errors']}{cpu}")
        if not record:
            return rows
        if url.startswith(gw) and not name.endswith(("-repeat", "-1acct")):
            self.request_specs.append({"name": name, "method": method, "path": url[len(gw):],
                                       "headers": headers, "idempotency": idempotency,
                                       "body": body.decode() if body is not None else None})
        self.results["scenarios"][name] = {"label": label or name, "url_path": "/" + url.split("/", 3)[-1],
                                           "note": note, "accounts": len(auth_keys) if auth_keys else None,
                                           "by_concurrency": rows}
        return rows

    # -- lifecycle --------------------------------------------------------------------
    def start(self):
        WORK.mkdir(parents=True, exist_ok=True)
        for p in WORK.glob("*"):
            if p.is_file():
                p.unlink()
        setup.check_tools()
        for name in ("upstream", "proxy", "gunicorn", "litellm", "portkey"):
            self.ports[name] = procs.free_port()
        self.env = setup.app_env(self.ports, WORK)
        log(f"database {setup.DB_NAME}: recreate and migrate")
        setup.recreate_database(self.env, WORK)
        log("nginx: fake upstream + proxy")
        self.nginx = setup.start_nginx(self.ports, WORK)
        log("gunicorn: production config")
        self.gunicorn = setup.start_gunicorn(self.env, self.ports, WORK)
        self.results["jobs"] = JOBS
        if JOBS:
            log("flask worker + scheduler: the periodic jobs")
            setup.start_jobs(self.env, WORK)
        self.paths = setup.openapi_paths(self.ports)

    def memory_snapshot(self, label: str) -> None:
        workers = procs.children(self.gunicorn.pid)
        self.results["memory"][label] = {str(i): procstat.rss_kib(pid) for i, pid in enumerate(workers)}
        log(f"RSS {label}: " + ", ".join(f"{(v or 0) / 1024:.1f} MiB"
                                          for v in self.results["memory"][label].values()))

    def run(self):
        self.start()
        self.results["loadavg_start"] = setup.loadavg()
        started = time.monotonic()
        up = f"http://127.0.0.1:{self.ports['upstream']}"
        gw = f"http://127.0.0.1:{self.ports['gunicorn']}"
        self.memory_snapshot("idle")
        ctx = scenarios.Context(bench=self, env=self.env, ports=self.ports, work=WORK,
                                upstream=up, gateway=gw, paths=self.paths, log=log)
        for sc in scenarios.ALL:
            if not self.wanted(sc.name):
                continue
            try:
                sc.run(ctx)
            except scenarios.Unavailable as exc:
                self.results["unavailable"][sc.name] = str(exc)
                log(f"{sc.name}: not available ({exc})")
                continue
            # issue 18: the books are clean after every scenario
            self.results["checks"].setdefault("after_scenario", {})[sc.name] = scenarios.money_checks(ctx)
        self.results["elapsed_s"] = round(time.monotonic() - started, 1)

    def finish(self):
        meta = setup.metadata(self.env, self.gunicorn, DURATION, WARMUP, CONCURRENCY)
        self.results.update(meta)
        self.results["targets"] = report.targets(self.results)
        partial = bool(ONLY or os.environ.get("BENCH_APP_ENV") or not JOBS)
        self.results["only"] = sorted(ONLY) or None
        self.results["app_env_overrides"] = os.environ.get("BENCH_APP_ENV") or None
        for path in report.write(self.results, partial=partial):
            log(f"wrote {path.relative_to(ROOT)}")
        print(report.markdown(self.results))


def main() -> int:
    bench = Bench()

    def _sig(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sig)
    try:
        bench.run()
        bench.finish()
        return 0
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        log("stopping everything this run started")
        setup.RUNNING.stop_all()
        setup.drop_cached_state()


if __name__ == "__main__":
    sys.exit(main())
