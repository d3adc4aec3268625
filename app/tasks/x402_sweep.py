"""Periodic job: x402 reconciliation (book settled-unbooked payments as account credit,
resolve ``reserved`` authorizations older than X402_RECONCILE_AFTER_SECONDS)."""
from __future__ import annotations


def reconcile_x402() -> dict:
    from app.services.billing import x402

    return x402.reconcile()
