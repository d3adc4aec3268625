"""Scale out without surprises (issue 36 item 7): three app processes in the production
configuration (gunicorn's gevent worker, ``deploy/gunicorn.conf.py``) against ONE
PostgreSQL capped at ``max_connections = 40``, driven by 64 concurrent callers of
metered module calls with key and usage reads in between: no error, every call charged
exactly once, books clean (``flask money reconcile``, ``flask ledger check``), and no
process ever holds more connections than its pool allows (``DB_POOL_SIZE`` +
``DB_MAX_OVERFLOW``, seen in ``pg_stat_activity`` by ``application_name``).

The same again through PgBouncer in transaction mode (``DATABASE_PGBOUNCER=1``): the
system package of deploy/system-packages.sh, so it fails in CI when missing rather than
skipping. The server is a throw-away embedded PostgreSQL (app/services/platform/
embedded_pg.py) in a temporary directory with the cap set; it listens on a Unix socket
only.
"""
from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest
import requests
from sqlalchemy.engine import make_url

from tests.support.apps import ROOT, VENV_BIN, gunicorn_proc
from tests.support.procs import Proc, free_port
from tests.support.standin import StandIn

CAP = 40
NODES = 3
POOL_SIZE, OVERFLOW = 8, 0  # config.py's defaults, set explicitly so the bound below is the test's
CALLERS, CALLS_EACH = 64, 8
PRICE_CENTS = 1
IN_CI = bool(os.environ.get("CI"))


def _needs(ok: bool, what: str) -> None:
    """Skip on a developer machine without ``what``; fail in CI, where .ci/run provides it."""
    if not ok:
        if IN_CI:
            pytest.fail(f"{what} is required in CI (deploy/system-packages.sh, .ci/run)")
        pytest.skip(f"needs {what}")


def _pgbouncer() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)


