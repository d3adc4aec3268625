"""Agent jobs: monthly settlement, purge of expired sessions."""
from __future__ import annotations


def settle_due():
    """Settle the previous month (idempotent; scheduled every few hours)."""
    from app.services.money import settlement

    return settlement.settle_due()


def settle_month(month: str):
    from app.services.money import settlement

    return settlement.settle_month(month)


def purge_expired() -> int:
    from app.services.agents import identity as agents

    return agents.purge_expired()
