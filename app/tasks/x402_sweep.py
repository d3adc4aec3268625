"""Periodic job: book settled x402 payments that a crash left unbooked (as account credit)."""
from __future__ import annotations


def book_orphan_x402_payments() -> int:
    from app.services.billing import x402

    return x402.book_orphans()
