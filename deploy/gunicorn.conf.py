"""gunicorn settings for production (``gunicorn -c deploy/gunicorn.conf.py wsgi:app``).

Every value can be overridden from the environment:

* ``GUNICORN_BIND`` (default ``127.0.0.1:$PORT``, PORT default 8000) — loopback only:
  nginx in front terminates TLS and talks to it over a keep-alive upstream.
* ``WEB_CONCURRENCY`` workers (default: CPU count, at least 2) of gunicorn's own ``gevent``
  worker, each serving up to ``GUNICORN_WORKER_CONNECTIONS`` client connections at once
  (default 1,000), one greenlet per connection: requests mostly wait on PostgreSQL, Redis
  and upstream providers, and a greenlet waits without a thread. A worker's concurrency is
  no longer its thread count (gthread's 8): a slow provider or a long chat stream holds a
  greenlet, not one of 8 threads, and a call hands nothing to other threads (gthread's
  poller and pool, the open's group leader, the finalize writer were OS-thread hand-offs:
  15–18 context switches per metered call against 6–9 for a bare route; bench/DIARY.md).
  The database stays a fixed pool per process (``DB_POOL_SIZE``): greenlets wait for a
  connection, they never open one each.
  Monkey-patching: the standard library is patched at the top of this file, before the app
  is imported and preloaded in the master (psycopg picks its gevent-friendly wait only if
  ``select`` is already patched when it is imported); gunicorn's worker patches again after
  the fork, which changes nothing. ``flask`` commands, the RQ worker and the tests that build
  the app in-process run unpatched, on threads: the app's code is written for both (locks,
  events and conditions of ``threading``; per-process free lists, not thread-locals, for
  connections kept across requests). asyncio: the MCP door's loop runs in a greenlet of the
  worker's one OS thread, and asyncio allows one running loop per OS thread, so no other
  request may start one (``asyncio.run``): SIWX drives its coroutines without a loop
  (``app/services/agents/siwx.py``). CPU-bound work (tokenizing a long prompt, a PDF's page
  count) holds the worker's other requests while it runs, as it held the GIL before.
* ``GUNICORN_REUSE_PORT`` (default on): gunicorn's ``reuse_port``: each worker opens its
  own ``SO_REUSEPORT`` listening socket and the kernel spreads new connections over them.
  With one shared socket a burst of keep-alive connections (wrk's 16, nginx opening its
  upstream pool) could all land on the one worker that happened to be running and stay
  there, capped at one core by its GIL (bench/DIARY.md, "Connections spread over the
  workers"). Trade-off: a connection still queued on a worker's socket when that worker
  exits (a stop, a restart, ``max_requests``) is reset instead of going to another
  worker; nginx answers that request 502. Since SO_REUSEPORT would also let a second
  gunicorn of the same user share a port another one listens on, a port in use refuses to
  start (``refuse_a_shared_port``).
* ``GUNICORN_TIMEOUT`` (default 120 s): the worker heartbeat timeout. The gevent worker
  beats from its own greenlet, so a long streaming response does not trip it; it only kills
  a worker wedged in CPU or in a call that blocks without yielding.
* ``GUNICORN_GRACEFUL_TIMEOUT`` (default 30 s): on SIGTERM/SIGHUP, workers finish the
  requests in flight (streams included, up to this limit) before exiting, and then write
  the metered calls their finalize writer still holds (``money/charging.py``, up to
  ``DRAIN_SECONDS`` = 10 s, at exit): keep this above 10 s, or answered calls are left
  for the sweep to refund.
* ``GUNICORN_PRELOAD`` (default on): the app is imported once in the master and forked.
  Safe here: ``create_app`` opens no connection (SQLAlchemy and Redis connect lazily,
  and each forked worker drops the pool inherited from the master: app/services/platform/dbpool.py), and the
  per-process threads of ``app/auth.py`` (revocation subscriber, ``last_used_at``
  flusher) start lazily on the first authenticated request of each worker (they check
  the pid), so every forked worker starts its own. Trade-off: ``kill -HUP`` re-forks
  workers from the preloaded code; deploy new code with a full restart
  (``systemctl restart gateway-web``), not a HUP.
* ``GUNICORN_MAX_REQUESTS`` (default 0 = off) with jitter: recycle workers.
* ``GUNICORN_CONTROL_SOCKET`` (default unset = off): the path of gunicorn's control socket
  (``gunicornc``). gunicorn 27 opens one by default at ``$HOME/.gunicorn/gunicorn.ctl``,
  one path per user: every gunicorn of that user on the host unlinked the previous one's.
* ``PROMETHEUS_MULTIPROC_DIR`` (default ``$INSTANCE_PATH/prometheus`` or
  ``/tmp/gateway-prometheus``): set here *before* the app is imported so that every
  worker writes its figures to files there and ``/metrics`` sums them. Files of
  processes that are gone are removed when the master starts (those of a still-running
  ``flask worker`` sharing the directory are kept); live-gauge files of a worker that
  exits are removed by ``child_exit``.

* Lazy dependencies (``app/preload.py``: the ORM's mappers, the chat tokenizers,
  ``eth_account`` and x402's EVM types, the ``mcp`` server; ~4 s of CPU on an idle host and ~210 MiB) are
  loaded in the master before the first fork (``on_starting``; without preload, in each
  worker before it serves), not on a worker's first metered call, chat, x402 or MCP request
  (1.0–1.3 s, 2.2 s, 2.1 s and 0.75 s under ``make run``; 0.08–0.3 s after).

* Garbage collector: the objects of the loaded app (~240,000: modules, SQLAlchemy
  metadata, marshmallow schemas, the OpenAPI spec) are moved to the collector's permanent
  generation (``gc.freeze()``) in the master before each fork (preload) and in each worker
  once it has loaded the app (``post_worker_init``), so a full collection scans only what
  requests created: a gen-2 pass over the whole app took ~120 ms in a worker (the p99 of
  the usage reads), ~6 ms frozen (bench/DIARY.md, "Usage reads"). Frozen objects are
  never freed — they live as long as the process anyway.

Logging: the app writes its own JSON access line per request (``gateway.access``), so
gunicorn's access log is off unless ``GUNICORN_ACCESSLOG`` is set; gunicorn's own
messages go to stderr (JSON when ``LOG_JSON``/production).
"""
from gevent import monkey

