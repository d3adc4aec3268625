"""Money under fault: many concurrent metered calls while the system is broken on purpose.

Faults (each can be switched off):
  * ``kill``     – ``kill -9`` of a random gunicorn worker, repeatedly;
  * ``upstream`` – the provider hangs past the action timeout, then resets connections;
  * ``redis``    – Redis is shut down for a few seconds, then started again;
  * ``postgres`` – PostgreSQL is restarted (``pg_ctlcluster … restart``);
  * ``x402hang`` / ``x402kill`` – x402 payers' facilitator settles and then hangs, or the
    workers die between settlement and booking (``tests/fault/x402_faults.py``);
  * ``finalizekill`` – the deferred finalize's window, on purpose: ``gw_finalize_calls``
    is made 0.5 s slower (same function, a ``pg_sleep`` first), then every worker is
    ``kill -9``-ed while answered calls wait in their writer's queue; the check requires
    that this hit at least one answered call, and that it cost the customer nothing; a
    window with no answered call in flight is opened again (up to ``FINALIZE_WINDOWS``)
    while the clients keep calling, rather than failing or passing blindly;
  * ``topuprace`` – an account with auto top-up is taken under its threshold by 16
    concurrent calls while two extra workers run its top-up runs: exactly one top-up
    (``tests/fault/topup_faults.py``);
  * ``payoutkill`` – the module's owner is paid out its earnings after the run, and the
    payout worker is ``kill -9``-ed between the processor's transfer and the booking; the
    recovery books it once (``tests/fault/payout_faults.py``);
  * ``webhookreplay`` – a checkout's ``checkout.session.completed`` and an off-session
    charge's ``payment_intent.succeeded`` (signed as the sandbox / Stripe sign), each first
    cut off by a ``kill -9`` of every worker during its booking, then delivered 24 times at
    once from 8 clients across the workers: one credit each (``tests/fault/webhook_faults.py``);
  * ``usdcpayout`` – a USDC payout through the chain stand-in while the node is down, the
    transaction reverts, and the payout worker is ``kill -9``-ed between the chain's send
    and the booking: paid once, or owed and retried (``tests/fault/usdc_payout_faults.py``).

Clients send calls with an Idempotency-Key each; an unknown outcome (connection error,
5xx from a dying worker, 409 in flight) is retried with the *same* key until it is
definitive. Afterwards (once the pending-call sweep has run) the driver checks:
  1. ``flask ledger check`` and ``flask money reconcile`` are clean;
  2. every 200 has exactly one charge (``call:<id>`` posting, no refund) and a receipt
     that verifies with the published key — or, with the deferred finalize
     (``CALL_FINALIZE_DEFERRED``, on here as in production), a 200 whose worker was killed
     before its finalize was written: that call is ``refunded`` (one charge, one refund),
     the customer keeps the answer and pays nothing; counted as ``answered_then_refunded``;
  3. every Idempotency-Key was charged at most once, and exactly once when it ended 200;
  4. no call is left pending; every charged call has a receipt or a refund;
  5. the balance moved by exactly the sum of the successful calls' prices;
  6. with x402 payers: every USDC authorization that moved on chain is booked exactly once
     (as the call's charge or as balance), nothing else is, none is left reserved;
  7. with ``payoutkill``: one transfer at the processor, one paid payout, one posting;
     with ``topuprace``: one top-up payment and the balance right; with ``webhookreplay``:
     each event stored once, each payment credited once; with ``usdcpayout``: one
     succeeded transaction to the owner, one paid payout, one posting, nothing owed.

    python -m tests.fault.money_under_fault [--seconds 20] [--clients 8] [--x402-clients 2]
        [--faults kill,upstream,redis,postgres,x402hang,x402kill,finalizekill,topuprace,payoutkill,webhookreplay,usdcpayout]
        [--redis-url redis://127.0.0.1:6379/N]

Needs PostgreSQL and Redis on 127.0.0.1 (``make fault`` sets them). Prints a JSON summary
and exits 1 when an invariant is broken. ``tests/e2e/test_fault.py`` runs a short version.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.apps import VENV_BIN, gunicorn_proc  # noqa: E402
from tests.support.finalize import finalize_function  # noqa: E402
from tests.support.procs import Processes  # noqa: E402
from tests.support.standin import StandIn  # noqa: E402
from tests.fault import (payout_faults, topup_faults, usdc_payout_faults, webhook_faults,  # noqa: E402
                         x402_faults)

PRICE_CENTS = 3


def upstream() -> StandIn:
    """The provider: echoes the body; the injector makes it hang past the action timeout
    (``delay``) or reset connections."""
    return StandIn({("POST", "*"): lambda req: (200, {"echo": req.json() or {}, "n": random.random()})})


UPSTREAM_FAULTS = {"hang": ("delay", 3.0), "reset": ("reset", 0.0)}
KILL_WAIT = 5.0  # seconds finalizekill waits for an answered call whose finalization is queued
FINALIZE_WINDOWS = 8  # finalizekill windows tried before the run reports the fault untested


def sh(*cmd, check=True, env=None, quiet=True):
    return subprocess.run(cmd, check=check, env=env, cwd=ROOT, capture_output=quiet, text=True)


def flask(env, *args) -> str:
    return sh(str(VENV_BIN / "flask"), "--app", "wsgi", *args, env=env).stdout


def pg_cluster() -> tuple[str, str]:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    return version, "main"


class Driver:
    def __init__(self, args, upstream: StandIn, rails: x402_faults.X402Rails | None = None):
        self.args, self.upstream, self.rails = args, upstream, rails
        self.x402_accounts: list[str] = []
        self.x402_summary: dict = {}
        self.procs = Processes()
        self.results: dict[str, dict] = {}  # idempotency key -> final outcome
        self.lock = threading.Lock()
        self.events: list[str] = []
        self.stop = threading.Event()
        self.faults_done = threading.Event()  # every planned fault applied (windows retried)
        self.windows_tried = 0  # finalizekill windows opened until one hit an answered call
        self.retries = 0
        self.retry_reasons: Counter = Counter()  # what each retry saw: status or exception

    # ---------------------------------------------------------------- set-up
    def setup(self, upstream_url: str):
        work = tempfile.mkdtemp(prefix="gw-fault-")
        db = f"gw_fault_{os.getpid()}"
        sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", f"DROP DATABASE IF EXISTS {db}", "postgres")
        sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", f"CREATE DATABASE {db}", "postgres")
        self.db = db
        env = dict(os.environ)
        env.update({
            "APP_ENV": "development", "DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{db}",
            "REDIS_URL": self.args.redis_url, "INSTANCE_PATH": work, "PYTHONPATH": str(ROOT),
            "ALLOW_PRIVATE_URLS": "1", "RATELIMIT_ENABLED": "0", "AUTH_CACHE_TTL": "5",
            "CALL_SWEEP_MARGIN_SECONDS": "2", "JOBS_INLINE": "1", "RATELIMIT_KEY_PREFIX": f"fault{os.getpid()}",
            "CATALOG_PATH": str(Path(work) / "catalog"),
        })
        if self.rails is not None:
            env.update(self.rails.env())
        (Path(work) / "catalog").mkdir()
        (Path(work) / "catalog" / "faulty.yaml").write_text(
            "slug: faulty\nname: Faulty\ndescription: fault-injection target\nowner: tests\nstatus: approved\n"
            f"upstream_url: {upstream_url}\nsandbox_url: {upstream_url}\n"
            f"actions:\n  - name: run\n    price_cents: {PRICE_CENTS}\n    method: POST\n    path: /run\n"
            "    timeout_seconds: 1\n")
        flask(env, "db", "upgrade")
        flask(env, "catalog", "load")
        self.extra_problems: list[str] = []
        self.payout_summary: dict = {}
        self.env = env
        faults = (self.args.faults or "").split(",")
        if "payoutkill" in faults:
            payout_faults.setup(self, flask)
        if "webhookreplay" in faults:
            webhook_faults.setup(self)
        if "usdcpayout" in faults:
            usdc_payout_faults.setup(self, flask, sh, VENV_BIN, upstream_url)
        created = json.loads(flask(env, "accounts", "create", "--email", "fault@example.com", "--plan", "enterprise"))
        flask(env, "accounts", "grant-credits", created["account_id"], "--cents", "100000")
        self.env, self.work = env, work
        self.account_id, self.key = created["account_id"], created["key"]
        self.start_balance = self.balance()

    def balance(self) -> int:
        out = sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-tAq", "-c",
                 f"SELECT balance_micros FROM accounts WHERE id = '{self.account_id}'", self.db).stdout
        return int(out.strip())

    def start_gunicorn(self):
        self.gunicorn, self.url = gunicorn_proc(self.env, workers=3,
                                                log=Path(self.work) / "web.log", grace=15)
        self.procs.started.append(self.gunicorn.start())
        self.gunicorn.wait_http(self.url + "/openapi.json", timeout=60)
        if self.rails is not None:
            self.rails.kill_workers = x402_faults.kill_all(self.gunicorn, self.note)
        # The scheduler runs the pending-call sweep (and everything else) as in production.
        self.procs.start([VENV_BIN / "flask", "--app", "wsgi", "scheduler", "--tick", "1"], name="scheduler",
                         cwd=ROOT, env=self.env, log=Path(self.work) / "scheduler.log")

    # ---------------------------------------------------------------- clients
    def client(self, cid: int):
        session = requests.Session()
        headers = {"Authorization": f"Bearer {self.key}"}
        while not self.stop.is_set():
            key = f"fault-{cid}-{uuid.uuid4().hex}"
            body = {"action": "run", "client": cid, "key": key}
            outcome = None
            last = None
            deadline = time.monotonic() + 120
            while outcome is None and time.monotonic() < deadline:
                try:
                    r = session.post(f"{self.url}/v1/module/faulty/call", json=body, timeout=15,
                                     headers={**headers, "Idempotency-Key": key})
                except requests.RequestException as exc:
                    r = None
                    last = type(exc).__name__
                else:
                    last = r.status_code
                if r is not None and r.status_code in (200, 402, 502, 504):
                    outcome = {"status": r.status_code, "body": r.json()}
                    break
                # unknown (connection error, 5xx from a dying worker or DB restart) or in flight
                with self.lock:
                    self.retries += 1
                    self.retry_reasons[str(last)] += 1
                time.sleep(0.2 + random.random() * 0.3)
                session = requests.Session()
            with self.lock:
                self.results[key] = outcome or {"status": None, "last_seen": last}

    # ---------------------------------------------------------------- faults
    def note(self, text):
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")

    def injector(self):
        faults = set(self.args.faults.split(",")) if self.args.faults else set()
        t0 = time.monotonic()
        plan = []
        if "upstream" in faults:
            plan += [(3, "upstream", "hang"), (6, "upstream", "reset"), (8, "upstream", "ok")]
        if "redis" in faults:
            plan += [(9, "redis", "stop"), (13, "redis", "start")]
        if "postgres" in faults:
            plan += [(14, "postgres", "restart")]
        if "x402hang" in faults:
            plan += [(2, "x402", "hang"), (5, "x402", "ok")]
        if "x402kill" in faults:
            plan += [(6, "x402", "kill")]  # the next settlement kills the workers, once
        if "finalizekill" in faults:
            plan += [(20, "finalize", "slow"), (21.5, "finalize", "kill"), (23, "finalize", "ok")]
        plan.sort()
        self.plan, self.t0 = plan, t0
        next_kill = 1.0
        while not self.stop.is_set():
            now = time.monotonic() - t0
            while plan and plan[0][0] <= now:
                _, what, how = plan.pop(0)
                self.apply(what, how)
                plan.sort()  # a window retried re-plans its steps
            if not plan:
                self.faults_done.set()
            if "kill" in faults and now >= next_kill:
                pids = self.gunicorn.children()
                if pids:
                    victim = random.choice(pids)
                    os.kill(victim, signal.SIGKILL)
                    self.note(f"kill -9 worker {victim}")
                next_kill = now + random.uniform(1.0, 3.0)
            time.sleep(0.1)
        while plan:  # never leave a service stopped
            _, what, how = plan.pop(0)
            if how in ("start", "ok"):
                self.apply(what, how)

    def apply(self, what, how):
        self.note(f"{what} {how}")
        if what == "x402":
            self.rails.mode = how
        elif what == "upstream" and how == "ok":
            self.upstream.clear_faults()
        elif what == "upstream":
            kind, seconds = UPSTREAM_FAULTS[how]
            self.upstream.inject(kind, seconds=seconds)
        elif what == "redis" and how == "stop":
            sh("redis-cli", "-h", "127.0.0.1", "shutdown", "nosave", check=False)
        elif what == "redis" and how == "start":
            os.makedirs("/var/lib/redis", exist_ok=True)
            os.makedirs("/var/log/redis", exist_ok=True)
            sh("redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
               "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
               "--logfile", "/var/log/redis/ci.log", check=False)
        elif what == "finalize" and how == "kill":
            # kill when an answered call's finalization is queued (its row still pending),
            # not at a fixed moment: a random kill or a restart just before can leave no
            # answered call in flight then (up to KILL_WAIT seconds; the check reports a miss)
            self.windows_tried += 1
            until = time.monotonic() + KILL_WAIT
            while not self.answered_pending() and time.monotonic() < until:
                time.sleep(0.05)
            if not self.answered_pending():
                # nothing in the window: killing now would test nothing; open it again
                # (the slow finalize stays on) instead of failing or passing blindly
                if self.windows_tried < FINALIZE_WINDOWS:
                    now = time.monotonic() - self.t0
                    self.plan[:] = [step for step in self.plan if step[1:] != ("finalize", "ok")]
                    self.plan += [(now + 1.0, "finalize", "kill"), (now + 2.5, "finalize", "ok")]
                    self.note("finalizekill: no answered call in the window; trying it again")
                return
            for pid in self.gunicorn.children():
                os.kill(pid, signal.SIGKILL)
            self.note("kill -9 every worker with finalizations queued")
        elif what == "finalize":  # prepared statements of the running workers follow it
            body = finalize_function(0.5 if how == "slow" else None)
            sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", body, self.db, check=False)
        elif what == "postgres":
            version, cluster = pg_cluster()
            sh("pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart", check=False)

    def answered_pending(self) -> int:
        """How many of the last answered (200) calls are still ``pending`` in the database."""
        with self.lock:
            ids = [r["body"]["call_id"] for r in self.results.values() if r.get("status") == 200][-50:]
        if not ids:
            return 0
        listed = ",".join(f"'{i}'" for i in ids if str(i).replace("_", "").isalnum())
        return int(self.sql(f"SELECT count(*) FROM module_calls WHERE status = 'pending' AND id IN ({listed})")[0][0])

    # ---------------------------------------------------------------- checks
    def sql(self, query: str) -> list[list[str]]:
        out = sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-tAq", "-F", "\t", "-c", query, self.db).stdout
        return [line.split("\t") for line in out.splitlines() if line]

    def verify(self) -> dict:
        problems: list[str] = []
        # Let deadlines pass, then resolve anything a crash left pending.
        time.sleep(4)
        flask(self.env, "calls", "sweep")
        if self.rails is not None:  # the x402 reconciliation job, at once
            x402_faults.resolve(self)
        check = sh(str(VENV_BIN / "flask"), "--app", "wsgi", "ledger", "check", env=self.env, check=False)
        if check.returncode != 0:
            problems.append("ledger check: " + check.stdout[-500:])
        money = sh(str(VENV_BIN / "flask"), "--app", "wsgi", "money", "reconcile", env=self.env, check=False)
        if money.returncode != 0:  # every external book (payments, x402, chain, holds) agrees
            problems.append("money reconcile: " + money.stdout[-800:])
        pending = self.sql("SELECT count(*) FROM module_calls WHERE status = 'pending'")[0][0]
        if pending != "0":
            problems.append(f"{pending} calls still pending")
        calls = {r[0]: r for r in self.sql(
            "SELECT id, status, idempotency_key, charged::text FROM module_calls")}
        refs = {}
        for ref, n in self.sql("SELECT ref, count(*) FROM ledger_transactions WHERE ref LIKE 'call%' GROUP BY ref"):
            refs[ref] = int(n)
        keys = {}
        for cid, (_, status, key, charged) in calls.items():
            charge, refund = refs.get(f"call:{cid}", 0), refs.get(f"call_refund:{cid}", 0)
            if charge > 1 or refund > 1:
                problems.append(f"{cid}: {charge} charges, {refund} refunds")
            if status == "succeeded" and (charge != 1 or refund != 0):
                problems.append(f"{cid}: succeeded with {charge} charges and {refund} refunds")
            if status == "refunded" and charge != refund:
                problems.append(f"{cid}: refunded but charges {charge} != refunds {refund}")
            if status == "succeeded" and key:  # an x402 payer's balance may pay a call sent without a key
                keys.setdefault(key, []).append(cid)
        for key, cids in keys.items():
            if len(cids) > 1:
                problems.append(f"key {key} charged {len(cids)} times")
        from app.services.gateway.receipts import ReceiptInvalid, verify_response

        published = requests.get(self.url + "/api/receipts/keys", timeout=10).json()
        pub = {k["kid"]: k["public_key"] for k in published["keys"]}
        ok = 0
        deferred = self.env.get("CALL_FINALIZE_DEFERRED", "1") not in ("0", "false", "no", "off")
        self.answered_then_refunded = 0
        for key, res in self.results.items():
            if res.get("status") != 200:
                continue
            ok += 1
            body = res["body"]
            cid = body["call_id"]
            lost_finalize = (deferred and not keys.get(key) and cid in calls and calls[cid][1] == "refunded"
                             and refs.get(f"call:{cid}") == 1 and refs.get(f"call_refund:{cid}") == 1)
            if lost_finalize:  # the house's loss (the provider was called), never the customer's
                self.answered_then_refunded += 1
            elif keys.get(key) != [cid]:
                problems.append(f"200 for key {key} / {cid} but succeeded calls are {keys.get(key)}")
            try:
                verify_response(body, pub)
            except ReceiptInvalid as exc:
                problems.append(f"receipt of {cid} does not verify: {exc}")
        spent = self.start_balance - self.balance()
        mine = self.sql(f"SELECT count(*) FROM module_calls WHERE account_id = '{self.account_id}' "
                        "AND status = 'succeeded'")[0][0]
        expected = int(mine) * PRICE_CENTS * 10_000
        if spent != expected:
            problems.append(f"balance moved {spent} micros, succeeded calls cost {expected}")
        if "finalizekill" in (self.args.faults or "").split(",") and not self.answered_then_refunded:
            problems.append(f"finalizekill hit no answered call in {self.windows_tried} windows: the "
                            "deferred finalize's window was not tested")
        unknown = sum(1 for r in self.results.values() if r.get("status") is None)
        if unknown:
            problems.append(f"{unknown} keys got no definitive answer within 120 s: "
                            + ", ".join(str(r.get("last_seen")) for r in self.results.values()
                                        if r.get("status") is None)[:300])
        if self.rails is not None:
            problems += x402_faults.check(self, self.rails, PRICE_CENTS * 10_000)
        problems += self.extra_problems
        statuses: dict[str, int] = {}
        for r in self.results.values():
            statuses[str(r.get("status"))] = statuses.get(str(r.get("status")), 0) + 1
        return {"ok": not problems, "problems": problems[:50], "requests": len(self.results),
                "outcomes": statuses, "succeeded_calls": len(keys), "unresolved_after_retries": unknown,
                "answered_then_refunded": self.answered_then_refunded,
                "retries": self.retries,
                "retry_reasons": dict(self.retry_reasons.most_common()), "calls_recorded": len(calls), "x402": self.x402_summary,
                "billing_faults": self.payout_summary,
                "faults": self.events}

    def teardown(self):
        self.procs.stop_all()
        sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", f"DROP DATABASE IF EXISTS {self.db}",
           "postgres", check=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="money under fault")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--faults", default="kill,upstream,redis,postgres,x402hang,x402kill,finalizekill,topuprace,"
                                        "payoutkill,webhookreplay,usdcpayout")
    ap.add_argument("--x402-clients", type=int, default=2, help="x402 payers (with the x402 faults)")
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/13")
    args = ap.parse_args(argv)
    provider = upstream()
    x402_on = bool(set(args.faults.split(",")) & set(x402_faults.FAULTS)) and args.x402_clients > 0
    rails = x402_faults.X402Rails() if x402_on else None
    drv = Driver(args, provider, rails)
    usdc = usdc_payout_faults.UsdcChain(rails) if "usdcpayout" in args.faults.split(",") else None
    with provider as upstream_url, (rails or contextlib.nullcontext()), (usdc or contextlib.nullcontext()):
        drv.usdc = usdc
        drv.setup(upstream_url)
        drv.start_gunicorn()
        try:
            threads = [threading.Thread(target=drv.client, args=(i,), daemon=True) for i in range(args.clients)]
            payers = x402_faults.accounts(drv, args.x402_clients) if rails else []
            threads += [threading.Thread(target=x402_faults.client, args=(drv, i, key), daemon=True)
                        for i, key in enumerate(payers)]
            inj = threading.Thread(target=drv.injector, daemon=True)
            for t in threads:
                t.start()
            inj.start()
            time.sleep(args.seconds)
            drv.faults_done.wait(120)  # a fault window that hit nothing is tried again first
            drv.stop.set()
            inj.join(30)
            for t in threads:
                t.join(150)
            # the services are back; make sure the app is too (gunicorn respawns workers)
            drv.gunicorn.wait_http(drv.url + "/openapi.json", timeout=60)
            if "topuprace" in args.faults.split(","):  # before the books are checked
                problems, drv.payout_summary["topuprace"] = topup_faults.run(drv, sh, VENV_BIN, ROOT, flask,
                                                                             PRICE_CENTS)
                drv.extra_problems += problems
            if "webhookreplay" in args.faults.split(","):
                problems, drv.payout_summary["webhookreplay"] = webhook_faults.run(drv, sh, flask)
                drv.extra_problems += problems
            # before payoutkill: it settles the whole month, this one settles its own seller
            if "usdcpayout" in args.faults.split(","):
                problems, drv.payout_summary["usdcpayout"] = usdc_payout_faults.run(drv, sh, VENV_BIN, ROOT, flask)
                drv.extra_problems += problems
            if "payoutkill" in args.faults.split(","):
                problems, drv.payout_summary["payoutkill"] = payout_faults.run(drv, sh, VENV_BIN, ROOT)
                drv.extra_problems += problems
            summary = drv.verify()
        finally:
            drv.teardown()
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
