"""The benchmark scenarios, in the order they run. A scenario whose route is not in this
build's ``/openapi.json`` (or whose peer is not installed) is reported as not available."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from bench import peers, profile, report, seed, setup

MODULE_BODY = json.dumps({"action": "echo", "text": "hello bench", "n": 3}).encode()
CHAT_BODY_TMPL = {"messages": [{"role": "user", "content": "Say hello in five words."}],
                  "max_tokens": 16}
PEER_WARMUP = 5  # seconds: the peers (JIT, lazy imports) need longer to reach steady state
GRANT_CENTS = 1_000_000  # $10,000 per account through the ledger: more than any run spends
# Keys of the first account that the usage reads and `metered-1acct` rotate over. The plan's
# rate limit is the account's (all its keys together), so the rotation does not lift it; it
# only spreads the key cache's work. That account is on the bench's own plan
# (`passthrough.BENCH_PLAN`: 10,000 requests a second, enterprise's 1,000 times ten).
READ_KEYS = 4
# Accounts the metered and chat load is spread over (round-robin per request): production
# traffic comes from many accounts; `metered-1acct` measures one account alone.
N_ACCOUNTS = int(os.environ.get("BENCH_ACCOUNTS", "16"))  # $100,000 through the ledger: far more than any run spends


class Unavailable(Exception):
    pass


@dataclass
class Context:
    bench: object
    env: dict
    ports: dict
    work: Path
    upstream: str
    gateway: str
    paths: dict
    log: object
    accounts: list | None = None

    def ensure_accounts(self) -> list[dict]:
        """BENCH_ACCOUNTS accounts (enterprise plan: the highest per-key rate limit), each
        with a live key, funded through the ledger (operator grant)."""
        if self.accounts is None:
            out = subprocess.run([str(setup.BIN / "python"), "-m", "bench.fixtures",
                                  str(N_ACCOUNTS), str(GRANT_CENTS), str(READ_KEYS)], env=self.env,
                                 cwd=setup.ROOT, capture_output=True, text=True, timeout=600)
            if out.returncode:
                raise RuntimeError(f"bench fixtures failed: {out.stderr[-2000:]}")
            self.accounts = json.loads(out.stdout.strip().splitlines()[-1])
        return self.accounts

    @property
    def account_id(self) -> str:
        return self.ensure_accounts()[0]["account_id"]

    def ensure_account(self) -> str:
        """The first bench account's key (single-account scenarios)."""
        return self.ensure_accounts()[0]["key"]

    def all_keys(self) -> list[str]:
        return [a["key"] for a in self.ensure_accounts()]

    def read_keys(self) -> list[str]:
        """The first account's keys, for the usage reads (``Usage``)."""
        first = self.ensure_accounts()[0]
        return first.get("read_keys") or [first["key"]]


def _has(ctx: Context, path: str, method: str = "post") -> bool:
    return method in ctx.paths.get(path, {})


def _require(ctx: Context, path: str, missing: str) -> None:
    """A scenario's first step: ``Unavailable(missing)`` unless this build serves POST ``path``."""
    if not _has(ctx, path):
        raise Unavailable(missing)


def _measure(ctx: Context, name: str, spec: dict, start=None, **extra) -> dict | None:
    """``ctx.bench.measure(name, **spec, **extra)``; when measured, ``spec`` (the request:
    url, headers, body, ...) is kept for the ratio rounds (``RatioRounds``), with ``start``,
    the peer's start function (a peer is stopped after its scenario and started again for
    the rounds)."""
    rows = ctx.bench.measure(name, **spec, **extra)
    if rows is not None:
        ctx.bench.round_specs[name] = (start, spec)
    return rows


class Scenario:
    name = ""

    def run(self, ctx: Context) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class Direct(Scenario):
    name = "direct"

    def run(self, ctx):
        ctx.bench.measure("direct", f"{ctx.upstream}/module/bench", body=MODULE_BODY,
                          server_pid=ctx.bench.nginx.pid,
                          note="fake upstream (nginx `return`) called directly: the latency floor")


class NginxProxy(Scenario):
    name = "nginx"

    def run(self, ctx):
        ctx.bench.measure("nginx", f"http://127.0.0.1:{ctx.ports['proxy']}/module/bench",
                          body=MODULE_BODY, server_pid=ctx.bench.nginx.pid,
                          note="nginx proxy_pass (keepalive) to the same upstream (CPU: proxy + upstream)")


