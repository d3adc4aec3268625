"""Revenue share with integrity: who accrues a share of a call, and how a late refund is
taken back (DESIGN §3, docs/money.md "Revenue share").

The **earner** of a module is its owner: an agent (``agt_…``, agent-built modules) or an
account or organisation (``acct_…``, a catalog module with ``owner_account_id``). Its id
names its ledger accounts (``earnings:<earner>``, ``carry:<earner>``) and is what a call row
records as its module's owner (``module_calls.owner_agent_id``, a historical name).

* ``call_legs(account_id, price, earner)``: the legs of a call's charge (the
  accrual): customer −P; revenue +P, or +0.7P revenue / +0.3P ``earnings:<earner>``.
  ``gw_open_calls`` posts them; a refund posts their ``reverse``.
* ``share_micros(price, earner, caller_account_id)``: 30% of a call to an owned module
  accrues to ``earnings:<earner>`` — unless the caller is the owner's own side: for an
  agent, the agent's own account, the account that registered the agent, or any other
  agent of that account; for an account, the account itself or any of its agents
  (self-dealing accrues nothing; the whole price is revenue). A refund recomputes the
  same decision.
* ``reverse(legs)``: the legs of a refund. An ``earnings:`` debit larger than what the
  agent still has accrued (its month was already settled) takes the rest from
  ``carry:<agent>``, a negative carry-over (a receivable, never positive) instead of a
  negative earnings balance. Race-free: it locks the agent's row (``SELECT … FOR UPDATE``)
  before reading the earnings balance — the lock the monthly settlement takes before it
  reads that balance — so a refund and a settlement (or two refunds) of the same agent
  never act on a balance the other is changing; the second reads what the first committed
  (tests/api/test_revenue_share_race.py).
* ``recover(agent_id, amount)``: at settlement, the part of ``amount`` that repays the
  carry-over first; the rest reaches the agent's balance.

Helpers only: they join the caller's unit of work and never commit.
"""
from __future__ import annotations

from sqlalchemy import or_, select

from app.extensions import db
from app.models import Account, Agent
from app.services.money import ledger
from app.services.platform.uow import lock_key

OWNER_SHARE_NUM, OWNER_SHARE_DEN = 3, 10  # 30% of a call's price accrues to the owner agent


def is_agent(earner: str) -> bool:
    """An agent earner (``agt_…``); otherwise an account or organisation (``acct_…``)."""
    return earner.startswith("agt_")


def accrues(earner: str, caller_account_id: str) -> bool:
    """False when the caller is the module owner's own side (one query)."""
    if is_agent(earner):
        owner = select(Agent.owner_account_id).where(Agent.id == earner).scalar_subquery()
        own = or_(Account.agent_id == earner, Account.id == owner, Account.owner_account_id == owner)
    else:
        own = or_(Account.id == earner, Account.owner_account_id == earner)
    own_side = db.session.execute(select(Account.id).where(Account.id == caller_account_id, own)).first()
    return own_side is None


def share_micros(price_micros: int, earner: str | None, caller_account_id: str) -> int:
    """The owner agent's share of a call's price (0: no owner agent, or self-dealing)."""
    if not earner or not accrues(earner, caller_account_id):
        return 0
    return price_micros * OWNER_SHARE_NUM // OWNER_SHARE_DEN


def call_legs(account_id: str, price_micros: int, earner: str | None) -> list[tuple[str, int]]:
    """The ledger legs of a call's charge: customer −P; revenue +P, or +0.7P revenue /
    +0.3P ``earnings:<owner agent>`` (no share when self-dealing)."""
    share = share_micros(price_micros, earner, account_id)
    if share:
        return [(ledger.customer(account_id), -price_micros), (ledger.REVENUE, price_micros - share),
                (ledger.earnings(earner), share)]
    return [(ledger.customer(account_id), -price_micros), (ledger.REVENUE, price_micros)]


def reverse(legs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Refund legs whose ``earnings:`` debits never overdraw: the uncovered part goes to
    the agent's negative carry-over."""
    out: list[tuple[str, int]] = []
    for code, amount in legs:
        if code.startswith(ledger.EARNINGS) and amount < 0:
            lock_earner(code[len(ledger.EARNINGS):])
            available = max(ledger.balance(code), 0)
            taken = min(available, -amount)
            out.append((code, -taken))
            out.append((ledger.carry(code[len(ledger.EARNINGS):]), amount + taken))
        else:
            out.append((code, amount))
    return out


def lock_earner(earner: str) -> None:
    """Lock the earner until the caller's transaction ends: what serializes every
    read-then-post of its earnings and carry-over (settlement, refunds). An agent: its row
    (``SELECT … FOR UPDATE``); an account: a transaction advisory lock on its earner id
    (not the account row, which ``gw_post`` locks in account-id order for its balance)."""
    if is_agent(earner):
        db.session.execute(select(Agent.id).where(Agent.id == earner).with_for_update())
    else:
        lock_key("earner:" + earner)


lock_agent = lock_earner


def recover(agent_id: str, amount_micros: int) -> int:
    """How much of a settlement of ``amount_micros`` repays the agent's carry-over (the
    caller holds the agent's lock, ``lock_agent``)."""
    owed = -ledger.balance(ledger.carry(agent_id))
    return max(0, min(owed, amount_micros))
