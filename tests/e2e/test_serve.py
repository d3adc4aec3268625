"""`make serve` end to end: the same script (deploy/serve.sh) brings up nginx, gunicorn,
the RQ worker and the scheduler on free loopback ports against its own PostgreSQL
database; the test talks to it through nginx only, then stops it with SIGTERM.

Feature checks run when their routes exist in the app under test: add one by writing a
``check_*(stack)`` function and listing it in ``FEATURE_CHECKS``.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field

import pytest
import requests

from tests.support.apps import ROOT, VENV_BIN
from tests.support.procs import Proc, free_port

DB_URL = os.environ.get("DATABASE_URL") or ""
REDIS_URL = os.environ.get("REDIS_URL") or ""
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)

pytestmark = pytest.mark.skipif(
    not (REDIS_URL and NGINX), reason="needs Redis (REDIS_URL) and nginx",
)

METRICS_TOKEN = "e2e-metrics-token"


@dataclass
class Stack:
    api: str           # nginx, API host
    chat: str          # nginx, chat host
    env: dict          # environment of the stack's processes (for CLI calls)
    serve_dir: str
    rules: set         # URL rules of the app under test
    key: str = ""
    account_id: str = ""
    notes: list = field(default_factory=list)

    def flask(self, *args: str) -> str:
        out = subprocess.run([str(VENV_BIN / "flask"), "--app", "wsgi", *args], cwd=ROOT, env=self.env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"}

    def metrics(self) -> str:
        r = requests.get(self.api + "/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
        assert r.status_code == 200, r.text
        return r.text


def _own_database_url() -> str:
    """A database of this test's own, <test db>_serve: created by serve.sh when missing,
    kept between runs (dropping a database can take many seconds on a busy server)."""
    from psycopg.conninfo import conninfo_to_dict

    url = DB_URL.replace("postgresql+psycopg://", "postgresql://", 1)
    name = conninfo_to_dict(url)["dbname"] + "_serve"
    base, _, query = url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + ("?" + query if query else "")


@pytest.fixture
def stack(app, tmp_path):
    ports = {"SERVE_PORT": free_port(), "SERVE_CHAT_PORT": free_port(), "SERVE_APP_PORT": free_port(),
             "DEMO_PROVIDER_PORT": free_port(), "DEMO_LLM_PORT": free_port()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "GUNICORN_"))}
    env.update({k: str(v) for k, v in ports.items()})
    env.update({
        "VENV_BIN": str(VENV_BIN), "SERVE_DIR": str(tmp_path / "serve"),
        "DATABASE_URL": _own_database_url(), "REDIS_URL": REDIS_URL,
        "SECRET_KEY": "e2e-secret-key", "METRICS_TOKEN": METRICS_TOKEN,
        "RECEIPT_SIGNING_KEY": base64.b64encode(os.urandom(32)).decode(),
        "RATELIMIT_KEY_PREFIX": app.config["RATELIMIT_KEY_PREFIX"] + "serve",
        "SERVE_STOP_TIMEOUT": "20", "WEB_CONCURRENCY": "2",
    })
    proc = Proc(["bash", "deploy/serve.sh"], name="serve", cwd=ROOT, env=env, log=tmp_path / "serve.log",
                grace=60).start()

    def tail(n: int) -> str:
        return "\n".join(proc.output().splitlines()[-n:])

    try:
        assert proc.wait_output("[serve] ready", timeout=150), "serve.sh did not become ready:\n" + tail(60)
        cli_env = dict(env, APP_ENV="production", INSTANCE_PATH=str(tmp_path / "serve" / "instance"))
        s = Stack(api=f"http://127.0.0.1:{ports['SERVE_PORT']}",
                  chat=f"http://127.0.0.1:{ports['SERVE_CHAT_PORT']}",
                  env=cli_env, serve_dir=str(tmp_path / "serve"),
                  rules={r.rule for r in app.url_map.iter_rules()})
        yield s
    finally:
        returncode = proc.stop(sweep=False)
    try:  # stopped cleanly: exit status 0, every port closed
        assert returncode == 0, tail(40)
        assert "[serve] stopped" in proc.output(), tail(40)
        for port in ports.values():
            with socket.socket() as sock:
                assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open"
    finally:
        proc.kill_leftovers()


# --- feature checks: run when the route exists ------------------------------------------

def check_module_call(stack: Stack) -> None:
    """A metered module call through nginx (needs the gateway and a loaded catalog)."""
    import psycopg

    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        row = conn.execute(
            "SELECT m.slug, a.name FROM modules m JOIN module_actions a ON a.module_id = m.id "
            "WHERE m.status = 'approved' AND a.active ORDER BY a.price_cents, m.slug LIMIT 1").fetchone()
    assert row is not None, "no approved module: did `flask catalog load` run?"
    r = requests.post(f"{stack.api}/v1/module/{row[0]}/call", json={"action": row[1]},
                      headers={**stack.auth, "Idempotency-Key": os.urandom(8).hex()}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ok"] is True and body.get("receipt"), body
    stack.notes.append(f"module call {row[0]}.{row[1]}")


def check_chat_completion(stack: Stack) -> None:
    """A chat completion on the chat host through nginx, plain and streamed (SSE)."""
    payload = {"model": "auto", "messages": [{"role": "user", "content": "Say hello."}]}
    r = requests.post(f"{stack.chat}/v1/chat/completions", json=payload, headers=stack.auth, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] and "cost_usd" in body["usage"], body
    with requests.post(f"{stack.chat}/v1/chat/completions", json={**payload, "stream": True},
                       headers=stack.auth, timeout=60, stream=True) as s:
        if s.status_code == 200 and s.headers.get("Content-Type", "").startswith("text/event-stream"):
            events = [line for line in s.iter_lines() if line.startswith(b"data:")]
            assert events and events[-1].strip() == b"data: [DONE]"
    stack.notes.append("chat completion")


FEATURE_CHECKS = [
    ("/v1/module/<slug>/call", check_module_call),
    ("/v1/chat/completions", check_chat_completion),
]


def _has_rule(rules: set, wanted: str) -> bool:
    pattern = re.sub(r"<[^>]+>", "<>", wanted)
    return any(re.sub(r"<[^>]+>", "<>", r) == pattern for r in rules)


# --- the test -------------------------------------------------------------------------

def test_make_serve_stack_end_to_end(stack: Stack):
    # Liveness and readiness through nginx; X-Request-Id passes through both ways.
    r = requests.get(stack.api + "/healthz", headers={"X-Request-Id": "e2e-trace-1"}, timeout=5)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert r.headers["X-Request-Id"] == "e2e-trace-1" and r.headers["Server"] == "nginx"
    r = requests.get(stack.api + "/readyz", timeout=5)
    assert r.status_code == 200 and set(r.json()["checks"]) == {"database", "redis"}, r.text
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])  # nginx's $request_id
    r = requests.get(stack.api + "/healthz", headers={"X-Request-Id": "bad id <script>"}, timeout=5)
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])  # insane ids are replaced

    # An account and key made through the operator CLI, used through nginx.
    email = f"e2e-serve-{os.urandom(4).hex()}@example.com"
    created = json.loads(stack.flask("accounts", "create", "--email", email))
    stack.key, stack.account_id = created["key"], created["account_id"]
    r = requests.get(stack.api + "/api/account", headers={**stack.auth, "X-Forwarded-For": "6.6.6.6"},
                     timeout=5)
    assert r.status_code == 200 and r.json()["id"] == stack.account_id and r.json()["balance_cents"] == 1000
    assert requests.get(stack.api + "/api/account", timeout=5).json()["error"] == "unauthorized"

    # nginx answers its own errors in the API's JSON shape; the chat host serves /v1/ only.
    r = requests.post(stack.api + "/api/keys", data=b"x" * (1024 * 1024 + 1),
                      headers={**stack.auth, "Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    r = requests.get(stack.api + "/api/usage/daily?days=" + "1" * 9000, headers=stack.auth, timeout=5)
    assert r.status_code == 414 and r.json()["error"] == "uri_too_long", r.text  # was nginx's HTML page
    for host in (stack.api, stack.chat):  # the internal location, asked for directly
        r = requests.get(host + "/__uri_too_long", timeout=5)
        assert r.status_code == 404 and r.json()["error"] == "not_found", r.text  # was nginx's HTML page
    r = requests.get(stack.chat + "/api/account", headers=stack.auth, timeout=5)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert requests.get(stack.chat + "/healthz", timeout=5).status_code == 200

    for route, check in FEATURE_CHECKS:
        if _has_rule(stack.rules, route):
            check(stack)

    # Metrics: token-protected, request counts by route from both gunicorn workers, and
    # a heartbeat job enqueued by the scheduler and run by the worker.
    assert requests.get(stack.api + "/metrics", timeout=5).status_code == 401
    deadline = time.time() + 45
    while True:
        text = stack.metrics()
        if "gateway_worker_heartbeat_timestamp_seconds " in text or time.time() > deadline:
            break
        time.sleep(0.5)
    assert "gateway_worker_heartbeat_timestamp_seconds " in text, "the scheduled heartbeat job never ran"
    assert re.search(r'gateway_http_requests_total\{method="GET",route="/api/account",status="200"\} 1\.0', text)
    assert 'gateway_queue_depth{queue="default"}' in text and "gateway_redis_up 1.0" in text

    # Logs: JSON access lines with the real client IP (the spoofed X-Forwarded-For entry
    # is ignored), the account id, and never the key.
    with open(os.path.join(stack.serve_dir, "logs", "web.log")) as fh:
        web_log = fh.read()
    assert stack.key not in web_log and stack.key[9:] not in web_log
    access = [json.loads(line) for line in web_log.splitlines()
              if line.startswith("{") and '"gateway.access"' in line]
    mine = [a for a in access if a["route"] == "/api/account" and a["status"] == 200]
    assert mine and mine[0]["client_ip"] == "127.0.0.1" and mine[0]["account_id"] == stack.account_id