class Passthrough(Scenario):
    name = "passthrough"

    def run(self, ctx):
        _require(ctx, "/bench/passthrough", "/bench/passthrough not registered")
        _measure(ctx, "passthrough", {"url": f"{ctx.gateway}/bench/passthrough", "body": MODULE_BODY},
                 note="bare Flask route in the same gunicorn, no auth/metering/receipts")


class Metered(Scenario):
    name = "metered"

    def run(self, ctx):
        _require(ctx, "/v1/module/{slug}/call", "POST /v1/module/{slug}/call is not in this build")
        seed.load_bench_module(ctx)
        keys = ctx.all_keys()
        url = f"{ctx.gateway}/v1/module/{seed.MODULE_SLUG}/call"
        headers = {"Authorization": f"Bearer {keys[0]}"}

        def check(body: bytes) -> bool:
            doc = json.loads(body)
            return bool(doc.get("receipt", {}).get("sig")) and doc.get("ok") is True

        top = [max(ctx.bench.concurrency)]
        spec = {"url": url, "headers": headers, "body": MODULE_BODY, "idempotency": True,
                "check": check, "auth_keys": keys}
        rows = _measure(ctx, "metered", spec,
                        note=f"real keys of {len(keys)} accounts (round-robin), ledger debit, unique "
                             "Idempotency-Key, receipt, PostgreSQL")
        if rows is None:
            return
        ctx.bench.memory_snapshot("after_load_run_1")
        # the same load once more: worker memory must not grow between repeated runs
        ctx.bench.measure("metered-repeat", **spec, concurrencies=top,
                          note="second identical run (memory growth check)")
        ctx.bench.memory_snapshot("after_load_run_2")
        # one account taking all the load: every call updates the same balance row (over
        # the account's READ_KEYS keys; its plan, BENCH_PLAN, allows 10,000 requests a
        # second: enterprise's 1,000 were reached here on a fast host)
        ctx.bench.measure("metered-1acct", **dict(spec, auth_keys=ctx.read_keys()), concurrencies=top,
                          note=f"one account ({len(ctx.read_keys())} keys, round-robin): all calls "
                               "contend for one balance row")
        if ctx.bench.profile_enabled():
            ctx.bench.results["profiles"]["metered"] = profile.record(
                ctx, "metered", url, headers, MODULE_BODY, idempotency=True, auth_keys=keys)


def money_checks(ctx: Context) -> dict:
    """``flask ledger check`` and ``flask money reconcile`` on the bench database (run
    after every scenario): {check: {exit_code, clean, output}}."""
    results = {}
    for check in (("ledger", "check"), ("money", "reconcile")):
        out = subprocess.run([str(setup.BIN / "flask"), *check], env=ctx.env,
                             cwd=setup.ROOT, capture_output=True, text=True, timeout=600)
        name = " ".join(check)
        results[name] = {"exit_code": out.returncode, "clean": out.returncode == 0,
                         "output": (out.stdout + out.stderr).strip()[-2000:]}
        ctx.log(f"flask {name}: exit {out.returncode} {results[name]['output'][:200]}")
    return results


class Chat(Scenario):
    name = "chat"

    def run(self, ctx):
        _require(ctx, "/v1/chat/completions", "POST /v1/chat/completions is not in this build")
        model = seed.load_bench_chat_model(ctx)
        keys = ctx.all_keys()
        body = json.dumps({"model": model, **CHAT_BODY_TMPL}).encode()
        headers = {"Authorization": f"Bearer {keys[0]}", **seed.chat_headers(ctx)}

        def check(resp: bytes) -> bool:
            doc = json.loads(resp)
            return bool(doc.get("choices")) and "cost_usd" in doc.get("usage", {})

        url = f"{ctx.gateway}/v1/chat/completions"
        rows = _measure(ctx, "chat", {"url": url, "headers": headers, "body": body, "check": check,
                                      "auth_keys": keys},
                        note=f"our chat host: keys of {len(keys)} accounts (round-robin), "
                             "routing, metering (ledger hold + settle), usage record")
        if rows is not None and ctx.bench.profile_enabled():
            ctx.bench.results["profiles"]["chat"] = profile.record(ctx, "chat", url, headers, body,
                                                                   auth_keys=keys)


