"""CPU time and memory of the benchmark's processes, read from /proc.

Starting, readiness and teardown of those processes are the shared process helper's
(``tests.support.procs``); ``bench.setup.RUNNING`` holds everything a run starts.
"""
from __future__ import annotations

import os

_CLK = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int | None:
    """Resident memory of ``pid`` in KiB (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` (processes that are gone count as 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return total / _CLK
