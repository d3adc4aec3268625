"""The one JSON stand-in server base of the tests and harnesses.

``StandIn`` is a threaded HTTP/1.1 server on a free loopback port. Routes map (method, path)
to handler functions taking a ``Request`` and returning ``(status, json)``,
``(status, json, headers)``, raw ``bytes`` (status 200, sent as they are) or a ``Reply``
(any status, body, headers, content type, or a streamed body). Every request is recorded
in ``requests``. Faults can be injected for the next requests or until cleared: a delay
before answering, a hang (no answer, then the connection closes), a connection reset, or
an error status. ``with StandIn() as url`` serves for the block; ``start``/``stop`` are the
explicit API and a stand-in can be started again after a stop.

``serve`` runs any ``BaseHTTPRequestHandler`` class the same way (for servers that are
not stand-ins, such as the demo LLM), and ``recorder`` is the common webhook receiver.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from requests.structures import CaseInsensitiveDict


@dataclass
class Request:
    """One request as the stand-in received it. ``target`` is the raw request target (path
    and query string), ``path`` the path alone; ``headers`` is case-insensitive."""

    method: str
    target: str
    headers: CaseInsensitiveDict
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query, keep_blank_values=True))

    def json(self):
        return json.loads(self.body) if self.body else None


@dataclass
class Reply:
    """A full answer: ``body`` is JSON-serialisable or bytes; ``chunks`` (bytes) are
    written and flushed one by one instead, then the connection closes."""

    status: int = 200
    body: object = None
    headers: dict = field(default_factory=dict)
    content_type: str = "application/json"
    chunks: Iterable[bytes] | None = None


@dataclass
class Fault:
    kind: str            # delay | hang | reset | status
    seconds: float = 0.0
    status: int = 503
    times: int | None = None  # None: until cleared


Handler = Callable[[Request], object]
FAULTS = ("delay", "hang", "reset", "status")


def _as_reply(out) -> Reply:
    if isinstance(out, Reply):
        return out
    if isinstance(out, (bytes, bytearray)):
        return Reply(200, bytes(out))
    if isinstance(out, tuple) and len(out) in (2, 3):
        return Reply(out[0], out[1], dict(out[2]) if len(out) == 3 else {})
    raise TypeError(f"a stand-in handler returned {type(out).__name__}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5: a burst of concurrent callers (three
    # gateway processes of 8 threads; 20 threads of one in the fifty-concurrent-calls test)
    # overflowed it on a loaded machine and the gateway answered 502s of our own making
    request_queue_size = 128


@contextmanager
def serve(handler_cls: type[BaseHTTPRequestHandler], ssl_context=None):
    """Serve ``handler_cls`` on a free loopback port in a thread; yields the base URL
    (``https://`` when an ``ssl.SSLContext`` is given: the socket is wrapped with it)."""
    server = _Server(("127.0.0.1", 0), handler_cls)
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class StandIn:
    """A JSON stand-in server; see the module docstring."""

    def __init__(self, routes: dict[tuple[str, str], Handler] | None = None):
        self.routes: list[tuple[str, str, Handler]] = []
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self.url: str | None = None
        self._serving = None
        for (method, path), fn in (routes or {}).items():
            self.route(method, path, fn)

    # -- declaring ------------------------------------------------------------------
    def route(self, method: str, path: str, fn: Handler | None = None):
        """Answer ``method`` (or ``*``) on ``path`` (exact, ``prefix*`` or ``*``) with ``fn``;
        usable as a decorator. The first matching route wins."""
        def add(f: Handler) -> Handler:
            self.routes.append((method.upper(), path, f))
            return f
        return add(fn) if fn is not None else add

    def inject(self, kind: str, *, seconds: float = 0.0, status: int = 503,
               times: int | None = None) -> None:
        """Misbehave on the next ``times`` requests (all, until ``clear_faults``, if None)."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}")
        with self.lock:
            self.faults = [Fault(kind, seconds, status, times)]

    def clear_faults(self) -> None:
        with self.lock:
            self.faults = []

    # -- serving --------------------------------------------------------------------
    def start(self) -> str:
        stand_in = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                stand_in._handle(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self._serving = serve(_Handler)
        self.url = self._serving.__enter__()
        return self.url

    def stop(self) -> None:
        if self._serving is not None:
            self._serving.__exit__(None, None, None)
            self._serving = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- one request ----------------------------------------------------------------
    def _next_fault(self) -> Fault | None:
        with self.lock:
            if not self.faults:
                return None
            fault = self.faults[0]
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.pop(0)
            return fault

    def _find(self, req: Request) -> Handler | None:
        for method, path, fn in self.routes:
            if method not in ("*", req.method):
                continue
            if path == "*" or path == req.path or (path.endswith("*") and req.path.startswith(path[:-1])):
                return fn
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        req = Request(h.command, h.path, CaseInsensitiveDict(h.headers.items()), h.rfile.read(length) if length else b"")
        with self.lock:
            self.requests.append(req)
        fault = self._next_fault()
        if fault is not None and fault.kind in ("hang", "reset"):
            if fault.kind == "hang":
                time.sleep(fault.seconds)
            else:  # RST instead of FIN
                h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            h.close_connection = True
            h.connection.close()
            return
        if fault is not None and fault.kind == "delay":
            time.sleep(fault.seconds)
        if fault is not None and fault.kind == "status":
            reply = Reply(fault.status, {"error": f"injected {fault.status}"})
        else:
            fn = self._find(req)
            reply = _as_reply(fn(req)) if fn else Reply(404, {"error": f"no route for {req.method} {req.path}"})
        try:
            self._write(h, reply)
        except OSError:
            pass  # the client gave up (timeout) or went away

    @staticmethod
    def _write(h: BaseHTTPRequestHandler, reply: Reply) -> None:
        h.send_response(reply.status)
        h.send_header("Content-Type", reply.content_type)
        for k, v in reply.headers.items():
            h.send_header(k, v)
        if reply.chunks is not None:
            h.send_header("Connection", "close")
            h.end_headers()
            for chunk in reply.chunks:
                h.wfile.write(chunk)
                h.wfile.flush()
            h.close_connection = True
            return
        if reply.body is None:
            data = b""
        elif isinstance(reply.body, (bytes, bytearray)):
            data = bytes(reply.body)
        else:
            data = json.dumps(reply.body).encode()
        if reply.status not in (204, 304):
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


def recorder(statuses=(200,)) -> StandIn:
    """A webhook receiver: answers every request with ``{}`` and the next of ``statuses``
    (the last repeats; reassign ``.statuses`` to change course); ``.requests`` records."""
    rec = StandIn()
    rec.statuses = list(statuses)

    @rec.route("*", "*")
    def _answer(req: Request):
        n = len(rec.requests)
        return rec.statuses[min(n - 1, len(rec.statuses) - 1)], {}

    return rec