# Before anything else of the app is imported (the app is preloaded in this process):
# psycopg picks its cooperative wait only if ``select`` is patched when it is imported.
monkey.patch_all()

import errno  # noqa: E402
import gc
import glob
import multiprocessing
import os
import re
import socket

from gunicorn import glogging

bind = os.environ.get("GUNICORN_BIND", f"127.0.0.1:{os.environ.get('PORT', '8000')}")
workers = int(os.environ.get("WEB_CONCURRENCY", max(2, multiprocessing.cpu_count())))
worker_class = "gevent"
worker_connections = int(os.environ.get("GUNICORN_WORKER_CONNECTIONS", 1000))
reuse_port = os.environ.get("GUNICORN_REUSE_PORT", "1").lower() not in ("0", "false", "no", "off")
timeout = int(os.environ.get("GUNICORN_TIMEOUT", 120))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", 30))
# gunicorn 27's control socket: off unless GUNICORN_CONTROL_SOCKET names a path (its default,
# $HOME/.gunicorn/gunicorn.ctl, is one per user: each gunicorn on the host took it over).
control_socket_disable = not os.environ.get("GUNICORN_CONTROL_SOCKET")
if not control_socket_disable:
    control_socket = os.environ["GUNICORN_CONTROL_SOCKET"]
# Longer than nginx's upstream keepalive_timeout (60 s), so nginx always closes first
# and never reuses a connection gunicorn has just dropped.
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", 75))
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", 0))
max_requests_jitter = max(0, max_requests // 10)
preload_app = os.environ.get("GUNICORN_PRELOAD", "1").lower() not in ("0", "false", "no", "off")
accesslog = os.environ.get("GUNICORN_ACCESSLOG")  # e.g. "-"; the app logs access lines itself
errorlog = "-"
proc_name = "gateway-web"
# Heartbeat files on tmpfs, so a slow disk cannot make the master think workers hung.
if os.path.isdir("/dev/shm"):
    worker_tmp_dir = "/dev/shm"
# The request line and headers: generous but bounded (bodies are bounded by nginx and
# MAX_BODY_BYTES).
limit_request_line = 8190
limit_request_fields = 100

_production = os.environ.get("APP_ENV") == "production"
if os.environ.get("LOG_JSON", "1" if _production else "0").lower() in ("1", "true", "yes", "on"):
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        # The app adds its own root handler (request context, redaction): none here.
        "root": {"level": "INFO", "handlers": []},
        "formatters": {"json": {"()": "app.logs.JsonFormatter"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json",
                                 "stream": "ext://sys.stderr"}},
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": ["console"], "propagate": False},
            # Setting logconfig_dict turns gunicorn's access log on; keep it quiet unless
            # asked for (the app's gateway.access line has the route, ids and duration).
            "gunicorn.access": {"level": "INFO" if accesslog else "WARNING", "handlers": ["console"],
                                "propagate": False},
        },
    }



