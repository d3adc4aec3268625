"""Billing jobs: auto top-up (app/services/billing/autotopup.py)."""
from __future__ import annotations


def start_autotopups() -> int:
    """Enqueue the due auto top-up runs (scheduled every 5 s)."""
    from app.services.billing import autotopup

    return autotopup.start_due()


def run_autotopup(run_id: int) -> str:
    """Charge one auto top-up run (claimed: a second worker does nothing)."""
    from app.services.billing import autotopup

    return autotopup.run(run_id)


def run_payouts() -> dict:
    """Open, send, retry and recover payouts (scheduled every 10 minutes)."""
    from app.services.billing import payouts

    return payouts.run()
