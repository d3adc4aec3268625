"""Deployment files: nginx accepts both configurations, the local one cannot drift from
production, and gunicorn's production config reports metrics summed over its workers."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.apps import ROOT, VENV_BIN, app_env
from tests.support.procs import Proc, free_port

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (deploy/system-packages.sh)")

sys.path.insert(0, str(ROOT / "deploy"))
import render_nginx  # noqa: E402


def _nginx_t(conf_path, prefix) -> subprocess.CompletedProcess:
    return subprocess.run([NGINX, "-t", "-p", str(prefix), "-c", str(conf_path), "-e",
                           str(prefix / "error.log")], capture_output=True, text=True, timeout=30)


@needs_nginx
def test_rendered_serve_config_is_valid(tmp_path):
    conf = tmp_path / "nginx.conf"
    (tmp_path / "logs").mkdir()
    (tmp_path / "tmp").mkdir()
    conf.write_text(render_nginx.render(str(tmp_path), 18080, 18081, "127.0.0.1:18001", 2_000_000))
    out = _nginx_t(conf, tmp_path)
    assert out.returncode == 0, out.stderr
    text = conf.read_text()
    assert "client_max_body_size 2000000;" in text and "server 127.0.0.1:18001;" in text
    assert "listen 127.0.0.1:18081;" in text and "/var/log/nginx" not in text


@needs_nginx
def test_production_site_is_valid(tmp_path):
    """deploy/nginx.conf as Debian includes it (inside http {}), log paths redirected."""
    site = (ROOT / "deploy" / "nginx.conf").read_text().replace("/var/log/nginx/", f"{tmp_path}/")
    conf = tmp_path / "nginx.conf"
    conf.write_text(textwrap.dedent(f"""\
        pid {tmp_path}/nginx.pid;
        events {{ worker_connections 64; }}
        http {{
            client_body_temp_path {tmp_path}/cb; proxy_temp_path {tmp_path}/px;
            fastcgi_temp_path {tmp_path}/fc; uwsgi_temp_path {tmp_path}/uw; scgi_temp_path {tmp_path}/sc;
        """) + site + "\n}\n")
    out = _nginx_t(conf, tmp_path)
    assert out.returncode == 0, out.stderr
    for directive in ("server_tokens off;", "proxy_buffering off;", "keepalive 32;",
                      "client_max_body_size 1m;", "proxy_set_header X-Request-Id $gw_request_id;",
                      "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
                      "server_name api.example.com;", "server_name chat.example.com;",
                      "# ssl_certificate "):
        assert directive in site, directive


def test_render_refuses_a_drifted_production_file():
    site = (ROOT / "deploy" / "nginx.conf").read_text().replace("server 127.0.0.1:8000;", "server app:8000;")
    with pytest.raises(SystemExit, match="server 127.0.0.1:8000"):
        render_nginx.render("/tmp/x", 1, 2, "127.0.0.1:3", 10, site_text=site)


def _count(text: str, route: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gateway_http_requests_total" and s.labels.get("route") == route \
                    and s.labels.get("status") == "200":
                return s.value
    return 0.0


def test_gunicorn_production_config_sums_metrics_over_workers(app, tmp_path):
    env = app_env(app.config)
    port = free_port()
    env.update({"GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "3",
                "GUNICORN_GRACEFUL_TIMEOUT": "5", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")})
    env.pop("METRICS_TOKEN", None)
    (tmp_path / "prom").mkdir()
    # A metric file of a process that no longer exists: dropped when the master starts.
    stale = tmp_path / "prom" / "counter_999999999.db"
    stale.write_bytes(b"")
    proc = Proc([VENV_BIN / "gunicorn", "-c", "deploy/gunicorn.conf.py", "wsgi:app"], cwd=ROOT, env=env,
                log=tmp_path / "gunicorn.log", grace=15)
    base = f"http://127.0.0.1:{port}"
    with proc:
        proc.wait_http(base + "/healthz")
        n = 60
        for _ in range(n):  # a new connection each time: spread over the workers
            assert requests.get(base + "/healthz", headers={"Connection": "close"}).status_code == 200
        pids = {p.name.rsplit("_", 1)[-1] for p in (tmp_path / "prom").glob("counter_*.db")}
        text = requests.get(base + "/metrics").text
        # + the one successful probe of wait_http.
        assert _count(text, "/healthz") == n + 1, (pids, text[:500])
        assert not stale.exists()
    assert proc.returncode == 0, proc.output()[-2000:]


def test_gunicorn_freezes_the_loaded_app_for_the_garbage_collector():
    """The loaded app's objects go to the permanent generation before forking and once a
    worker has loaded it: a full collection then scans only what requests created (a
    gen-2 pass over the unfrozen app took ~120 ms in a worker: the usage reads' p99)."""
    code = textwrap.dedent("""\
        import gc, runpy
        conf = runpy.run_path("deploy/gunicorn.conf.py")
        import app  # noqa: F401  (what preload imports)
        assert gc.get_freeze_count() == 0
        conf["pre_fork"](None, None)
        frozen = gc.get_freeze_count()
        assert frozen > 10_000, frozen
        import app.services.billing.usage  # noqa: F401  (loaded later, in the worker)
        conf["post_worker_init"](None)
        assert gc.get_freeze_count() >= frozen
        print("ok", frozen)
        """)
    out = subprocess.run([str(VENV_BIN / "python"), "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr


def test_gunicorn_loads_the_lazy_dependencies_before_forking():
    """What the app loads on first use (app/preload.py: the ORM's mappers, the chat
    tokenizers, eth_account and x402's EVM types, the mcp server) is loaded in the master
    (preload) before the first fork, so the workers share it: loaded lazily, each worker's
    first metered call took ~1 s, its first chat request ~2.2 s and its first x402 payment
    ~2.1 s, each worker holding its own copy. Without preload, each worker loads them before
    it serves."""
    code = textwrap.dedent("""\
        import runpy, sys
        from types import SimpleNamespace as NS
        conf = runpy.run_path("deploy/gunicorn.conf.py")
        from app import preload
        from app.services.chat import tokens

        from sqlalchemy import inspect
        from app.models import ApiKey

        def loaded():
            return (bool(tokens._encodings) and all(m in sys.modules for m in preload.MODULES)
                    and inspect(ApiKey).configured)

        assert not loaded()
        conf["on_starting"](NS(cfg=NS(preload_app=False, reuse_port=False)))
        assert not loaded()
        conf["on_starting"](NS(cfg=NS(preload_app=True, reuse_port=False)))
        assert set(tokens._encodings) == {"o200k_base", "cl100k_base"}, tokens._encodings
        assert loaded() and "x402.mechanisms.evm.types" in preload.MODULES
        tokens._encodings.clear()
        conf["post_worker_init"](NS(cfg=NS(preload_app=True)))
        assert not tokens._encodings
        conf["post_worker_init"](NS(cfg=NS(preload_app=False)))
        assert set(tokens._encodings) == {"o200k_base", "cl100k_base"}, tokens._encodings
        import threading
        assert threading.active_count() == 1, threading.enumerate()  # a fork must inherit no thread
        print("ok")
        """)
    out = subprocess.run([str(VENV_BIN / "python"), "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr


@pytest.mark.parametrize("accesslog,enabled", [(None, "False"), ("-", "True")])
def test_gunicorn_builds_access_lines_only_when_asked(accesslog, enabled):
    """The JSON log config (production) would switch gunicorn's access log on by itself,
    and gunicorn would then build every response's log atoms for a logger that drops
    them; the config's logger keeps it off unless GUNICORN_ACCESSLOG asks for it."""
    code = textwrap.dedent("""\
        import runpy
        from gunicorn.config import Config
        conf = runpy.run_path("deploy/gunicorn.conf.py")
        cfg = Config()
        for name in ("logconfig_dict", "accesslog", "logger_class"):
            if conf.get(name) is not None:
                cfg.set(name, conf[name])
        assert cfg.logconfig_dict
        print(cfg.logger_class(cfg).access_log_enabled)
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "APP_ENV": "production", "LOG_JSON": "1"}
    env.pop("GUNICORN_ACCESSLOG", None)
    if accesslog:
        env["GUNICORN_ACCESSLOG"] = accesslog
    out = subprocess.run([str(VENV_BIN / "python"), "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == enabled, out.stderr


@pytest.mark.parametrize("path", [None, "/run/gateway/gunicorn.ctl"])
def test_gunicorn_control_socket_only_where_asked(path):
    """gunicorn 27 opens a control socket at one per-user default ($HOME/.gunicorn/gunicorn.ctl):
    every gunicorn of a user on the host (make serve, make run, a second site) unlinked the
    previous one's and listened there, so a control command reached whichever started last;
    under systemd (ProtectHome) it logged "Failed to start control socket" at every start.
    Off unless GUNICORN_CONTROL_SOCKET names a path."""
    code = textwrap.dedent("""\
        import runpy
        from gunicorn.config import Config
        conf = runpy.run_path("deploy/gunicorn.conf.py")
        cfg = Config()
        for name in ("control_socket", "control_socket_disable"):
            if name in conf:
                cfg.set(name, conf[name])
        print(cfg.control_socket_disable, cfg.control_socket)
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GUNICORN_CONTROL_SOCKET", None)
    if path:
        env["GUNICORN_CONTROL_SOCKET"] = path
    out = subprocess.run([str(VENV_BIN / "python"), "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=env)
    disabled, socket = out.stdout.split()
    assert out.returncode == 0 and disabled == str(path is None), out.stderr
    assert path is None or socket == path


def test_gunicorn_refuses_a_port_another_process_listens_on(tmp_path):
    """With reuse_port (SO_REUSEPORT) a second gunicorn of the same user binds a port another
    one already listens on, and the kernel spreads the connections over both: `make serve`
    with SERVE_APP_PORT on another engineer's gunicorn said "ready" (its /readyz partly
    answered by the other server) and served part of the other's traffic. It refuses to start."""
    import socket

    port = free_port()
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", port))
    other.listen()
    (tmp_path / "tiny.py").write_text("def app(environ, start_response):\n"
                                      "    start_response('200 OK', [])\n    return [b'ok']\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1",
           "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    env.pop("GUNICORN_REUSE_PORT", None)
    proc = subprocess.Popen([str(VENV_BIN / "gunicorn"), "-c", str(ROOT / "deploy/gunicorn.conf.py"), "tiny:app"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    finally:
        other.close()
    assert proc.returncode == 1, out[-2000:]
    assert f"127.0.0.1:{port} is already in use" in out, out[-2000:]


@pytest.mark.parametrize("unit", ["gateway-web.service", "gateway-worker@.service", "gateway-scheduler.service"])
def test_every_process_of_new_code_starts_after_the_migration(unit):
    """The deploy command restarts gateway-migrate with the others (docs/operations.md); only
    the web unit was ordered after it, so workers and the scheduler ran new code's jobs on
    the old schema while the migration ran (After= on a unit outside the transaction, on a
    host without migrations, orders nothing: harmless there)."""
    import configparser

    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(ROOT / "deploy" / "systemd" / unit)
    assert "gateway-migrate.service" in parser["Unit"]["After"].split()
