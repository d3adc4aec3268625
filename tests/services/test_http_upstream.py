"""The outbound layer's hot path (``platform.http.Upstream``: urllib3's pool directly, used by
the module forward and the chat providers): the same guarantees as the requests sessions —
SSRF pinning, mandatory timeouts, capped bodies, no redirects, no environment proxies, TLS
name checks — the same exceptions for the same failures, pooled keep-alive connections
shared by every thread, pool slots given back, and a CLIENT span only when tracing is on."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from app import telemetry
from app.services.chat import providers as llm_providers
from app.services.chat.catalog import Offer, Provider
from app.services.gateway import upstream
from app.services.platform import http
from tests import dnsstub
from tests.services.test_http import FORBIDDEN, _Big, tls_server  # noqa: F401 - fixture
from tests.support.procs import free_port, probe
from tests.support.standin import Reply, StandIn, serve



@pytest.fixture
def dns(monkeypatch):
    return dnsstub.install(monkeypatch)


def _fresh(allow_private_hosts: bool = True, **kw) -> http.Upstream:
    return http.Upstream("test", allow_private_hosts=allow_private_hosts, **kw)


def _get(client: http.Upstream, url: str, *, max_bytes: int = 1 << 20, **kw):
    resp = client.request(kw.pop("method", "GET"), url, headers=kw.pop("headers", {}),
                          timeout=kw.pop("timeout", 5), **kw)
    try:
        return resp, http.read_capped(resp, max_bytes)
    finally:
        http.release(resp)


# --- the SSRF policy on the new path ---------------------------------------------------

@pytest.mark.parametrize("url", [u for u in FORBIDDEN if "[" in u or u[7].isdigit()])
def test_forbidden_literals_refused_without_a_dial(monkeypatch, url):
    dialed = []
    monkeypatch.setattr(http, "_dial", lambda info, conn: dialed.append(info))
    with pytest.raises(http.AddressRefused):
        _fresh().request("GET", url, headers={}, timeout=2)
    assert dialed == []


def test_names_resolving_to_metadata_refused(dns, monkeypatch):
    dns.answers["meta.example"] = ["169.254.169.254"]
    monkeypatch.setattr(http, "_dial", lambda info, conn: pytest.fail("dialled"))
    with pytest.raises(http.AddressRefused):
        _fresh().request("GET", "http://meta.example/latest/meta-data", headers={}, timeout=2)


def test_loopback_only_when_private_hosts_are_allowed():
    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {"ok": True}))
    with rec as url:
        resp, body = _get(_fresh(True), url + "/x")
        assert resp.status == 200 and json.loads(body) == {"ok": True}
        with pytest.raises(http.AddressRefused):
            _fresh(False).request("GET", url + "/x", headers={}, timeout=5)
    assert len(rec.requests) == 1


def test_connection_goes_to_the_validated_address(dns, monkeypatch):
    """Resolved once, screened, and that address dialled; the next connection is screened
    again (the stand-in closes every connection)."""
    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {}, {"Connection": "close"}))
    with rec as url:
        port = int(url.rsplit(":", 1)[1])
        dns.answers["pinned.example"] = ["93.184.216.34", "127.0.0.1"]
        dialed, real_dial = [], http._dial

        def dial(info, conn):  # the "public" host is played by the local stand-in
            dialed.append(info[4][0])
            return real_dial((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)), conn)

        monkeypatch.setattr(http, "_dial", dial)
        client = _fresh(False)
        resp, _ = _get(client, f"http://pinned.example:{port}/hook", method="POST", body=b"x")
        assert resp.status == 200 and dialed == ["93.184.216.34"] and dns.lookups["pinned.example"] == 1
        assert rec.requests[0].headers["Host"] == f"pinned.example:{port}"
        with pytest.raises(http.AddressRefused):
            client.request("POST", f"http://pinned.example:{port}/hook", headers={}, body=b"x", timeout=5)
    assert len(rec.requests) == 1


def test_tls_checks_the_host_name_on_the_pinned_connection(dns, tls_server):  # noqa: F811
    port, ca, seen = tls_server
    dns.answers["pinned.test"] = ["127.0.0.1"]
    dns.answers["other.test"] = ["127.0.0.1"]
    client = _fresh(ca_certs=ca)
    resp, _ = _get(client, f"https://pinned.test:{port}/")
    assert resp.status == 200 and seen["sni"][-1] == "pinned.test" and seen["host"][-1] == f"pinned.test:{port}"
    with pytest.raises(requests.exceptions.SSLError):  # same address, certificate not for this name
        client.request("GET", f"https://other.test:{port}/", headers={}, timeout=5)
    with pytest.raises(requests.exceptions.SSLError):  # the default bundle does not trust it
        _fresh().request("GET", f"https://pinned.test:{port}/", headers={}, timeout=5)


# --- transport rules -------------------------------------------------------------------

def test_redirects_are_not_followed():
    rec = StandIn()
    rec.route("GET", "/start", lambda req: (302, {}, {"Location": "/target"}))
    rec.route("GET", "/target", lambda req: (200, {}))
    with rec as url:
        resp, _ = _get(_fresh(), url + "/start")
    assert resp.status == 302 and [r.path for r in rec.requests] == ["/start"]


def test_timeout_is_mandatory():
    with pytest.raises(ValueError, match="timeout"):
        _fresh().request("GET", "http://127.0.0.1:9/", headers={}, timeout=None)


def test_environment_proxies_are_ignored(monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {}))
    with rec as url:
        assert _get(http.Upstream("test-proxy", allow_private_hosts=True), url + "/x")[0].status == 200
    assert len(rec.requests) == 1


def test_headers_query_and_url_credentials_sent_as_requests_sends_them():
    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {}))
    mine = {"X-Test": "1"}
    with rec as url:
        base = url.replace("http://", "http://us%40er:p%3Ass@")
        _get(_fresh(), base + "/q?a=1", headers=mine, params={"q": "x y", "n": "2", "u": "é"})
        _get(_fresh(), url + "/plain", headers={"user-agent": "mine/1"}, params={})
    first, second = rec.requests
    assert first.target == "/q?a=1&q=x+y&n=2&u=%C3%A9"
    assert first.headers["User-Agent"] == http.USER_AGENT and first.headers["X-Test"] == "1"
    assert first.headers["Authorization"] == requests.auth._basic_auth_str("us@er", "p:ss")
    assert second.target == "/plain" and second.headers["User-Agent"] == "mine/1"
    assert "Authorization" not in second.headers
    assert mine == {"X-Test": "1"}  # the caller's dict is not modified


def test_response_cap_on_the_new_path():
    client = _fresh()
    with serve(_Big) as url:
        resp = client.request("GET", url, headers={}, timeout=5)
        with pytest.raises(http.ResponseTooLarge):
            http.read_capped(resp, 64 * 1024)
        http.release(resp)
        resp, body = _get(client, url, max_bytes=_Big.size)
        assert len(body) == _Big.size
        with pytest.raises(upstream.ProviderFailure, match="exceeds 1024 bytes") as exc:
            upstream.forward(method="POST", url=url, body={}, payload=b"{}", headers={}, timeout=5,
                             max_bytes=1024, allow_private_hosts=True)
    assert exc.value.kind == "error"


# --- the same exceptions as requests, and the same answers of the callers ---------------

def _scenario(kind: str, stack):
    """A URL that fails the way ``kind`` says."""
    if kind == "refused":
        return f"http://127.0.0.1:{free_port()}/x"
    if kind == "bad-url":
        return "http://exa mple.com:notaport/x"
    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {}))
    url = stack.enter_context(rec)
    if kind == "hang":
        rec.inject("hang", seconds=1.5)
    elif kind == "reset":
        rec.inject("reset")
    return url + "/x"


@pytest.mark.parametrize("kind", ["refused", "hang", "reset", "bad-url"])
def test_failures_raise_what_requests_raises(kind):
    from contextlib import ExitStack

    def failure(send):
        with ExitStack() as stack:
            url = _scenario(kind, stack)
            with pytest.raises(requests.RequestException) as exc:
                send(url)
            return type(exc.value)

    def via_session(url):
        with http.session("test", allow_private_hosts=True) as s:
            return s.get(url, timeout=(1, 0.5))

    via_requests = failure(via_session)
    via_urllib3 = failure(lambda url: _fresh().request("GET", url, headers={}, timeout=(1, 0.5)))
    assert via_urllib3 is via_requests
    assert issubclass(via_urllib3, requests.Timeout) == (kind == "hang")


class _Stall(BaseHTTPRequestHandler):
    """Headers and the first bytes of the body, then nothing for a while."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - http.server API
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"a": ')
        self.wfile.flush()
        time.sleep(1.5)

    def log_message(self, *a):
        pass


