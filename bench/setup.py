"""Benchmark set-up: tools, database, the fake upstream (nginx), gunicorn, metadata."""
from __future__ import annotations

import base64
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from bench import seed
from tests.support import procs

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
DB_NAME = os.environ.get("BENCH_DATABASE", "gw_bench")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
RUNNING = procs.Processes()  # everything a run starts; stopped at its end (also on errors)
GRACE = 15.0  # seconds from SIGTERM to SIGKILL

# The fake upstream's fixed answers (nginx `return`, no disk or application code).
MODULE_ANSWER = {"ok": True, "data": {"echo": "bench", "items": [1, 2, 3],
                                      "text": "fixed answer from the bench upstream"}}
CHAT_ANSWER = {
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1763700000,
    "model": "bench-model",
    "choices": [{"index": 0, "message": {"role": "assistant",
                                         "content": "Hello from the bench upstream."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
}


def check_tools() -> None:
    missing = [t for t in ("nginx", "wrk", "psql", "redis-cli") if not shutil.which(t)
               and not Path("/usr/sbin", t).exists()]
    if missing:
        raise SystemExit(f"missing tools: {', '.join(missing)} (run: bash deploy/system-packages.sh)")


def app_env(ports: dict, work: Path) -> dict:
    """Production-mode environment for gunicorn and the flask CLI, secrets made for this run."""
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "USER")}
    env.update({
        "APP_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(32),
        "DATABASE_URL": f"{PG}/{DB_NAME}",
        "REDIS_URL": REDIS_URL,
        "INSTANCE_PATH": str(work / "instance"),
        "RATELIMIT_KEY_PREFIX": "gwbench",
        "GUNICORN_BIND": f"127.0.0.1:{ports['gunicorn']}",
        "PORT": str(ports["gunicorn"]),
        "BASE_URL": f"http://127.0.0.1:{ports['gunicorn']}",
        # The bench talks to a loopback upstream; production refuses that by default.
        "ALLOW_PRIVATE_URLS": "1",
        "TRUSTED_PROXIES": "0",
        "BENCH_UPSTREAM_URL": f"http://127.0.0.1:{ports['upstream']}/module/passthrough",
        "PYTHONPATH": str(ROOT),
        "FLASK_APP": "wsgi",
        "no_proxy": "*",
        # module gateway: receipt signing key and the bench provider's secret, made per run
        "RECEIPT_SIGNING_KEY": base64.b64encode(secrets.token_bytes(32)).decode(),
        "BENCH_PROVIDER_SECRET": secrets.token_urlsafe(24),
        # chat host: one model on the fake upstream (see bench/seed.py)
        "CHAT_CATALOG": seed.write_chat_catalog(work, f"http://127.0.0.1:{ports['upstream']}"),
        "CHAT_EXTRA_PROVIDERS": "bench_llm",
        "BENCH_LLM_BASE_URL": f"http://127.0.0.1:{ports['upstream']}/v1",
        "BENCH_LLM_API_KEY": secrets.token_urlsafe(24),
        # public tracking: every wrk request comes from 127.0.0.1; lift the per-IP limit
        "TRACK_RATE_LIMIT": "1000000/second",
    })
    # what-if experiments, e.g. BENCH_APP_ENV="RATELIMIT_ENABLED=0 AUTH_CACHE_TTL=60"
    for pair in os.environ.get("BENCH_APP_ENV", "").split():
        name, _, value = pair.partition("=")
        env[name] = value
    return env


def psql(sql: str, db: str = "postgres") -> str:
    out = subprocess.run(["psql", f"{PG}/{db}", "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql],
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"psql failed: {out.stderr.strip()}")
    return out.stdout.strip()


def flask(env: dict, *args: str, timeout: int = 300) -> str:
    out = subprocess.run([str(BIN / "flask"), *args], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"flask {' '.join(args)} failed: {out.stderr.strip()[-2000:]}")
    return out.stdout.strip()


def recreate_database(env: dict, work: Path) -> None:
    psql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    psql(f"CREATE DATABASE {DB_NAME}")
    subprocess.run(["redis-cli", "-u", REDIS_URL, "FLUSHDB"], check=True, capture_output=True,
                   timeout=30)
    flask(env, "db", "upgrade", "heads")


def start_nginx(ports: dict, work: Path):
    tmp = work / "nginx-tmp"
    tmp.mkdir(exist_ok=True)
    module = json.dumps(MODULE_ANSWER, separators=(",", ":"))
    chat = json.dumps(CHAT_ANSWER, separators=(",", ":"))
    conf = f"""
worker_processes 2;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 75s;
    upstream fake_upstream {{ server 127.0.0.1:{ports['upstream']}; keepalive 64; }}
    # The fake upstream: fixed JSON, nothing read from disk.
    server {{
        listen 127.0.0.1:{ports['upstream']};
        default_type application/json;
        location /v1/chat/completions {{ return 200 '{chat}'; }}
        location / {{ return 200 '{module}'; }}
    }}
    # The `nginx` scenario: a reverse proxy in front of the same upstream.
    server {{
        listen 127.0.0.1:{ports['proxy']};
        location / {{
            proxy_pass http://fake_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""
    path = work / "nginx.conf"
    path.write_text(conf)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = RUNNING.start([nginx, "-e", work / "nginx-error.log", "-c", path], name="nginx",
                         log=work / "nginx.out", grace=GRACE)
    proc.wait_http(f"http://127.0.0.1:{ports['upstream']}/", timeout=20)
    proc.wait_http(f"http://127.0.0.1:{ports['proxy']}/", timeout=20)
    return proc


def start_gunicorn(env: dict, ports: dict, work: Path):
    proc = RUNNING.start([BIN / "gunicorn", "-c", ROOT / "deploy" / "gunicorn.conf.py", "bench.passthrough.wsgi:app"],
                         name="gunicorn", env=env, cwd=ROOT, log=work / "gunicorn.log", grace=GRACE)
    proc.wait_http(f"http://127.0.0.1:{ports['gunicorn']}/api/account", timeout=60)
    # every worker must be up before measuring (idle RSS, no first-request import cost)
    for _ in range(100):
        workers = proc.children()
        if len(workers) >= gunicorn_settings(env)["workers"]:
            break
        import time
        time.sleep(0.2)
    return proc


def start_jobs(env: dict, work: Path) -> list:
    """The deployment's other two processes (deploy/Procfile): the RQ worker and the
    scheduler, so the periodic jobs run during the run as in production — above all the
    usage roll (every 60 s), which bounds the call-log tail the usage reads aggregate."""
    procs_ = [RUNNING.start([BIN / "flask", name], name=name, env=env, cwd=ROOT, log=work / f"{name}.log",
                            grace=GRACE) for name in ("worker", "scheduler")]
    for proc in procs_:
        if not proc.wait_output("scheduler started" if proc.name == "scheduler" else "Listening on",
                                timeout=60):
            raise RuntimeError(f"flask {proc.name} did not start: {proc.output()[-2000:]}")
    return procs_


def gunicorn_settings(env: dict) -> dict:
    code = ("import runpy, json; c = runpy.run_path('deploy/gunicorn.conf.py'); "
            "print(json.dumps({k: c[k] for k in ('workers', 'worker_class', 'worker_connections', 'keepalive', 'timeout')}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=30, check=True)
    return json.loads(out.stdout)


def openapi_paths(ports: dict) -> dict:
    status, body = procs.http(f"http://127.0.0.1:{ports['gunicorn']}/openapi.json")
    if status != 200:
        raise RuntimeError(f"/openapi.json answered {status}")
    return json.loads(body)["paths"]


def pg_backend_pids() -> list[int]:
    """Server processes of connections to the bench database (root can read their /proc)."""
    try:
        out = psql(f"SELECT pid FROM pg_stat_activity WHERE datname = '{DB_NAME}' "
                   "AND pid <> pg_backend_pid()")
    except RuntimeError:
        return []
    return [int(x) for x in out.split()]


def _version(cmd: list[str], pattern: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout + out.stderr).strip()
    if pattern:
        import re
        m = re.search(pattern, text)
        return m.group(1) if m else None
    return text.splitlines()[0] if text else None


def loadavg() -> str:
    """1/5/15-minute load average: other work on the machine makes every figure noisier."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 0


def _pkg_version(python: Path, pkg: str) -> str | None:
    if not python.exists():
        return None
    return _version([str(python), "-c", f"import importlib.metadata as m; print(m.version({pkg!r}))"])


def metadata(env: dict, gunicorn, duration: int, warmup: int, concurrency: list[int]) -> dict:
    portkey_pkg = ROOT / "bench" / ".node" / "node_modules" / "@portkey-ai" / "gateway" / "package.json"
    return {
        "generated_at": __import__("datetime").datetime.now(__import__("datetime").timezone.utc)
        .strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"nproc": os.cpu_count(), "memory_mib": _mem_total_mib(), "cpu": _cpu_model(),
                    "kernel": platform.release(), "loadavg_end": loadavg()},
        "versions": {
            "python": platform.python_version(),
            "gunicorn": _pkg_version(Path(sys.executable), "gunicorn"),
            "flask": _pkg_version(Path(sys.executable), "flask"),
            "nginx": _version([shutil.which("nginx") or "/usr/sbin/nginx", "-v"], r"nginx/(\S+)"),
            "wrk": _version(["wrk", "-v"], r"wrk (\S+)"),
            "postgresql": psql("SHOW server_version"),
            "redis": _version(["redis-server", "--version"], r"v=(\S+)"),
            "node": _version(["node", "--version"]),
            "litellm": _pkg_version(ROOT / "bench" / ".venv-litellm" / "bin" / "python", "litellm"),
            "portkey_gateway": json.loads(portkey_pkg.read_text())["version"] if portkey_pkg.exists() else None,
        },
        "settings": {"gunicorn": gunicorn_settings(env), "duration_s": duration, "warmup_s": warmup,
                     "concurrency": concurrency, "wrk_threads": 1, "app_env": "production",
                     "database": f"PostgreSQL {DB_NAME} (local server)", "redis": REDIS_URL},
    }


def drop_cached_state() -> None:
    """Nothing persistent is left running; the database stays for inspection until the next run."""
    return None
