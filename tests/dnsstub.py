"""A resolver stub for SSRF tests: answers chosen addresses for chosen host names, one
answer per lookup in turn (the last repeats), and counts the lookups. Other names go to
the real resolver. It replaces ``socket.getaddrinfo``, which both the service and the
``requests``/urllib3 stack call, so it sees every lookup whatever code path makes it."""
from __future__ import annotations

import socket
from collections import Counter


class ResolverStub:
    def __init__(self):
        self.answers: dict[str, list[str]] = {}
        self.lookups: Counter = Counter()
        self._real = socket.getaddrinfo

    def __call__(self, host, port, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in self.answers:
            return self._real(host, port, *args, **kwargs)
        seq = self.answers[name]
        ip = seq[min(self.lookups[name], len(seq) - 1)]
        self.lookups[name] += 1
        port = int(port or 0)
        if ":" in ip:
            return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port, 0, 0))]
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port))]


def install(monkeypatch) -> ResolverStub:
    stub = ResolverStub()
    monkeypatch.setattr(socket, "getaddrinfo", stub)
    return stub
