"""Module-call housekeeping jobs: refund crashed pending calls, purge old idempotency keys."""
from __future__ import annotations


def sweep_pending_calls() -> int:
    from app.services.gateway import calls as gateway

    return gateway.sweep_pending()


def purge_idempotency() -> int:
    from app.services.gateway import calls as gateway

    return gateway.purge_idempotency()
