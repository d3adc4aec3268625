"""Connections (or sessions) a process keeps between requests: a free list, not one per
thread.

A request takes an idle one (or a new one is made), uses it alone, and gives it back, so a
process holds as many as were ever in use at the same time, and keeps at most ``idle_max``
of them idle (one given back beyond that is closed). Not a thread-local: under gunicorn's
gevent worker a "thread" is a client connection's greenlet, and a new greenlet per client
connection would connect again each time. A forked child starts an empty list (what it
inherited belongs to the parent's sockets). Users: ``ratecount`` (raw Redis connections for
the rate-limit script) and ``http.session`` (``requests`` sessions of the cold paths).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")
IDLE_MAX = 16


class FreeList(Generic[T]):
    def __init__(self, make: Callable[[], T], close: Callable[[T], object], idle_max: int = IDLE_MAX):
        self._make, self._close, self.idle_max = make, close, idle_max
        self._pid, self.idle = os.getpid(), []

    @contextmanager
    def lend(self) -> Iterator[T]:
        """An idle item (or a new one) for the block, given back after it."""
        if self._pid != os.getpid():
            self._pid, self.idle = os.getpid(), []
        idle = self.idle
        try:
            item = idle.pop()
        except IndexError:
            item = self._make()
        try:
            yield item
        finally:
            if len(idle) < self.idle_max:
                idle.append(item)
            else:
                self._close(item)
