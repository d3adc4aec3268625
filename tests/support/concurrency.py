"""Run one action in several threads released together (races in tests)."""
from __future__ import annotations

import threading
from typing import Callable


def at_once(n: int, action: Callable[[], object]) -> list:
    """``action()`` in ``n`` threads that start it at the same moment (a barrier); the
    results in completion order."""
    barrier = threading.Barrier(n)
    results: list = []
    lock = threading.Lock()

    def run():
        barrier.wait()
        out = action()
        with lock:
            results.append(out)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