def _measure_peer(ctx: Context, name: str, start, headers: dict, note: str) -> None:
    """A peer gateway started (``start(ctx)``: its base URL), measured on the chat
    completion of the same upstream, then stopped."""
    base = start(ctx)
    body = json.dumps({"model": peers.PEER_MODEL, **CHAT_BODY_TMPL}).encode()
    _measure(ctx, name, {"url": f"{base}/v1/chat/completions", "headers": headers, "body": body,
                         "check": lambda r: bool(json.loads(r).get("choices")), "warmup": PEER_WARMUP},
             start, server_pid=peers.pid(name), note=note)
    peers.stop(ctx, name)


class LiteLLM(Scenario):
    name = "litellm"

    def run(self, ctx):
        _measure_peer(ctx, "litellm", peers.start_litellm, {"Authorization": f"Bearer {peers.LITELLM_MASTER_KEY}"},
                      "LiteLLM proxy (no database, master key), same upstream, same worker count")


class Portkey(Scenario):
    name = "portkey"

    def run(self, ctx):
        _measure_peer(ctx, "portkey", peers.start_portkey,
                      {"Authorization": "Bearer sk-bench", "x-portkey-provider": "openai",
                       "x-portkey-custom-host": f"{ctx.upstream}/v1"},
                      "Portkey gateway (node, one process), same upstream")


class Usage(Scenario):
    name = "usage"

    # the account-scoped reads issue 18 bounds (p99 <= 20 ms at c=1 with 10M calls recorded):
    # path -> (scenario name, query); the export reads the last seeded hour (about 110 of
    # the bench account's calls: a per-call read, not a bulk download)
    READS = {"/api/usage/current": ("usage-current", ""),
             "/api/usage/by-module": ("usage-by-module", ""),
             "/api/usage/daily": ("usage-daily", "?days=30"),
             "/api/usage/export": ("usage-export", "?from={start}&to={end}&format=csv")}

    def run(self, ctx):
        wanted = [p for p in self.READS if _has(ctx, p, "get")]
        if not wanted:
            raise Unavailable("the usage endpoints are not in this build")
        key = ctx.ensure_account()
        info = seed.seed_scale(ctx)
        info["tail_calls"] = seed.tail_calls(ctx)
        ctx.bench.results["checks"]["scale_seed"] = info
        end = datetime.fromisoformat(info["end"].replace("Z", "+00:00"))  # where the seeded calls end
        window = {"start": f"{end - timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}", "end": f"{end:%Y-%m-%dT%H:%M:%SZ}"}
        # c=1 only (the targets' concurrency): the reads are one account's, and at c=16 a fast
        # host reads faster than that account's plan allows (872 req/s on average with
        # seconds above 1,000 in the 07:08Z run of 2026-11-28: 104 answers 429, which is the
        # rate limiter doing its job, not the read)
        low = [min(ctx.bench.concurrency)]
        for path in wanted:
            name, query = self.READS[path]
            ctx.bench.measure(name, f"{ctx.gateway}{path}{query.format(**window)}", method="GET",
                              headers={"Authorization": f"Bearer {key}"}, auth_keys=ctx.read_keys(),
                              concurrencies=low,
                              note=f"{info['calls']:,} recorded calls ({info['method']}), c={low[0]} only")


class Track(Scenario):
    name = "track"

    def run(self, ctx):
        _require(ctx, "/api/track", "POST /api/track is not in this build")
        body = json.dumps({"event": "page_view", "session_id": "bench-session",
                           "props": {"path": "/pricing"}}).encode()
        ctx.bench.measure("track", f"{ctx.gateway}/api/track", body=body,
                          note="public analytics ingestion (204)")


ALERTS_TIMEOUT = 300


