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


def issue_payment_invoices() -> int:
    """Invoice the credited payments that have none (x402 payments; scheduled every minute)."""
    from app.services.billing import invoices

    return invoices.issue_missing()


def issue_usage_invoices():
    """Issue last month's usage invoices once it is over (idempotent; scheduled hourly)."""
    from app.services.billing import invoices

    return invoices.issue_usage_due()


def expire_sandbox_checkouts() -> int:
    """Expire the sandbox's unpaid checkouts past their time, as Stripe's
    ``checkout.session.expired`` does (scheduled every minute)."""
    from app.services.billing import sandbox_checkout

    return sandbox_checkout.expire_due()


def run_payouts() -> dict:
    """Open, send, retry and recover payouts (scheduled every 10 minutes)."""
    from app.services.billing import payouts

    return payouts.run()