def test_forward_maps_failures_to_the_same_kinds():
    """Timeouts (before the headers, or mid-body) are ``timeout`` (the gateway's 504);
    refused connections, resets and 5xx are ``error`` (502)."""
    def kind(url):
        with pytest.raises(upstream.ProviderFailure) as exc:
            upstream.forward(method="POST", url=url, body={}, payload=b"{}", headers={}, timeout=0.5,
                             max_bytes=1 << 20, allow_private_hosts=True)
        return exc.value.kind, exc.value.detail

    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {}))
    with rec as url, serve(_Stall) as stall:
        assert kind(f"http://127.0.0.1:{free_port()}/x") == ("error", "provider unreachable: ConnectionError")
        rec.inject("hang", seconds=1.5, times=1)
        assert kind(url + "/x") == ("timeout", "provider timed out: ReadTimeout")
        rec.inject("reset", times=1)
        assert kind(url + "/x")[0] == "error"
        rec.inject("status", status=503, times=1)
        assert kind(url + "/x") == ("error", "provider answered HTTP 503")
        assert kind(stall + "/x") == ("timeout", "provider timed out while sending its body")
    with pytest.raises(upstream.ProviderFailure, match="address not allowed"):
        upstream.forward(method="POST", url="http://169.254.169.254/", body={}, payload=b"{}", headers={},
                         timeout=1, max_bytes=1024, allow_private_hosts=True)


