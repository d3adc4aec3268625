"""The outbound HTTP layer (app/services/platform/http.py) and its SSRF policy: address
vectors in both modes, DNS rebinding (the connection goes to the screened address),
TLS name checks on a pinned connection, no redirects, capped bodies, mandatory timeouts,
no environment proxies, and no HTTP client used beside it in app/."""
from __future__ import annotations

import ipaddress
import pathlib
import re
import socket
import subprocess
import ssl
from decimal import Decimal
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from app.errors import ServiceUnavailable
from app.services.billing import chains
from app.services.chat import providers as llm_providers
from app.services.chat.catalog import Offer, Provider
from app.services.platform import http, netguard
from app.services.platform.freelist import FreeList
from tests import dnsstub
from tests.support.procs import free_port
from tests.support.standin import StandIn, recorder, serve

FORBIDDEN = [  # refused in every mode
    "http://169.254.169.254/latest/meta-data", "http://169.254.0.1/", "http://[fe80::1]/",
    "http://[fe80::a9fe:a9fe%25eth0]/", "http://[fd00:ec2::254]/latest/meta-data/",
    "http://100.100.100.200/latest/meta-data", "http://metadata.google.internal/computeMetadata/v1/",
    "http://METADATA.google.internal./", "http://metadata/", "http://instance-data/latest/",
    "http://0.0.0.0/", "http://0.1.2.3/", "http://0/", "http://224.0.0.1/", "http://240.0.0.1/",
    "http://255.255.255.255/", "http://[ff02::1]/", "http://[::]/",
    "http://[::ffff:169.254.169.254]/", "http://[::ffff:a9fe:a9fe]/", "http://[::169.254.169.254]/",
    "http://[2002:a9fe:a9fe::1]/", "http://[64:ff9b::a9fe:a9fe]/", "http://[::ffff:0:a9fe:a9fe]/",
    "http://2852039166/", "http://0xa9fea9fe/", "http://0xa9.0xfe.0xa9.0xfe/",
    "http://0251.0376.0251.0376/", "http://169.254.43518/", "http://[::ffff:100.100.100.200]/",
]
PRIVATE = ["http://10.0.0.1/", "http://192.168.1.1/", "http://172.16.0.1/", "http://[fd00::1]/",
           "http://100.64.0.1/", "http://012.0.0.1/", "http://[::ffff:10.0.0.1]/"]
LOOPBACK = ["http://127.0.0.1:9/", "http://localhost/", "http://[::1]/", "http://2130706433/",
            "http://0x7f.1/", "http://0177.0.0.1/", "http://[::ffff:127.0.0.1]/"]


@pytest.fixture
def dns(monkeypatch):
    return dnsstub.install(monkeypatch)


def _validate(app, url, allow):
    with app.app_context():
        return netguard.validate_url(url, field="target", allow_private_hosts=allow)


# --- address vectors -------------------------------------------------------------------

@pytest.mark.parametrize("allow", [True, False])
@pytest.mark.parametrize("url", FORBIDDEN)
def test_metadata_and_link_local_refused_in_every_mode(app, url, allow):
    with pytest.raises(netguard.UnsafeURL):
        _validate(app, url.replace("http://", "https://") if not allow else url, allow)


@pytest.mark.parametrize("url", PRIVATE + LOOPBACK)
def test_private_and_loopback_only_when_allowed(app, url):
    assert _validate(app, url, True) == url
    with pytest.raises(netguard.UnsafeURL):
        _validate(app, url.replace("http://", "https://"), False)


@pytest.mark.parametrize("url", [u for u in FORBIDDEN if "[" in u or re.search(r"//[0-9x.]+/", u)])
def test_forbidden_literals_refused_at_call_time_without_a_dial(app, monkeypatch, url):
    dialed = []
    monkeypatch.setattr(http, "_dial", lambda info, conn: dialed.append(info))
    with app.app_context(), pytest.raises(http.AddressRefused):
        http.call("GET", url, purpose="test", timeout=2, allow_private_hosts=True)
    assert dialed == []


@pytest.mark.parametrize("answer", ["169.254.169.254", "fe80::1", "fd00:ec2::254", "::ffff:169.254.169.254",
                                    "100.100.100.200", "0.0.0.0", "224.0.0.251"])
def test_names_resolving_to_metadata_refused_even_when_private_allowed(app, dns, monkeypatch, answer):
    dns.answers["meta.example"] = [answer]
    dialed = []
    monkeypatch.setattr(http, "_dial", lambda info, conn: dialed.append(info))
    with app.app_context(), pytest.raises(http.AddressRefused):
        http.call("GET", "http://meta.example/latest/meta-data", purpose="test", timeout=2)
    assert dialed == []


