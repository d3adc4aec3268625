"""The one outbound HTTP layer: every request the service sends goes through here.

What every session guarantees
-----------------------------
* **Pooled**: one ``requests`` session per purpose, policy and thread (``session``),
  keep-alive connections reused; ``modules`` and ``chat`` have larger pools. A caller
  with a few fixed upstreams (the chat providers) takes one session per upstream for
  the whole process instead (``shared_session``): every thread of a worker reuses the
  same warm connections, and the session keeps no cookies.
* **Timeouts always set**: a request without ``timeout`` raises ``ValueError``.
* **No redirects**: ``allow_redirects`` is forced off; a 3xx is returned to the caller.
* **No environment proxies**: ``trust_env`` is off and proxies are refused, so
  ``HTTP(S)_PROXY`` can neither divert traffic nor bypass the address check.
* **Bounded responses**: ``read_capped`` streams the body and stops past ``max_bytes``
  with ``ResponseTooLarge``; ``call`` always reads that way (``HTTP_MAX_RESPONSE_BYTES``).

The SSRF policy (one policy, in ``app.services.platform.netguard``)
-------------------------------------------------------------------
Addresses fall in four classes; IPv6 forms carrying an IPv4 address (mapped ``::ffff:``,
compatible ``::a.b.c.d``, 6to4, Teredo, NAT64) are judged by that address, and numeric
host spellings (``2852039166``, ``0xa9.0xfe.0xa9.0xfe``, ``0251.0376.0251.0376``) by the
address they spell.

* **forbidden — refused in every mode, whatever ``ALLOW_PRIVATE_URLS`` says**: link-local
  IPv4 ``169.254.0.0/16`` and IPv6 ``fe80::/10`` (cloud metadata: AWS, GCP, Azure, OCI),
  ``fd00:ec2::254`` (AWS IPv6 metadata), ``100.100.100.200`` (Alibaba), ``0.0.0.0/8``
  and ``::``, multicast, reserved ranges, and the names ``metadata``,
  ``metadata.google.internal``, ``instance-data`` and their kin.
* **loopback and private** (RFC 1918, ULA ``fc00::/7``, CGNAT, other non-global ranges):
  allowed only when ``ALLOW_PRIVATE_URLS`` is on (the default outside production, for
  local use and tests). URLs the operator configures (LLM providers, JSON-RPC nodes, the
  x402 facilitator, ``--keys-url``) are always called in this permissive mode.
* **public**: allowed.

Where it applies: when a URL the service will *call* is registered (alert webhook and
chat targets, agent webhooks, module submission webhooks: ``netguard.validate_url``,
https only in production), before a module call is charged (``precheck``), and again on
**every new connection**: the connection class resolves the host once, checks every
address returned, and dials that validated address itself — there is no second DNS
resolution between check and connect, so DNS rebinding cannot slip an internal address
in. TLS still sends SNI for, and verifies the certificate against, the host name, and the
``Host`` header carries the name. A refused address raises ``netguard.AddressRefused``.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from http import cookiejar as http_cookiejar
from functools import lru_cache
from urllib.parse import urlsplit

import requests
from flask import current_app
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.timeout import _DEFAULT_TIMEOUT

from app.services.platform import netguard
from app.services.platform.netguard import AddressRefused  # noqa: F401 - part of this API

USER_AGENT = "metered-gateway/1.0"
POOL_SIZES = {"modules": (64, 64), "chat": (32, 64)}  # purpose -> (hosts, connections per host)
_local = threading.local()
_shared: dict = {}
_shared_lock = threading.Lock()
_shared_pid = [0]


class ResponseTooLarge(Exception):
    """The response body is longer than the caller's limit; the rest was not read."""

    def __init__(self, max_bytes: int):
        super().__init__(f"response exceeds {max_bytes} bytes")
        self.max_bytes = max_bytes


# Everything ``call`` raises when the other side cannot be used: catch this tuple.
ERRORS = (requests.RequestException, AddressRefused, ResponseTooLarge)


# --- connections that dial the address they validated -------------------------------------

def _dial(info: tuple, conn: HTTPConnection) -> socket.socket:
    """Open a TCP connection to one already-validated ``getaddrinfo`` entry."""
    family, socktype, proto, _, sockaddr = info
    sock = socket.socket(family, socktype, proto)
    try:
        for opt in conn.socket_options or ():
            sock.setsockopt(*opt)
        if conn.timeout is not _DEFAULT_TIMEOUT:
            sock.settimeout(conn.timeout)
        if conn.source_address:
            sock.bind(conn.source_address)
        sock.connect(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


class _Pinned:
    """Connection mix-in: resolve once, screen every address, dial the screened address."""

    allow_private_hosts = False

    def _new_conn(self) -> socket.socket:
        try:
            infos = netguard.screen(self._dns_host, self.port, self.allow_private_hosts)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        error: OSError | None = None
        for info in infos:
            try:
                return _dial(info, self)
            except OSError as exc:
                error = exc
        if isinstance(error, socket.timeout):
            raise ConnectTimeoutError(self, f"Connection to {self.host} timed out.") from error
        raise NewConnectionError(self, f"Failed to establish a new connection: {error}") from error


@lru_cache(maxsize=None)
def _pool_classes(allow_private_hosts: bool) -> dict:
    attrs = {"allow_private_hosts": allow_private_hosts}
    plain = type("PinnedHTTPConnection", (_Pinned, HTTPConnection), attrs)
    tls = type("PinnedHTTPSConnection", (_Pinned, HTTPSConnection), attrs)
    return {"http": type("PinnedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": plain}),
            "https": type("PinnedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": tls})}