def _offer(url: str) -> Offer:
    return Offer("m", Provider("p", "openai", url, None, False, None), "m", Decimal(1), Decimal(1))


def test_chat_provider_failures_keep_their_classification(app, monkeypatch):
    monkeypatch.setitem(app.config, "CHAT_READ_TIMEOUT", 0.5)
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    rec = StandIn()
    rec.route("*", "*", lambda req: (200, {"choices": []}))
    with rec as url, app.app_context():
        rec.inject("hang", seconds=1.5, times=1)
        with pytest.raises(llm_providers.ProviderFailure) as exc:
            llm_providers.complete(_offer(url), body, 10)
        assert exc.value.timeout
        rec.inject("status", status=429, times=1)
        with pytest.raises(llm_providers.ProviderFailure) as exc:
            llm_providers.complete(_offer(url), body, 10)
        assert exc.value.status == 429 and not exc.value.timeout and "injected 429" in str(exc.value)
        rec.inject("status", status=400, times=1)
        with pytest.raises(llm_providers.UpstreamRejected) as exc:
            llm_providers.complete(_offer(url), body, 10)
        assert exc.value.status == 400
        with pytest.raises(llm_providers.ProviderFailure, match="address not allowed"):
            llm_providers.complete(_offer("http://169.254.169.254"), body, 10)


def test_chat_stream_events_arrive_one_by_one(app):
    """SSE lines are yielded as they come (the next chunk is sent only after the first
    event was seen), and a stream over the cap fails the provider."""
    seen_first = threading.Event()

    def chunks():
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
        assert seen_first.wait(5)
        yield b'data: {"choices": [{"index": 0, "delta": {"content": "b"}}]}\n\ndata: [DONE]\n\n'

    rec = StandIn()
    rec.route("POST", "*", lambda req: Reply(200, chunks=chunks(), content_type="text/event-stream"))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    with rec as url, app.app_context():
        got = []
        for chunk in llm_providers.stream(_offer(url), body, 10):
            got.append(chunk["choices"][0]["delta"]["content"])
            seen_first.set()
        assert got == ["a", "b"]
        app.config["CHAT_MAX_RESPONSE_BYTES"], saved = 16, app.config["CHAT_MAX_RESPONSE_BYTES"]
        try:
            seen_first.set()
            with pytest.raises(llm_providers.ProviderFailure, match="exceeds 16 bytes"):
                list(llm_providers.stream(_offer(url), body, 10))
        finally:
            app.config["CHAT_MAX_RESPONSE_BYTES"] = saved


# --- pooling ---------------------------------------------------------------------------

