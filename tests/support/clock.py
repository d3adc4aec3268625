"""Waiting for a clock-aligned rate window (the counters' windows start at whole minutes,
seconds…: app/services/platform/ratecount.py), so that a test's few requests all fall in
one window instead of straddling its end on a slow machine."""
from __future__ import annotations

import time


def fresh_window(seconds: int = 60, needed: float = 15.0) -> None:
    """Return when at least ``needed`` seconds of the current ``seconds``-long window are
    left, sleeping into the next window if fewer are."""
    left = seconds - time.time() % seconds
    if left < needed:
        time.sleep(left + 0.2)
