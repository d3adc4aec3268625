"""The one outbound HTTP layer: every request the service sends goes through here.

Two ways in, one per kind of caller
-----------------------------------
* **The hot path — ``upstream(purpose, ...)``**: the module forward
  (``gateway.upstream.forward``) and the chat provider calls (``chat.providers``) run
  once per billed request, so they go through urllib3's connection pool directly: one
  ``Upstream`` (a ``PoolManager`` over the pinned connection classes below) per purpose
  and address policy for the whole process, shared by all threads, re-created after a
  fork; URLs parsed and timeout objects built once (cached), no per-call session
  merging, request preparation, hooks or response wrapping. It answers urllib3's
  ``BaseHTTPResponse`` (``.status``, ``.headers``, ``.read1``), unread.
* **Everything else — ``call`` / ``session``** (webhooks, the x402 facilitator, JSON-RPC
  nodes, ``--keys-url``): ``requests`` sessions. These are cold paths (a few calls per
  minute, or in a background job) where requests' conveniences are worth their CPU:
  ``json=`` bodies, ``.json()``, ``verify=`` for a private CA, and they share the same
  connection classes, so the address policy is the same code.

Both raise the same exceptions: ``Upstream.request`` translates urllib3's failures to
the ``requests`` exception that requests' adapter would raise for them
(``requests.ConnectTimeout``/``ReadTimeout`` — both ``requests.Timeout`` —,
``ConnectionError``, ``SSLError``, ``InvalidURL``), and ``read_capped`` translates
mid-body failures as ``Response.iter_content`` does, so ``ERRORS`` covers both.

What every request guarantees
-----------------------------
* **Pooled**: keep-alive connections reused. ``upstream``: one pool manager per purpose
  and policy and process. ``session``: a ``requests`` session per purpose and policy
  lent from the process's free list for one request (``platform.freelist``; not one per
  thread, since under gunicorn's gevent worker a thread is a client connection's greenlet). ``modules`` and ``chat`` have larger pools
  (``POOL_SIZES``).
* **No cookies**: a session never keeps a cookie a response set, so nothing one request
  was told travels with the next request that borrows the session.
* **Timeouts always set**: a request without ``timeout`` raises ``ValueError``.
* **No redirects**: never followed; a 3xx is returned to the caller.
* **No environment proxies**: urllib3's pool manager never reads ``HTTP(S)_PROXY``; the
  requests sessions have ``trust_env`` off and refuse proxies, so the environment can
  neither divert traffic nor bypass the address check.
* **TLS**: certificates verified against the host name with requests' CA bundle
  (``certifi``) on both ways in.
* **Bounded responses**: ``read_capped`` streams the body and stops past ``max_bytes``
  with ``ResponseTooLarge``; ``call`` always reads that way (``HTTP_MAX_RESPONSE_BYTES``).
* **Traced when tracing is on**: the requests instrumentation spans ``call``/``session``;
  ``Upstream.request`` opens the same kind of CLIENT span itself
  (``telemetry.client_span``; nothing when tracing is off).

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

import base64
import os
import socket
import threading
import time
from functools import lru_cache
from http.cookiejar import DefaultCookiePolicy
from urllib.parse import unquote, urlencode, urlsplit

import requests
from flask import current_app
from requests.adapters import HTTPAdapter
from requests.utils import DEFAULT_CA_BUNDLE_PATH
from urllib3 import BaseHTTPResponse, PoolManager
from urllib3 import exceptions as u3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import Timeout, parse_url
from urllib3.util.timeout import _DEFAULT_TIMEOUT

from app import telemetry
from app.services.platform import netguard
from app.services.platform.freelist import FreeList
from app.services.platform.netguard import AddressRefused  # noqa: F401 - part of this API

USER_AGENT = "metered-gateway/1.0"
POOL_SIZES = {"modules": (64, 64), "chat": (32, 64)}  # purpose -> (hosts, connections per host)
_shared_lock = threading.Lock()


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
    s.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))  # keeps none
    return s


# The process's idle sessions (``platform.freelist``): {(purpose, allow_private_hosts): FreeList}
_idle_sessions: dict[tuple[str, bool], FreeList] = {}


def session(purpose: str, *, allow_private_hosts: bool):
    """A pooled session for ``purpose`` under the given address policy, lent for a
    ``with`` block (an idle one of this process, or a new one; given back after). Use
    the response inside the block."""
    key = (purpose, bool(allow_private_hosts))
    idle = _idle_sessions.get(key)
    if idle is None:
        idle = _idle_sessions.setdefault(key, FreeList(lambda: _new_session(*key), GuardedSession.close))
    return idle.lend()


# --- the hot path: urllib3's pool directly -------------------------------------------------

def _transport_error(exc: Exception) -> requests.RequestException:
    """The exception requests' adapter raises for this urllib3 failure of a request (connect
    timeouts are ``ConnectTimeout`` except a refused connection, ``ReadTimeout`` for headers
    that do not come in time, ``SSLError``, ``InvalidURL``, else ``ConnectionError``)."""
    if isinstance(exc, u3.ConnectTimeoutError) and not isinstance(exc, NewConnectionError):
        return requests.ConnectTimeout(exc)
    if isinstance(exc, u3.ReadTimeoutError):
        return requests.ReadTimeout(exc)
    if isinstance(exc, u3.SSLError):
        return requests.exceptions.SSLError(exc)
    if isinstance(exc, u3.InvalidHeader):
        return requests.exceptions.InvalidHeader(exc)
    if isinstance(exc, u3.LocationValueError):
        return requests.exceptions.InvalidURL(exc)
    return requests.ConnectionError(exc)


@lru_cache(maxsize=1024)
def _target(url: str) -> tuple[str, str, int | None, str, str | None]:
    """``(scheme, host, port, request target, Authorization)`` of ``url``, parsed once per
    URL (urllib3's parser: invalid characters percent-encoded, IDNA host names). Credentials
    in the URL become a Basic ``Authorization`` header, as requests sends them."""
    try:
        u = parse_url(url)
    except u3.LocationParseError as exc:
        raise requests.exceptions.InvalidURL(exc) from None
    if u.scheme not in ("http", "https") or not u.host:
        raise requests.exceptions.InvalidURL(f"not an http(s) URL: {url[:200]}")
    auth = None
    if u.auth:
        user, _, password = u.auth.partition(":")
        auth = "Basic " + base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode("latin1")).decode()
    return u.scheme, u.host, u.port, u.request_uri, auth


@lru_cache(maxsize=256)
def _timeout(connect: float, read: float) -> Timeout:
    return Timeout(connect=connect, read=read)


class Upstream:
    """One process's client for a hot ``purpose`` under one address policy: a urllib3
    ``PoolManager`` whose pools use the pinned connection classes (every new connection
    resolved once, screened, and the screened address dialled), ``POOL_SIZES`` hosts and
    connections per host, non-blocking (a burst past the pool opens extra connections
    that are closed after use), no retries, no redirects, no proxies, certificates checked
    with requests' CA bundle. Thread-safe; take it from ``upstream()``."""

    def __init__(self, purpose: str, *, allow_private_hosts: bool, ca_certs: str | None = None):
        hosts, per_host = POOL_SIZES.get(purpose, (10, 10))
        self.pid = os.getpid()
        self.manager = PoolManager(num_pools=hosts, maxsize=per_host, block=False, retries=False,
                                   cert_reqs="CERT_REQUIRED", ca_certs=ca_certs or DEFAULT_CA_BUNDLE_PATH)
        self.manager.pool_classes_by_scheme = _pool_classes(bool(allow_private_hosts))

    def request(self, method: str, url: str, *, headers: dict, timeout, body: bytes | None = None,
                params: dict | None = None) -> BaseHTTPResponse:
        """Send one request and answer the response with its body unread (read it with
        ``read_capped`` or ``read1``, then ``release`` it). ``timeout``: seconds, or a
        ``(connect, read)`` pair, required; ``params``: query parameters added to the URL;
        ``headers`` get ``User-Agent`` unless they name one (the dict is not modified).
        Raises ``AddressRefused`` and the ``requests`` exceptions (see the module docstring)."""
        if timeout is None:
            raise ValueError("outbound HTTP requests need a timeout")
        scheme, host, port, path, auth = _target(url)
        target = path + ("&" if "?" in path else "?") + urlencode(params) if params else path
        sent = dict(headers)
        if "User-Agent" not in sent and not any(k.lower() == "user-agent" for k in sent):
            sent["User-Agent"] = USER_AGENT
        if auth:
            sent["Authorization"] = auth
        connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        with telemetry.client_span(method, scheme, host, port, path, sent) as span:
            try:
                resp = self.manager.connection_from_host(host, port, scheme).urlopen(
                    method, target, body=body, headers=sent, retries=False, redirect=False,
                    assert_same_host=False, preload_content=False, decode_content=False,
                    timeout=_timeout(connect, read))
            except (u3.HTTPError, OSError) as exc:
                raise _transport_error(exc) from exc
            if span is not None:
                telemetry.client_status(span, resp.status)
        return resp


_upstreams: dict[tuple[str, bool], Upstream] = {}


def upstream(purpose: str, *, allow_private_hosts: bool) -> Upstream:
    """The process's one ``Upstream`` for ``purpose`` under the address policy (``modules``:
    ``ALLOW_PRIVATE_URLS``; ``chat``: operator-configured, so permissive). A forked worker
    gets its own (no connection is inherited across a fork)."""
    key = (purpose, bool(allow_private_hosts))
    u = _upstreams.get(key)
    if u is None or u.pid != os.getpid():
        with _shared_lock:
            u = _upstreams.get(key)
            if u is None or u.pid != os.getpid():
                u = _upstreams[key] = Upstream(purpose, allow_private_hosts=key[1])
    return u


# --- reading ------------------------------------------------------------------------------

def read_capped(resp: requests.Response | BaseHTTPResponse, max_bytes: int, chunk: int = 65536) -> bytes:
    """The body of a streamed response (requests', or urllib3's from ``Upstream.request``),
    at most ``max_bytes`` (else ``ResponseTooLarge``; nothing past the limit is read), decoded
    as requests decodes it. A requests response keeps the bytes (``.content``/``.json()``).
    Failures mid-body raise what ``Response.iter_content`` raises: ``ChunkedEncodingError``,
    ``ContentDecodingError``, ``ConnectionError`` (wrapping ``ReadTimeoutError``), ``SSLError``."""
    raw = resp.raw if isinstance(resp, requests.Response) else resp
    chunks, size = [], 0
    try:
        for piece in raw.stream(chunk, decode_content=True):
            size += len(piece)
            if size > max_bytes:
                release(resp)
                raise ResponseTooLarge(max_bytes)
            chunks.append(piece)
    except u3.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from exc
    except u3.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from exc
    except u3.ReadTimeoutError as exc:
        raise requests.ConnectionError(exc) from exc
    except u3.SSLError as exc:
        raise requests.exceptions.SSLError(exc) from exc
    body = b"".join(chunks)
    if raw is not resp:
        resp._content = body  # requests' own cache of a consumed body
        resp._content_consumed = True
    return body


def release(resp: requests.Response | BaseHTTPResponse) -> None:
    """Done with ``resp``: a connection whose body was read to the end is already back in
    its pool, warm; otherwise it is closed and its pool slot given back."""
    resp.close()
    if not isinstance(resp, requests.Response):  # requests' close() releases it itself
        resp.release_conn()


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
    with session(purpose, allow_private_hosts=allow_private_hosts) as s:
        resp = s.request(method, url, timeout=timeout, stream=True, **kwargs)
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