class _KeepAlive(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    ports: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).ports.append(self.client_address[1])
        status = 500 if self.path == "/fail" else 200
        body = b'{"ok": true}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "tenant=first-caller; Path=/")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_one_client_per_process_and_one_warm_connection_for_all_threads(monkeypatch):
    _KeepAlive.ports = []
    mine = http.upstream("test", allow_private_hosts=True)
    assert http.upstream("test", allow_private_hosts=False) is not mine
    got = []
    with serve(_KeepAlive) as url:
        def post():
            got.append(http.upstream("test", allow_private_hosts=True))
            upstream.forward(method="POST", url=url + "/ok", body={}, payload=b"{}", headers={},
                             timeout=5, max_bytes=1024, allow_private_hosts=True)

        for _ in range(3):  # one after the other, each from a new thread
            t = threading.Thread(target=post)
            t.start()
            t.join()
    assert got == [mine] * 3
    assert len(_KeepAlive.ports) == 3 and len(set(_KeepAlive.ports)) == 1
    monkeypatch.setattr(os, "getpid", lambda: -1)  # a forked worker starts with its own
    assert http.upstream("test", allow_private_hosts=True) is not mine


def test_failed_answers_give_their_pool_slot_back():
    """A response abandoned unread (a 5xx, a capped body) closes its connection but gives
    the pool slot back, so the pool keeps pooling."""
    _KeepAlive.ports = []
    with serve(_KeepAlive) as url:
        pool = http.upstream("modules", allow_private_hosts=True).manager.connection_from_url(url)
        for _ in range(pool.pool.maxsize + 2):
            with pytest.raises(upstream.ProviderFailure):
                upstream.forward(method="POST", url=url + "/fail", body={}, payload=b"{}", headers={},
                                 timeout=5, max_bytes=1024, allow_private_hosts=True)
        assert pool.pool.qsize() == pool.pool.maxsize
        for _ in range(2):
            upstream.forward(method="POST", url=url + "/ok", body={}, payload=b"{}", headers={},
                             timeout=5, max_bytes=1024, allow_private_hosts=True)
    assert _KeepAlive.ports[-1] == _KeepAlive.ports[-2]  # the last two shared one connection


# --- tracing ---------------------------------------------------------------------------

def test_no_span_and_no_work_when_tracing_is_off():
    headers = {}
    assert telemetry.client_span("GET", "http", "h", None, "/", headers) is telemetry._NOOP
    assert headers == {}


_PROBE = r"""
import json, sys
from app import create_app, telemetry
from app.services.platform import http
from tests.support.standin import StandIn

hook = StandIn({("POST", "/hook"): lambda req: (201, {})})
app = create_app({"APP_ENV": "test", "TESTING": True,  # the database: DATABASE_URL
                  "INSTANCE_PATH": sys.argv[1]})
with hook as url, telemetry.span("call.forward"):
    resp = http.upstream("modules", allow_private_hosts=True).request(
        "POST", url + "/hook?secret=1", headers={}, body=b"{}", timeout=5)
    http.read_capped(resp, 1024)
    http.release(resp)
seen = [r.headers.get("traceparent") for r in hook.requests]
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.instrumentation",
                                                         "opentelemetry.sdk.trace")))
if telemetry._tracer is not None:
    from opentelemetry import trace
    trace.get_tracer_provider().force_flush()
print("\nPROBE " + json.dumps({"otel_modules": len(loaded), "traceparent": seen, "status": resp.status}))
"""


def _probe(tmp_path, **env) -> tuple[dict, str]:
    return probe(_PROBE, str(tmp_path), **env)


def test_upstream_request_is_a_client_span_when_tracing_is_on(tmp_path):
    off, _ = _probe(tmp_path)
    assert off == {"otel_modules": 0, "traceparent": [None], "status": 201}
    on, stdout = _probe(tmp_path, OTEL_TRACES_EXPORTER="console")
    assert on["status"] == 201 and on["traceparent"][0].startswith("00-")
    spans = [json.loads(s) for s in _console_spans(stdout)]
    client = [s for s in spans if s["name"] == "POST"]
    assert len(client) == 1 and client[0]["kind"] == "SpanKind.CLIENT"
    attrs = client[0]["attributes"]
    assert attrs["http.request.method"] == "POST" and attrs["http.response.status_code"] == 201
    assert attrs["url.full"].endswith("/hook") and attrs["server.address"] == "127.0.0.1"
    parent = [s for s in spans if s["name"] == "call.forward"][0]
    assert client[0]["parent_id"] == parent["context"]["span_id"]
    assert on["traceparent"][0].split("-")[2] == client[0]["context"]["span_id"][2:]


def _console_spans(stdout: str):
    """The JSON objects the console exporter printed (one per span, pretty-printed)."""
    depth, start = 0, None
    for i, ch in enumerate(stdout):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0 and '"span_id"' in stdout[start:i]:
                yield stdout[start:i + 1]
