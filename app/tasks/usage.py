"""Usage rollups: roll the final hours of the call logs into ``usage_hourly`` and the fully
rolled days into ``usage_daily``."""
from __future__ import annotations


def roll_usage() -> int:
    from app.services.billing import usage_log

    return usage_log.roll()