@pytest.mark.parametrize("ip,category", [
    ("8.8.8.8", "public"), ("2606:4700::1111", "public"), ("::ffff:8.8.8.8", "public"),
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("10.1.1.1", "private"), ("fc00::1", "private"),
    ("169.254.169.254", "forbidden"), ("2001:0:4136:e378:8000:63bf:5601:5601", "forbidden"),  # Teredo
])
def test_classify(ip, category):
    assert netguard.classify(ipaddress.ip_address(ip)) == category


def test_loopback_connection_only_when_allowed(app):
    rec = recorder([200])
    with rec as url, app.app_context():
        assert http.call("POST", url + "/x", purpose="test", timeout=5, data=b"{}").status_code == 200
        with pytest.raises(http.AddressRefused):
            http.call("POST", url + "/x", purpose="test", timeout=5, data=b"{}", allow_private_hosts=False)
    assert len(rec.requests) == 1


# --- DNS rebinding ---------------------------------------------------------------------

def test_connection_goes_to_the_validated_address(app, dns, monkeypatch):
    """First lookup: a public address (validated, then dialled); second: loopback (refused)."""
    rec = StandIn()  # closes every connection, so the second call dials (and screens) again
    rec.route("*", "*", lambda req: (200, {}, {"Connection": "close"}))
    with rec as url, app.app_context():
        port = int(url.rsplit(':', 1)[1])
        dns.answers["pinned.example"] = ["93.184.216.34", "127.0.0.1"]
        dialed, real_dial = [], http._dial

        def dial(info, conn):  # the "public" host is played by the local recorder
            dialed.append(info[4][0])
            return real_dial((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)), conn)

        monkeypatch.setattr(http, "_dial", dial)
        url = f"http://pinned.example:{port}/hook"
        r = http.call("POST", url, purpose="test", timeout=5, data=b"x", allow_private_hosts=False)
        assert r.status_code == 200 and dialed == ["93.184.216.34"] and dns.lookups["pinned.example"] == 1
        assert rec.requests[0].headers["Host"] == f"pinned.example:{port}"
        with pytest.raises(http.AddressRefused):  # the next connection is screened again
            http.call("POST", url, purpose="test", timeout=5, data=b"x", allow_private_hosts=False)
    assert dialed == ["93.184.216.34"] and len(rec.requests) == 1


