"""The SSRF policy: which hosts and addresses the service may call (the rules are written
out in ``app.services.platform.http``, the outbound layer that enforces them per connection).

Owns the address classification (``classify``), the numeric host spellings that must be
recognised without DNS (``literal_ip``: ``2130706433``, ``0x7f.1``, ``0177.0.0.1``,
IPv6 with embedded IPv4), the metadata host names, the one resolve-and-screen step
(``screen``: one DNS lookup, every answer checked) and the registration check
(``validate_url``) used when a URL the service will call is stored.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from flask import current_app

from app.errors import Unprocessable

PUBLIC, PRIVATE, LOOPBACK, FORBIDDEN = "public", "private", "loopback", "forbidden"

# Refused in every mode, whatever ALLOW_PRIVATE_URLS says: link-local (cloud metadata lives
# there), "this network", multicast, reserved, and the metadata addresses outside link-local.
_NEVER = tuple(ipaddress.ip_network(n) for n in (
    "169.254.0.0/16", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "100.100.100.200/32",
    "fe80::/10", "fd00:ec2::254/128", "ff00::/8", "::/128"))
METADATA_NAMES = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data",
    "instance-data.ec2.internal", "metadata.azure.internal", "metadata.oraclecloud.com"})
_EMBEDDED_V4 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::ffff:0:0:0/96"))
_COMPAT_V4 = ipaddress.ip_network("::/96")
_INET_PART = re.compile(r"0x[0-9a-f]*|0[0-7]*|[1-9][0-9]*")


class UnsafeURL(Unprocessable):
    """The SSRF guard's verdict on a URL the document accepts (its shape is the field's
    pattern): a host that does not resolve, or resolves to an address that is not public, a
    scheme or port the configuration refuses. A rule of the world outside the request (DNS,
    configuration), so 422 ``unprocessable``, never a 400 (docs/decisions.md "Schema-valid
    requests"). Routes that store such a URL document it with ``REFUSED_DOC``."""

    message = "The URL is not allowed."


# The 422 of every route that stores a URL the service will call (its ``errors=`` entry).
REFUSED_DOC = ("`unprocessable`: the URL is well-formed but the SSRF guard refuses it: its host does not "
               "resolve, or resolves to a private, loopback, link-local, metadata or reserved address; "
               "or its scheme (https only when private hosts are not allowed) or port is not accepted.")


class AddressRefused(Exception):
    """A host resolved (or is spelled) to an address the policy refuses. Deliberately not
    an ``OSError``: it propagates through urllib3 and requests unchanged."""

    def __init__(self, host: str, ip, category: str):
        self.host, self.ip, self.category = host, str(ip), category
        if category == FORBIDDEN:
            why = "a link-local, cloud metadata, multicast or reserved address, never allowed"
        else:
            why = f"a {category} address; private, loopback and link-local addresses are not allowed"
        super().__init__(f"{host} is {self.ip}: {why}.")


def allow_private() -> bool:
    """The configured mode: ``ALLOW_PRIVATE_URLS`` (on outside production by default)."""
    return bool(current_app.config.get("ALLOW_PRIVATE_URLS"))


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in n for n in _EMBEDDED_V4) or (ip in _COMPAT_V4 and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def classify(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """``public``, ``private``, ``loopback`` or ``forbidden`` (never callable). IPv6 forms
    carrying an IPv4 address (mapped, compatible, 6to4, Teredo, NAT64) are judged by it."""
    if isinstance(ip, ipaddress.IPv6Address):
        ip = _embedded_v4(ip) or ip
    if any(ip.version == n.version and ip in n for n in _NEVER):
        return FORBIDDEN
    if ip.is_loopback:
        return LOOPBACK
    if ip.is_link_local or ip.is_multicast or ip.is_reserved or ip.is_unspecified:
        return FORBIDDEN
    if ip.is_private or not ip.is_global or getattr(ip, "is_site_local", False):
        return PRIVATE
    return PUBLIC


def literal_ip(host: str):
    """The address a host spells without DNS (IPv6 literal, dotted quad, or the BSD
    ``inet_aton`` forms: decimal, octal and hex parts, 1 to 4 of them), else None."""
    host = host.rstrip(".").lower()
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            return None
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_INET_PART.fullmatch(p) for p in parts):
        return None
    nums = [int(p[2:] or "0", 16) if p.startswith("0x") else int(p, 8) if p.startswith("0") else int(p)
            for p in parts]
    *head, last = nums
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    value = 0
    for n in head:
        value = value * 256 + n
    return ipaddress.IPv4Address(value * 256 ** (4 - len(head)) + last)


def check_ip(host: str, ip, allow_private_hosts: bool) -> None:
    """Raise ``AddressRefused`` unless ``ip`` may be called in this mode."""
    category = classify(ip)
    if category == FORBIDDEN or (category != PUBLIC and not allow_private_hosts):
        raise AddressRefused(host, ip, category)


def check_host(host: str, allow_private_hosts: bool) -> None:
    """The checks that need no DNS: metadata names and numeric spellings of addresses."""
    name = host.rstrip(".").lower()
    if name in METADATA_NAMES:
        raise AddressRefused(host, "a cloud metadata name", FORBIDDEN)
    ip = literal_ip(name)
    if ip is not None:
        check_ip(host, ip, allow_private_hosts)


def screen(host: str, port: int, allow_private_hosts: bool) -> list[tuple]:
    """Resolve ``host`` once and return the ``getaddrinfo`` entries (family, type, proto,
    canonname, sockaddr) after checking every one; raise ``AddressRefused`` if any address
    is refused (one bad answer refuses the host) and ``socket.gaierror`` if none resolve."""
    check_host(host, allow_private_hosts)
    infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    if not infos:
        raise socket.gaierror(socket.EAI_NONAME, "no address")
    for info in infos:
        check_ip(host, ipaddress.ip_address(info[4][0].split("%")[0]), allow_private_hosts)
    return infos


def validate_url(url: str, *, field: str = "url", resolve: bool = True,
                 allow_private_hosts: bool | None = None) -> str:
    """Return ``url`` if the service may store and later call it, else raise ``UnsafeURL``
    (422) naming ``field``. Checks the scheme (https; http too when private hosts are
    allowed), host and absence of credentials, then the host name and numeric spellings in
    every mode; when private hosts are not allowed and ``resolve`` is set, every address the
    host resolves to as well. Hosts are checked again on every connection (``http``)."""
    permissive = allow_private() if allow_private_hosts is None else allow_private_hosts
    if not isinstance(url, str) or len(url) > 2000:
        raise UnsafeURL(f"{field}: must be a URL of at most 2000 characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise UnsafeURL(f"{field}: not a valid URL.")
    if parts.scheme not in (("https", "http") if permissive else ("https",)):
        raise UnsafeURL(f"{field}: must be an https URL.")
    if not parts.hostname or parts.username or parts.password:
        raise UnsafeURL(f"{field}: must have a host and no credentials.")
    try:
        if permissive or not resolve:
            check_host(parts.hostname, permissive)
        else:
            screen(parts.hostname, port or 443, permissive)
    except AddressRefused as exc:
        raise UnsafeURL(f"{field}: {exc}") from None
    except (OSError, UnicodeError):
        raise UnsafeURL(f"{field}: the host does not resolve.") from None
    return url