class _GatewayLogger(glogging.Logger):
    """gunicorn's logger with its access log off unless ``GUNICORN_ACCESSLOG`` asks for
    it: ``logconfig_dict`` alone switches it on, and gunicorn then builds every
    response's log atoms (~1.4 % of a metered call's CPU) for a logger that drops them."""

    def _compute_access_log_enabled(self):
        return bool(accesslog) and super()._compute_access_log_enabled()


logger_class = _GatewayLogger

# --- Prometheus multiprocess directory (before the app, hence prometheus_client, loads) --
_prom_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.path.join(
    os.environ.get("INSTANCE_PATH", "/tmp"), "prometheus" if os.environ.get("INSTANCE_PATH")
    else "gateway-prometheus")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _prom_dir
os.makedirs(_prom_dir, exist_ok=True)

_PID_IN_NAME = re.compile(r"_(\d+)\.db$")


def process_exists(pid: int) -> bool:
    """The process exists (a zombie not yet reaped counts; another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def refuse_a_shared_port(server) -> None:
    """With ``reuse_port`` the kernel lets this gunicorn bind a port another process of the
    same user already listens on with SO_REUSEPORT (another gunicorn) and spreads the
    connections over both: two servers, one port, no error. Bind each TCP address once
    without SO_REUSEPORT first; a port in use refuses to start. Not when the sockets are
    inherited (a USR2 re-exec: GUNICORN_FD; systemd socket activation: LISTEN_FDS)."""
    if not server.cfg.reuse_port or os.environ.get("GUNICORN_FD") or os.environ.get("LISTEN_FDS"):
        return
    for address in server.cfg.address:
        if not isinstance(address, tuple):
            continue  # a Unix socket path: never shared this way
        probe = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise RuntimeError(f"{address[0]}:{address[1]} is already in use by another process: pick another "
                               "GUNICORN_BIND (make serve: SERVE_APP_PORT) or stop that process") from None
        finally:
            probe.close()


def on_starting(server):
    """Refuse a port already in use (above); drop metric files left by processes that no
    longer exist (a previous run); with preload, load what the app otherwise loads on first
    use (``app/preload.py``: the ORM's mappers, the chat tokenizers, the x402/signature and
    MCP libraries) once here, so the workers share one copy and no worker's first request of
    a kind waits seconds for it. Here, not later: gunicorn tells systemd READY after this."""
    refuse_a_shared_port(server)
    for path in glob.glob(os.path.join(_prom_dir, "*.db")):
        m = _PID_IN_NAME.search(path)
        if m and not process_exists(int(m.group(1))):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    if server.cfg.preload_app:
        load_lazy_dependencies()


def load_lazy_dependencies() -> None:
    from app import preload

    preload.load()


def when_ready(server):
    """Master, before the first fork: with ``reuse_port`` name the address (gunicorn's own
    "Listening at" line names none then: each worker opens its own socket)."""
    if server.cfg.reuse_port and not server.LISTENERS:
        server.log.info("Each worker listens at: %s (reuse_port)", ",".join(
            f"{a[0]}:{a[1]}" if isinstance(a, tuple) else str(a) for a in server.cfg.address))


def pre_fork(server, worker):
    """Master, before forking a worker: freeze the preloaded app's objects (see above),
    so no worker's full collection ever scans them (nor dirties their pages)."""
    gc.collect()
    gc.freeze()


def post_worker_init(worker):
    """Worker, app loaded (preloaded or not): without preload, load the lazy dependencies
    before serving (``on_starting``); freeze what loading created."""
    if worker is not None and not worker.cfg.preload_app:
        load_lazy_dependencies()
    gc.freeze()


def child_exit(server, worker):
    """A worker exited: its live-gauge files must not be summed any more."""
    try:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
    except Exception:
        pass