@pytest.fixture(scope="module")
def capped_pg():
    """A throw-away embedded PostgreSQL with max_connections = 40; yields (admin URL, the
    database's URL)."""
    from app.services.platform import embedded_pg

    pgdata = Path(tempfile.mkdtemp(prefix="gw-budget-")) / "pg"
    try:
        url = embedded_pg.start(pgdata, database="budget")
        admin = make_url(url).set(database="postgres").render_as_string(hide_password=False)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET max_connections = {CAP}")
        embedded_pg.stop(pgdata)
        url = embedded_pg.start(pgdata, database="budget")
        with psycopg.connect(admin, autocommit=True) as conn:
            assert conn.execute("SHOW max_connections").fetchone()[0] == str(CAP)
        yield admin, url
    finally:
        embedded_pg.stop(pgdata)
        shutil.rmtree(pgdata.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def upstream():
    with StandIn({("POST", "/run"): lambda req: (200, {"ok": True, "echo": len(req.body)})}) as url:
        yield url


def _flask(env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([str(VENV_BIN / "flask"), "--app", "wsgi", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    if check and out.returncode:
        raise AssertionError(f"flask {' '.join(args)} failed: {out.stdout[-2000:]}{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def deployment(capped_pg, upstream):
    """The production environment on the capped server: migrated, catalog loaded."""
    _needs(bool(os.environ.get("REDIS_URL")), "Redis (REDIS_URL): the production configuration needs it")
    _, url = capped_pg
    work = Path(tempfile.mkdtemp(prefix="gw-budget-app-"))
    (work / "catalog").mkdir()
    (work / "catalog" / "budget.yaml").write_text(
        "slug: budget\nname: Budget\ndescription: connection budget target\nowner: tests\nstatus: approved\n"
        f"upstream_url: {upstream}\nsandbox_url: {upstream}\n"
        f"actions:\n  - name: run\n    price_cents: {PRICE_CENTS}\n    method: POST\n    path: /run\n"
        "    timeout_seconds: 10\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GUNICORN_", "DB_", "DATABASE_"))}
    env.update({
        "APP_ENV": "production", "SECRET_KEY": secrets.token_urlsafe(32),
        "DATABASE_URL": url, "REDIS_URL": os.environ["REDIS_URL"],
        "RECEIPT_SIGNING_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        "INSTANCE_PATH": str(work), "CATALOG_PATH": str(work / "catalog"),
        "ALLOW_PRIVATE_URLS": "1", "TRUSTED_PROXIES": "0", "PYTHONPATH": str(ROOT),
        "RATELIMIT_KEY_PREFIX": f"budget{os.getpid()}", "no_proxy": "*",
        "WEB_CONCURRENCY": "1",
        "DB_POOL_SIZE": str(POOL_SIZE), "DB_MAX_OVERFLOW": str(OVERFLOW),
    })
    _flask(env, "db", "upgrade")
    _flask(env, "catalog", "load")
    yield env
    shutil.rmtree(work, ignore_errors=True)


def _account(env: dict) -> tuple[str, str]:
    created = json.loads(_flask(env, "accounts", "create", "--email", f"{uuid.uuid4().hex[:10]}@example.com",
                                "--plan", "enterprise").stdout)
    _flask(env, "accounts", "grant-credits", created["account_id"], "--cents", "100000")
    return created["account_id"], created["key"]


def _balance(admin_db_url: str, account_id: str) -> int:
    with psycopg.connect(admin_db_url) as conn:
        return conn.execute("SELECT balance_micros FROM accounts WHERE id = %s", (account_id,)).fetchone()[0]


class _Watcher(threading.Thread):
    """Samples pg_stat_activity: the most connections any app process held at once, and
    the most client backends the server had at once."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.per_process: dict[str, int] = {}
        self.total = 0

    def run(self):
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute("SELECT application_name, count(*) FROM pg_stat_activity "
                                    "WHERE backend_type = 'client backend' GROUP BY 1").fetchall()
                self.total = max(self.total, sum(n for _, n in rows))
                for name, n in rows:
                    if re.fullmatch(r"gateway\[\d+\]", name or ""):
                        self.per_process[name] = max(self.per_process.get(name, 0), n)
                time.sleep(0.05)


def _drive(nodes: list[str], key: str) -> tuple[list, int]:
    """64 callers, each CALLS_EACH metered calls (Idempotency-Key each) and a key list and
    usage read after every other call, spread over the nodes; (failures, calls answered 200)."""
    failures: list = []
    ok = [0]
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {key}"}

    def caller(i: int):
        s = requests.Session()
        for n in range(CALLS_EACH):
            node = nodes[(i + n) % len(nodes)]
            r = s.post(f"{node}/v1/module/budget/call", json={"action": "run", "input": {"i": i, "n": n}},
                       headers={**headers, "Idempotency-Key": f"b-{i}-{n}-{uuid.uuid4().hex[:8]}"}, timeout=60)
            with lock:
                if r.status_code == 200:
                    ok[0] += 1
                else:
                    failures.append(("call", r.status_code, r.text[:300]))
            if n % 2:
                for path in ("/api/keys", "/api/usage/current"):
                    r = s.get(f"{node}{path}", headers=headers, timeout=60)
                    if r.status_code != 200:
                        with lock:
                            failures.append((path, r.status_code, r.text[:300]))

    with ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(caller, range(CALLERS)))
    return failures, ok[0]


def _bouncer(stack: ExitStack, url: str) -> str:
    """PgBouncer in transaction mode in front of the capped server; its URL."""
    binary = _pgbouncer()
    parsed = make_url(url)
    work = Path(tempfile.mkdtemp(prefix="gw-pgbouncer-"))
    stack.callback(shutil.rmtree, work, True)
    work.chmod(0o755)  # read by the unprivileged user pgbouncer runs as under root
    port = free_port()
    (work / "users.txt").write_text('"postgres" ""\n')
    (work / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"budget = host={parsed.query['host']} port={parsed.port or 5432} dbname={parsed.database} user=postgres\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {work / 'users.txt'}\n"
        "pool_mode = transaction\nmax_client_conn = 300\ndefault_pool_size = 20\n"
        "server_reset_query =\n")
    for f in work.iterdir():
        f.chmod(0o644)
    cmd = [binary, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        cmd[1:1] = ["-u", "embedded_postgres"]
    proc = stack.enter_context(Proc(cmd, name="pgbouncer"))
    proc.wait_port(port, timeout=20)
    return f"postgresql://postgres@127.0.0.1:{port}/budget"


@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
def test_three_processes_64_callers_on_40_connections(deployment, capped_pg, through):
    admin, url = capped_pg
    if through == "pgbouncer":
        _needs(_pgbouncer() is not None, "pgbouncer (deploy/system-packages.sh)")
    env = dict(deployment)
    account_id, key = _account(env)
    start = _balance(url, account_id)
    with ExitStack() as stack:
        if through == "pgbouncer":
            env.update(DATABASE_URL=_bouncer(stack, url), DATABASE_PGBOUNCER="1")
        watcher = _Watcher(admin)
        watcher.start()
        stack.callback(watcher.stop.set)
        nodes = []
        for i in range(NODES):
            proc, node = gunicorn_proc(env, workers=1, grace=30, graceful_timeout=20,
                                       log=Path(env["INSTANCE_PATH"]) / f"web-{through}-{i}.log")
            stack.enter_context(proc)
            nodes.append((proc, node))
        for proc, node in nodes:
            proc.wait_http(node + "/openapi.json", timeout=60)
        failures, answered = _drive([n for _, n in nodes], key)
        for proc, _ in nodes:  # a graceful stop: each process writes its queued finalizations
            proc.stop()
        watcher.stop.set()
        watcher.join(5)
    logs = "".join((Path(env["INSTANCE_PATH"]) / f"web-{through}-{i}.log").read_text()[-3000:]
                   for i in range(NODES)) if failures else ""
    assert failures == [], (failures[:10], logs)
    assert answered == CALLERS * CALLS_EACH
    # every answered call charged exactly once
    assert start - _balance(url, account_id) == answered * PRICE_CENTS * 10_000
    with psycopg.connect(url) as conn:
        states = dict(conn.execute("SELECT status, count(*) FROM module_calls WHERE account_id = %s GROUP BY 1",
                                   (account_id,)).fetchall())
    assert states == {"succeeded": answered}, states
    direct = {**env, "DATABASE_URL": url}
    env.pop("DATABASE_PGBOUNCER", None)
    report = _flask(direct, "money", "reconcile", check=False)
    assert report.returncode == 0, report.stdout[-3000:]
    ledger = _flask(direct, "ledger", "check", check=False)
    assert ledger.returncode == 0, ledger.stdout[-3000:]
    # the connection budget: each process within its pool, the server within its cap
    print(f"{through}: connections per process (max seen) {watcher.per_process}; server total {watcher.total}")
    assert watcher.total < CAP
    if through == "direct":
        assert len(watcher.per_process) >= NODES, watcher.per_process
        assert max(watcher.per_process.values()) <= POOL_SIZE + OVERFLOW, watcher.per_process