class Alerts(Scenario):
    """Alert evaluation passes, measured by the alerts feature's own ``bench/alerts_eval.py``
    (10,000 rules over 10,000,000 calls of rollups, then twice the rules, a tenth of the calls),
    in its own schema of the bench database."""

    name = "alerts"

    def run(self, ctx):
        script = setup.ROOT / "bench" / "alerts_eval.py"
        if not script.exists():
            raise Unavailable("alert evaluation is not in this build (bench/alerts_eval.py missing)")
        # a database of its own: the script is meant to stay in its own schema, but with the
        # production engine options its search_path is not applied and it rewrites the
        # public tables (accounts, keys, rollups) of whatever database it is given
        db_name = f"{setup.DB_NAME}_alerts"
        setup.psql(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")
        setup.psql(f"CREATE DATABASE {db_name}")
        env = dict(ctx.env, BENCH_DATABASE_URL=f"{setup.PG}/{db_name}", DATABASE_URL=f"{setup.PG}/{db_name}")
        try:
            out = subprocess.run([str(setup.BIN / "python"), str(script), "--json"], env=env,
                                 cwd=setup.ROOT, capture_output=True, text=True,
                                 timeout=ALERTS_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"bench/alerts_eval.py did not finish within {ALERTS_TIMEOUT} s")
        finally:
            setup.psql(f"DROP DATABASE IF EXISTS {db_name} WITH (FORCE)")
        if out.returncode:
            raise Unavailable(f"bench/alerts_eval.py failed: {out.stderr.strip()[-300:]}")
        doc = json.loads(out.stdout.strip().splitlines()[-1])
        ctx.bench.results["alerts"] = doc["results"]
        for r in doc["results"]:
            ctx.log(f"alerts: {r['rules']:,} rules, {r['calls']:,} calls: cold pass "
                    f"{r['cold']['seconds']:.3f} s ({r['cold']['fired']} fired), steady pass "
                    f"{r['steady']['seconds']:.3f} s")


class RoundTrips(Scenario):
    """SQL statements, commits, Redis commands and upstream requests of one warm request of
    every gateway scenario measured above (``bench/roundtrips.py``)."""

    name = "roundtrips"

    def run(self, ctx):
        specs = ctx.bench.request_specs
        if not specs:
            raise Unavailable("no gateway scenario was measured")
        out = subprocess.run([str(setup.BIN / "python"), "-m", "bench.roundtrips", json.dumps(specs)],
                             env=ctx.env, cwd=setup.ROOT, capture_output=True, text=True, timeout=300)
        if out.returncode:
            raise Unavailable(f"bench/roundtrips.py failed: {out.stderr.strip()[-300:]}")
        counts = json.loads(out.stdout.strip().splitlines()[-1])
        ctx.bench.results["roundtrips"] = counts
        for name, c in counts.items():
            ctx.log(f"round trips {name}: {c}")


class RatioRounds(Scenario):
    """The throughput-ratio targets' measurements (``report.ROUND_RATIOS``), interleaved: in
    each of BENCH_RATIO_ROUNDS rounds passthrough, metered, portkey, chat and litellm (those
    measured above) run once each at the top concurrency for BENCH_RATIO_DURATION seconds,
    the order reversed every other round, so each round's ratios compare runs seconds apart
    (the shared machine's speed swings up to 2x between minutes) and no scenario always
    follows the same one. The peers are started again for the rounds and stopped after.
    The first round warms every scenario up again (its own warm-up: the stack sat through
    the usage reads and the alert pass, and a restarted peer is cold); later rounds follow
    each other directly. Rows in ``results["ratio_rounds"]``, not in the scenario table."""

    name = "rounds"
    ORDER = report.ROUND_SCENARIOS

    def run(self, ctx):
        bench = ctx.bench
        specs = {n: bench.round_specs[n] for n in self.ORDER if n in bench.round_specs}
        if bench.ratio_rounds <= 0:
            raise Unavailable("BENCH_RATIO_ROUNDS=0")
        if len(specs) < 2:
            raise Unavailable("fewer than two of " + ", ".join(self.ORDER) + " were measured")
        top = max(bench.concurrency)
        pids = {}
        for name, (start, _spec) in specs.items():
            if start is not None:
                try:
                    start(ctx)
                except Unavailable as exc:
                    ctx.log(f"rounds: {name} did not start again ({exc})")
                    continue
                pids[name] = peers.pid(name)
        live = [n for n in specs if specs[n][0] is None or n in pids]
        rounds = []
        try:
            for i in range(bench.ratio_rounds):
                order = live if i % 2 == 0 else live[::-1]
                rows = {}
                for name in order:
                    spec = dict(specs[name][1], warmup=specs[name][1].get("warmup") if i == 0 else 0)
                    got = bench.measure(f"{name}-round{i + 1}", **spec, concurrencies=[top],
                                        server_pid=pids.get(name), duration=bench.ratio_duration,
                                        record=False)
                    if got is not None:
                        rows[name] = got[str(top)]
                rounds.append({"order": list(order), "rows": rows})
        finally:
            for name in pids:
                peers.stop(ctx, name)
        bench.results["ratio_rounds"] = {"concurrency": top, "duration_s": bench.ratio_duration,
                                         "rounds": rounds}


ALL = [Direct(), NginxProxy(), Passthrough(), Metered(), Chat(), LiteLLM(), Portkey(), Usage(),
       Track(), RoundTrips(), Alerts(), RatioRounds()]
