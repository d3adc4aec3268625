"""The gateway's own processes for tests and harnesses, on the process helper: its
environment (``app_env``), gunicorn, an RQ worker, nginx in front of several nodes, and a
real SMTP server (aiosmtpd) collecting mail."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import Proc, free_port

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
START_SECONDS = 90  # how long a test waits for a server it started to answer


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
    for name in ("REDIS_URL", "X402_FACILITATOR_URL"):  # the facilitator: the tests' stand-in
        if cfg.get(name):
            env[name] = cfg[name]
        else:
            env.pop(name, None)
    return env


def fresh_database(suffix: str) -> str:
    """The URL of an empty database next to the test database (``<test db>_<suffix>``,
    created or emptied): for child processes that migrate and fill their own."""
    from sqlalchemy.engine import make_url

    from tests.support.workers import empty_database, relax_durability

    url = make_url(os.environ["DATABASE_URL"]).set(drivername="postgresql")
    fresh = url.set(database=f"{url.database}_{suffix}").render_as_string(hide_password=False)
    empty_database(fresh)
    relax_durability(fresh)
    return fresh


def gunicorn_proc(env: dict, *, workers: int = 1, port: int | None = None,
                  log: str | Path | None = None, grace: float = 10.0,
                  graceful_timeout: float = 2, args: tuple[str, ...] = (),
                  module: str = "wsgi:app") -> tuple[Proc, str]:
    """A (not yet started) ``gunicorn wsgi:app`` (or ``module``) on loopback and its base
    URL, in the production configuration (``deploy/gunicorn.conf.py``: gevent, reuse-port,
    the app preloaded in the master and forked, gc.freeze, JSON logs as configured) with
    the sizes and address given here; ``grace``: how long the test waits after SIGTERM,
    ``graceful_timeout``: gunicorn's own limit for a stopping worker before the master kills
    it; ``args``: more gunicorn options (they override the file's)."""
    port = port or free_port()
    proc = Proc([VENV_BIN / "gunicorn", "-c", str(ROOT / "deploy" / "gunicorn.conf.py"),
                 "-w", str(workers),
                 "-b", f"127.0.0.1:{port}", "--graceful-timeout", f"{graceful_timeout:g}", *args, module],
                name="gunicorn", env=env, cwd=ROOT, log=log, grace=grace)
    return proc, f"http://127.0.0.1:{port}"


@contextmanager
def gunicorn(env: dict, workers: int = 1, port: int | None = None,
             module: str = "wsgi:app"):
    """Run ``gunicorn wsgi:app`` (or ``module``) on loopback for the block; yields its base URL."""
    proc, url = gunicorn_proc(env, workers=workers, port=port, module=module)
    with proc:
        # only the wait's bound: on a loaded machine (parallel test workers beside other
        # work) importing the app in every worker has taken over 20 s
        proc.wait_http(url + "/openapi.json", timeout=START_SECONDS)
        yield url


def flask_worker(env: dict) -> Proc:
    """A real RQ worker process (``flask worker``), not yet started."""
    return Proc([sys.executable, "-m", "flask", "--app", "wsgi", "worker"], name="worker",
                env=env, cwd=ROOT)


class _MailSink:
    """aiosmtpd handler collecting received messages."""

    def __init__(self):
        self.messages = []  # list of email.message.EmailMessage
        self.refuse = False  # True: every recipient is refused (550), as a server refuses an unknown mailbox

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 - aiosmtpd API
        if self.refuse:
            return f"550 5.1.1 <{address}>: Recipient address rejected: User unknown"
        envelope.rcpt_tos.append(address)
        return "250 OK"

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


_NGINX_CONF = """
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


@contextmanager
def nginx(upstreams: list[str], *, extra_http: str = ""):
    """A real nginx (Debian package) on a free loopback port load-balancing round-robin
    over ``upstreams`` (``http://127.0.0.1:PORT`` URLs); yields its base URL."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    prefix = tempfile.mkdtemp(prefix="gw-nginx-")
    port = free_port()
    servers = "\n".join(f"    server {u.split('://', 1)[1]};" for u in upstreams)
    path = os.path.join(prefix, "nginx.conf")
    with open(path, "w") as fh:
        fh.write(_NGINX_CONF.format(prefix=prefix, servers=servers, extra_http=extra_http, port=port))
    url = f"http://127.0.0.1:{port}"
    with Proc([binary, "-p", prefix, "-c", path], name="nginx", log=os.path.join(prefix, "nginx.out")) as proc:
        proc.wait_http(url + "/openapi.json", timeout=START_SECONDS)
        yield url
