"""User / system CPU and context switches per request of passthrough and metered at c=16
(``python bench/ctxswitch.py``; ``PAIRS`` alternating pairs, default 3, 5 s each).

Starts the bench stack as ``make bench`` does (``bench.run.Bench.start``: its database,
nginx upstream and gunicorn), loads the bench module, then runs passthrough and metered in
turn with wrk and reads, before and after each run, ``/proc/<pid>/stat`` (utime, stime) and
every thread's ``voluntary_ctxt_switches`` / ``nonvoluntary_ctxt_switches`` of the gunicorn
processes and of the PostgreSQL backends. Prints one line per run; writes nothing under
``bench/results/``; stops everything it started.
"""
from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import run as R  # noqa: E402
from bench import scenarios, seed, setup  # noqa: E402
from bench.interleave import start_stack  # noqa: E402
from tests.support import procs  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def snapshot(pids: list[int]) -> tuple[float, float, int, int]:
    """(user s, system s, voluntary switches, involuntary switches) of ``pids``."""
    user = system = vol = invol = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
            for status in glob.glob(f"/proc/{pid}/task/*/status"):
                for line in open(status):
                    if line.startswith("voluntary_ctxt_switches"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol += int(line.split()[1])
        except OSError:
            continue
    return user / CLK, system / CLK, vol, invol


def per_request(before, after, n: int) -> tuple[float, float, float, float]:
    """CPU in ms and switches per request between two snapshots."""
    return (1000 * (after[0] - before[0]) / n, 1000 * (after[1] - before[1]) / n,
            (after[2] - before[2]) / n, (after[3] - before[3]) / n)


def main() -> int:
    bench = R.Bench()
    try:
        gw, keys = start_stack(bench)
        specs = {"passthrough": (f"{gw}/bench/passthrough", {}, False, None),
                 "metered": (f"{gw}/v1/module/{seed.MODULE_SLUG}/call",
                             {"Authorization": f"Bearer {keys[0]}"}, True, keys)}
        for _ in range(int(os.environ.get("PAIRS", "3"))):
            for name, (url, headers, idempotency, auth_keys) in specs.items():
                server, pg = procs.descendants(bench.gunicorn.pid), setup.pg_backend_pids()
                a, b = snapshot(server), snapshot(pg)
                script = R.wrk_script("POST", {**headers, "Content-Type": "application/json"},
                                      scenarios.MODULE_BODY, idempotency, auth_keys)
                stats, _ = R.run_wrk(url, script, 16, 5)
                pg = sorted(set(pg) | set(setup.pg_backend_pids()))
                s = per_request(a, snapshot(server), stats["requests"])
                p = per_request(b, snapshot(pg), stats["requests"])
                print(f"{name:12} {stats['rps']:7.0f} req/s  gunicorn user {s[0]:.2f} sys {s[1]:.2f} ms, "
                      f"switches {s[2]:.1f} voluntary {s[3]:.1f} involuntary | PostgreSQL user {p[0]:.2f} "
                      f"sys {p[1]:.2f} ms, switches {p[2]:.1f} / {p[3]:.1f}", flush=True)
    finally:
        setup.RUNNING.stop_all()
        setup.drop_cached_state()
    return 0


if __name__ == "__main__":
    sys.exit(main())
