"""Agent jobs: monthly settlement, purge of expired sessions, disabled agents' balances."""
from __future__ import annotations


def settle_due():
    """Settle the previous month (idempotent; scheduled every few hours), then pay out
    what owners with a payout destination are owed."""
    from app.services.billing import payouts
    from app.services.money import settlement

    out = settlement.settle_due()
    payouts.run()
    return out


def settle_month(month: str):
    from app.services.money import settlement

    return settlement.settle_month(month)


def purge_expired() -> int:
    from app.services.agents import identity as agents

    return agents.purge_expired()


def return_disabled_balances() -> int:
    from app.services.agents import disable

    return disable.return_balances()