def test_rebinding_to_metadata_refused_when_private_allowed(app, dns):
    rec = StandIn()  # closes every connection: each call dials (and screens) again
    rec.route("*", "*", lambda req: (200, {}, {"Connection": "close"}))
    with rec as url, app.app_context():
        url = f"http://rebind.example:{int(url.rsplit(':', 1)[1])}/hook"
        dns.answers["rebind.example"] = ["127.0.0.1", "169.254.169.254"]
        assert http.call("POST", url, purpose="test", timeout=5, data=b"x").status_code == 200
        with pytest.raises(http.AddressRefused):
            http.call("POST", url, purpose="test", timeout=5, data=b"x")
    assert len(rec.requests) == 1 and dns.lookups["rebind.example"] == 2


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """An HTTPS server on loopback with a self-signed certificate for ``pinned.test``."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", d / "key.pem", "-out", d / "cert.pem", "-days", "1",
                    "-subj", "/CN=pinned.test", "-addext", "subjectAltName=DNS:pinned.test"],
                   check=True, capture_output=True)
    seen = {"sni": [], "host": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            seen["host"].append(self.headers["Host"])
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "cert.pem", d / "key.pem")
    ctx.sni_callback = lambda sock, name, _ctx: seen["sni"].append(name)
    with serve(Handler, ssl_context=ctx) as url:
        yield int(url.rsplit(':', 1)[1]), str(d / "cert.pem"), seen


def test_tls_on_a_pinned_connection_checks_the_host_name(app, dns, tls_server):
    port, ca, seen = tls_server
    dns.answers["pinned.test"] = ["127.0.0.1"]
    dns.answers["other.test"] = ["127.0.0.1"]
    with app.app_context():
        r = http.call("GET", f"https://pinned.test:{port}/", purpose="test", timeout=5, verify=ca)
        assert r.status_code == 200 and seen["sni"][-1] == "pinned.test"
        assert seen["host"][-1] == f"pinned.test:{port}"
        with pytest.raises(requests.exceptions.SSLError):  # same address, certificate not for this name
            http.call("GET", f"https://other.test:{port}/", purpose="test", timeout=5, verify=ca)


# --- transport rules -------------------------------------------------------------------

class _Redirecting(BaseHTTPRequestHandler):
    hits: list = []

    def do_GET(self):  # noqa: N802 - http.server API
        type(self).hits.append(self.path)
        self.send_response(302 if self.path == "/start" else 200)
        self.send_header("Location", "/target")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *a):
        pass


def test_redirects_are_never_followed(app):
    _Redirecting.hits = []
    with serve(_Redirecting) as url, app.app_context():
        assert http.call("GET", url + "/start", purpose="test", timeout=5).status_code == 302
        with http.session("test", allow_private_hosts=True) as s:
            assert s.get(url + "/start", timeout=5, allow_redirects=True).status_code == 302
    assert _Redirecting.hits == ["/start", "/start"]


class _Big(BaseHTTPRequestHandler):
    size = 2 * 1024 * 1024

    def do_POST(self):  # noqa: N802 - http.server API
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(self.size))
        self.end_headers()
        try:
            self.wfile.write(b'{"result": "' + b"x" * (self.size - 14) + b'"}')
        except OSError:
            pass  # the client stopped reading, as it should

    do_GET = do_POST

    def log_message(self, *a):
        pass


def test_response_cap(app, monkeypatch):
    with serve(_Big) as url, app.app_context():
        with pytest.raises(http.ResponseTooLarge):
            http.call("GET", url, purpose="test", timeout=5, max_bytes=64 * 1024)
        assert len(http.call("GET", url, purpose="test", timeout=5).content) == _Big.size
        monkeypatch.setitem(app.config, "HTTP_MAX_RESPONSE_BYTES", 1024)
        monkeypatch.setitem(app.config, "RPC_URLS", {"base": url})
        with pytest.raises(ServiceUnavailable):
            chains.rpc("base", "eth_blockNumber", [])
        monkeypatch.setitem(app.config, "CHAT_MAX_RESPONSE_BYTES", 1024)
        offer = Offer("m", Provider("p", "openai", url, None, False, None), "m", Decimal(1), Decimal(1))
        with pytest.raises(llm_providers.ProviderFailure, match="exceeds 1024 bytes"):
            llm_providers.complete(offer, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, 10)


class _Cookies(BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802 - http.server API
        _Cookies.seen.append(self.headers.get("Cookie"))
        self.send_response(200)
        self.send_header("Set-Cookie", "sid=secret-of-the-first-caller; Path=/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_a_cookie_one_response_set_never_goes_out_again(app):
    """Sessions are lent to whichever request comes next: a cookie must not travel."""
    _Cookies.seen = []
    with serve(_Cookies) as url, app.app_context():
        for _ in range(3):
            http.call("GET", url + "/", purpose="test", timeout=5)
    assert _Cookies.seen == [None, None, None]


def test_sessions_are_lent_from_one_free_list_per_process(app):
    """Not one session per thread (under gevent, per client connection's greenlet): a
    request after another, from any thread, borrows the same idle session; two at once
    take two; at most IDLE_MAX stay idle."""
    import threading

    def borrowed():
        with http.session("lend-test", allow_private_hosts=True) as s:
            return s

    first = borrowed()
    t = threading.Thread(target=lambda: seen.append(borrowed()))
    seen: list = []
    t.start()
    t.join()
    assert seen == [first]
    with http.session("lend-test", allow_private_hosts=True) as a, \
            http.session("lend-test", allow_private_hosts=True) as b:
        assert a is first and b is not first
    free = http._idle_sessions[("lend-test", True)].idle
    assert free == [b, a]  # given back as each block ends
    extra = [http._new_session("lend-test", True) for _ in range(FreeList(None, None).idle_max)]
    with http.session("lend-test", allow_private_hosts=True) as c:
        free.extend(extra)  # the others in use meanwhile came back
    assert c not in free and len(free) == len(extra) + 1


def test_timeout_is_mandatory(app):
    with pytest.raises(ValueError, match="timeout"), http.session("test", allow_private_hosts=True) as s:
        s.get("http://127.0.0.1:9/")


def test_environment_proxies_are_ignored(app, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    class Node(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server API
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"jsonrpc": "2.0", "id": 1, "result": "ok"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    with serve(Node) as url, app.app_context():
        monkeypatch.setitem(app.config, "RPC_URLS", {"base": url})
        assert chains.rpc("base", "eth_blockNumber", []) == "ok"


def test_no_http_client_beside_the_outbound_layer():
    """Every outbound request in app/ goes through platform/http.py."""
    root = pathlib.Path(__file__).resolve().parents[2] / "app"
    pattern = re.compile(r"requests\.(get|post|put|patch|delete|head|request|Session)\(|HTTPAdapter\(|"
                         r"urlopen\(|http\.client|import httpx|import aiohttp")
    offenders = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py") if p.name != "http.py"
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
