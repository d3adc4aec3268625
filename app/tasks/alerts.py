"""Alert jobs: evaluate every rule (scheduled every minute)."""
from __future__ import annotations


def evaluate() -> dict:
    from app.services.billing import alerts

    result = alerts.evaluate_all()
    return {k: v for k, v in result.items() if k != "event_ids"}
