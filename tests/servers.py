"""Helpers for tests that run real processes (gunicorn, RQ workers, stand-in servers)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            requests.get(url, timeout=1)
            return
        except Exception as exc:  # noqa: BLE001
            last = exc
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up: {last}")


def app_env(cfg: dict) -> dict:
    """Environment for a child process running the app with the test config ``cfg``."""
    env = dict(os.environ)
    env.update({
        "APP_ENV": "test",
        "DATABASE_URL": cfg["SQLALCHEMY_DATABASE_URI"],
        "INSTANCE_PATH": cfg["INSTANCE_PATH"],
        "MAIL_OUTBOX_DIR": cfg.get("MAIL_OUTBOX_DIR", ""),
        "ALLOW_PRIVATE_URLS": "1",
        "RATELIMIT_KEY_PREFIX": cfg["RATELIMIT_KEY_PREFIX"],
        "PYTHONPATH": str(ROOT),
    })
    if cfg.get("REDIS_URL"):
        env["REDIS_URL"] = cfg["REDIS_URL"]
    else:
        env.pop("REDIS_URL", None)
    return env


@contextmanager
def _terminating(proc: subprocess.Popen):
    """Terminate ``proc`` on exit (kill it if it does not stop within 10 s)."""
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def gunicorn(env: dict, workers: int = 1, threads: int = 4, port: int | None = None):
    """Run ``gunicorn wsgi:app`` on loopback; yields its base URL."""
    port = port or free_port()
    proc = subprocess.Popen(
        [str(VENV_BIN / "gunicorn"), "-w", str(workers), "--threads", str(threads),
         "-b", f"127.0.0.1:{port}", "--graceful-timeout", "2", "wsgi:app"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    with _terminating(proc):
        wait_http(url + "/openapi.json")
        yield url


@contextmanager
def http_server(handler_cls: type[BaseHTTPRequestHandler]):
    """Serve ``handler_cls`` on a loopback port in a thread; yields (server, base_url)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _MailSink:
    """aiosmtpd handler collecting received messages."""

    def __init__(self):
        self.messages = []  # list of email.message.EmailMessage

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd API
        from email import message_from_bytes
        from email.policy import default

        msg = message_from_bytes(envelope.content, policy=default)
        self.messages.append(msg)
        return "250 OK"


@contextmanager
def smtp_server():
    """A real SMTP server (aiosmtpd) on loopback; yields (sink, "smtp://127.0.0.1:<port>")."""
    from aiosmtpd.controller import Controller

    sink = _MailSink()
    port = free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield sink, f"smtp://127.0.0.1:{port}"
    finally:
        controller.stop()


class Recorder(BaseHTTPRequestHandler):
    """HTTP handler that records requests; subclass and set ``statuses`` (a list of status
    codes to answer in turn; the last one repeats)."""

    statuses = [200]
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        cls = type(self)
        cls.received.append({"path": self.path, "headers": dict(self.headers), "body": body})
        status = cls.statuses[min(len(cls.received) - 1, len(cls.statuses) - 1)]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def recorder(statuses=(200,)) -> type[Recorder]:
    """A fresh Recorder subclass with its own ``received`` list."""
    return type("Rec", (Recorder,), {"statuses": list(statuses), "received": []})


@contextmanager
def nginx(upstreams: list[str], *, extra_http: str = ""):
    """A real nginx (Debian package) on a free loopback port load-balancing round-robin
    over ``upstreams`` (``http://127.0.0.1:PORT`` URLs); yields its base URL."""
    import shutil
    import tempfile

    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    prefix = tempfile.mkdtemp(prefix="gw-nginx-")
    port = free_port()
    servers = "\n".join(f"    server {u.split('://', 1)[1]};" for u in upstreams)
    conf = f"""
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  upstream app {{
{servers}
    keepalive 16;
  }}
  {extra_http}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_next_upstream off;
    }}
  }}
}}
"""
    path = os.path.join(prefix, "nginx.conf")
    with open(path, "w") as fh:
        fh.write(conf)
    proc = subprocess.Popen([binary, "-p", prefix, "-c", path], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    with _terminating(proc):
        wait_http(url + "/openapi.json")
        yield url
