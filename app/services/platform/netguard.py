"""Outbound URL safety (SSRF guard) for every user-supplied URL the service calls.

A URL is accepted when its scheme is https (http too when ``ALLOW_PRIVATE_URLS`` is on,
for local use and tests), it has a host and no credentials, and every address the host
resolves to is public: loopback, RFC 1918/ULA private, link-local (cloud metadata),
CGNAT, multicast, reserved and unspecified ranges are refused — IPv4-mapped IPv6 and
numeric host forms (``2130706433``, ``0x7f.1``) included, since the check runs on the
resolved addresses. Redirects are never followed by the senders that use this guard.
``ALLOW_PRIVATE_URLS`` (on outside production) lifts the address rule.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from flask import current_app

from app.errors import InvalidRequest


class UnsafeURL(InvalidRequest):
    message = "The URL is not allowed."


def _private(ip: ipaddress._BaseAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address) and ip.sixtofour is not None:
        ip = ip.sixtofour
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
            or ip.is_reserved or ip.is_unspecified
            or (isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.ip_network("100.64.0.0/10")))


def allow_private() -> bool:
    return bool(current_app.config.get("ALLOW_PRIVATE_URLS"))


def validate_url(url: str, *, field: str = "url", resolve: bool = True,
                 allow_private_hosts: bool | None = None) -> str:
    """Return ``url`` if it is safe to call, else raise ``UnsafeURL`` (400) naming ``field``."""
    permissive = allow_private() if allow_private_hosts is None else allow_private_hosts
    if not isinstance(url, str) or len(url) > 2000:
        raise UnsafeURL(f"{field}: must be a URL of at most 2000 characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UnsafeURL(f"{field}: not a valid URL.")
    allowed_schemes = ("https", "http") if permissive else ("https",)
    if parts.scheme not in allowed_schemes:
        raise UnsafeURL(f"{field}: must be an https URL.")
    if not parts.hostname or parts.username or parts.password:
        raise UnsafeURL(f"{field}: must have a host and no credentials.")
    if permissive or not resolve:
        return url
    host = parts.hostname
    try:
        infos = socket.getaddrinfo(host, port or 443, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise UnsafeURL(f"{field}: the host does not resolve.")
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        if _private(ip):
            raise UnsafeURL(f"{field}: private, loopback and link-local addresses are not allowed.")
    return url
