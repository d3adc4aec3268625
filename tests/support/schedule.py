"""The order of the collected tests, so that ``pytest -n N --dist worksteal`` ends all its
workers at about the same time.

How worksteal distributes (pytest-xdist 3.x, ``WorkStealingScheduling``): the collection is
cut into N contiguous slices, one per worker (slice i holds ``remaining // (N - i)``
items); a worker runs its slice in order, and a worker that runs dry steals the second
half of the longest queue left. So a long test must be at the *start* of some slice: at
the end of a slice it is what is left when everything else is done, and one worker runs
it while the others wait (the 2026-11-28 runs ended on the schemathesis fuzz run, 4
minutes, alone).

``order`` keeps the tests of one module together (their module fixtures — a server, a
set of nodes — are paid once per worker that runs any of them; ``clients/python/tests``
counts as one unit: its session fixture serves one client server per worker), puts the
modules known to be long (``LONG``: seconds from a measured run, ``--durations``) at the
starts of the N slices, spread so that each slice gets about the same long-test time
(longest first, each to the slice with the least so far), and fills the slices with the
other tests in collection order. A stale ``LONG`` only makes the spread less even; it
never drops or repeats a test. Every worker computes the same order (the hook runs in
each worker, and xdist checks that the collections are identical).
"""
from __future__ import annotations

import os

# Seconds per unit (setup + call of its tests) measured on 2026-11-28 with 3 workers on the
# AMD host (`make test PYTEST_ARGS=--durations=80`); units of 10 s or more.
LONG: dict[str, float] = {
    "tests/e2e/test_fuzz.py": 308,
    "tests/e2e/test_connection_budget.py": 98,
    "tests/e2e/test_fault.py": 94,
    "clients/python/tests": 70,
    "tests/e2e/test_console_a11y.py": 65,
    "tests/e2e/test_multinode.py": 59,
    "tests/e2e/test_console_screenshots.py": 43,
    "tests/e2e/test_serve.py": 41,
    "tests/e2e/test_console_orgs_billing.py": 34,
    "tests/e2e/test_keys_gunicorn.py": 32,
    "tests/e2e/test_public_flows.py": 27,
    "tests/e2e/test_chat_litellm.py": 23,
    "tests/e2e/test_console_done.py": 23,
    "tests/e2e/test_console_issue40.py": 22,
    "tests/e2e/test_console_browser.py": 21,
    "tests/e2e/test_x402_client.py": 21,
    "tests/e2e/test_demo_flow.py": 21,
    "tests/services/test_usage_daily.py": 18,
    "tests/e2e/test_finalize_drain.py": 18,
    "tests/tasks/test_alerts.py": 15,
    "tests/e2e/test_revocation.py": 12,
    "tests/test_hotpath.py": 12,
    "tests/e2e/test_chat_sdks.py": 12,
    "tests/services/test_outbox.py": 11,
    "tests/services/test_http_upstream.py": 11,
    "tests/services/test_telemetry.py": 10,
}


def unit(nodeid: str) -> str:
    """The scheduling unit of a test: its module, or ``clients/python/tests``."""
    path = nodeid.split("::", 1)[0]
    return "clients/python/tests" if path.startswith("clients/python/tests/") else path


def slice_sizes(total: int, workers: int) -> list[int]:
    """The sizes of worksteal's initial slices (``_send_tests`` in ``check_schedule``)."""
    sizes, remaining = [], total
    for i in range(workers):
        n = remaining // (workers - i)
        sizes.append(n)
        remaining -= n
    return sizes


def order(items: list, workers: int) -> list:
    """``items`` reordered for ``workers`` worksteal workers (see the module docstring);
    ``workers`` <= 1: the long units first, longest first, then the rest."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(unit(item.nodeid), []).append(item)
    long = sorted((u for u in groups if u in LONG), key=lambda u: -LONG[u])
    rest = [item for u, group in groups.items() if u not in LONG for item in group]
    if workers <= 1:
        return [item for u in long for item in groups[u]] + rest
    sizes = slice_sizes(len(items), workers)
    heads: list[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for u in long:
        fits = [i for i in range(workers) if len(heads[i]) + len(groups[u]) <= sizes[i]]
        i = min(fits or range(workers), key=lambda k: (load[k], k))
        heads[i] += groups[u]
        load[i] += LONG[u]
    out, pos = [], 0
    for i in range(workers):
        take = max(0, sizes[i] - len(heads[i]))
        out += heads[i] + rest[pos:pos + take]
        pos += take
    return out + rest[pos:]


def worker_count() -> int:
    """The number of xdist workers of this run (0 outside xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