class _PinnedAdapter(HTTPAdapter):
    def __init__(self, allow_private_hosts: bool, hosts: int, per_host: int):
        self._pool_classes = _pool_classes(allow_private_hosts)
        super().__init__(pool_connections=hosts, pool_maxsize=per_host, max_retries=0)

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pool_classes

    def proxy_manager_for(self, proxy, **kwargs):
        raise requests.exceptions.InvalidProxyURL("outbound proxies are not used")


class GuardedSession(requests.Session):
    """A session that always has a timeout and never follows redirects."""

    max_redirects = 0

    def request(self, method, url, *args, timeout=None, allow_redirects=False, **kwargs):
        if timeout is None:
            raise ValueError("outbound HTTP requests need a timeout")
        return super().request(method, url, *args, timeout=timeout, allow_redirects=False, **kwargs)


def _new_session(purpose: str, allow_private_hosts: bool, sizes: tuple[int, int] | None = None) -> GuardedSession:
    s = GuardedSession()
    s.trust_env = False
    s.proxies = {}
    adapter = _PinnedAdapter(bool(allow_private_hosts), *(sizes or POOL_SIZES.get(purpose, (10, 10))))
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    s.headers.clear()
    s.headers["User-Agent"] = USER_AGENT
    return s


def session(purpose: str, *, allow_private_hosts: bool) -> GuardedSession:
    """This thread's pooled session for ``purpose`` under the given address policy."""
    sessions = getattr(_local, "sessions", None)
    if sessions is None:
        sessions = _local.sessions = {}
    key = (purpose, bool(allow_private_hosts))
    s = sessions.get(key)
    if s is None:
        s = sessions[key] = _new_session(purpose, allow_private_hosts)
    return s


class _NoCookies(http_cookiejar.DefaultCookiePolicy):
    """A shared session serves every customer's requests: it stores no cookie."""

    def set_ok(self, cookie, request):
        return False


def shared_session(purpose: str, upstream: str, *, allow_private_hosts: bool) -> GuardedSession:
    """The process's one session for ``upstream`` (e.g. a chat provider id) under
    ``purpose`` and the address policy, shared by all threads (urllib3's pools are
    thread-safe): keep-alive connections stay warm across requests and threads, and are
    never inherited across a fork. It stores no cookies."""
    key = (purpose, upstream, bool(allow_private_hosts))
    s = _shared.get(key)
    if s is None or _shared_pid[0] != os.getpid():
        with _shared_lock:
            if _shared_pid[0] != os.getpid():  # a forked worker starts with no connections
                _shared.clear()
                _shared_pid[0] = os.getpid()
            s = _shared.get(key)
            if s is None:
                s = _new_session(purpose, allow_private_hosts, (4, POOL_SIZES.get(purpose, (10, 10))[1]))
                s.cookies.set_policy(_NoCookies())
                _shared[key] = s
    return s


# --- reading ------------------------------------------------------------------------------

def read_capped(resp: requests.Response, max_bytes: int, chunk: int = 65536) -> bytes:
    """The body of a streamed response, at most ``max_bytes`` (else ``ResponseTooLarge``;
    nothing past the limit is read). The response keeps the bytes (``.content``/``.json()``)."""
    chunks, size = [], 0
    for piece in resp.iter_content(chunk):
        size += len(piece)
        if size > max_bytes:
            resp.close()
            raise ResponseTooLarge(max_bytes)
        chunks.append(piece)
    body = b"".join(chunks)
    resp._content = body  # requests' own cache of a consumed body
    resp._content_consumed = True
    return body


def default_max_bytes() -> int:
    return int(current_app.config["HTTP_MAX_RESPONSE_BYTES"])


def call(method: str, url: str, *, purpose: str, timeout, allow_private_hosts: bool = True,
         max_bytes: int | None = None, **kwargs) -> requests.Response:
    """Send one request and read its body within ``max_bytes`` (default
    ``HTTP_MAX_RESPONSE_BYTES``). ``allow_private_hosts`` is True for operator-configured
    URLs; pass ``netguard.allow_private()`` for URLs users gave. Raises the ``requests``
    exceptions, ``AddressRefused`` and ``ResponseTooLarge``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise requests.exceptions.InvalidURL(f"not an http(s) URL without credentials: {url[:200]}")
    resp = session(purpose, allow_private_hosts=allow_private_hosts).request(
        method, url, timeout=timeout, stream=True, **kwargs)
    try:
        read_capped(resp, default_max_bytes() if max_bytes is None else max_bytes)
    finally:
        resp.close()
    return resp


# --- the module-call precheck --------------------------------------------------------------

_verdicts: dict[tuple[str, int, bool], tuple[float, str | None]] = {}
PRECHECK_TTL = 60.0


def precheck(url: str, *, allow_private_hosts: bool) -> str | None:
    """Why ``url`` may not be called (None when it may), answered before a call is charged.
    Verdicts are cached a minute per host; that is only an early answer, not the boundary:
    every connection is screened again on the address it dials."""
    parts = urlsplit(url)
    host, now = parts.hostname or "", time.monotonic()
    key = (host, parts.port or 0, allow_private_hosts)
    hit = _verdicts.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    try:
        if allow_private_hosts or netguard.literal_ip(host) is not None:
            netguard.check_host(host, allow_private_hosts)
        else:
            netguard.screen(host, parts.port or 443, allow_private_hosts)
        verdict = None
    except AddressRefused as exc:
        verdict = str(exc)
    except (OSError, UnicodeError):
        verdict = f"{host} does not resolve"
    _verdicts[key] = (now + PRECHECK_TTL, verdict)
    return verdict
