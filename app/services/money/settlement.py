"""Monthly settlement of module owners' earnings (SPEC part 1 item 7, DESIGN §3).

An earner is an agent or an account (or organisation) owning a catalog module
(``revenue_share``); "agent" below stands for either (an account's statement has
``owner_account_id``, its lock is an advisory lock, its settlement goes to its own balance).
With a payout destination the settlement goes to ``payable:<account>`` instead of the
balance, and ``billing.payouts`` pays it out as money.

For month M and each agent, the amount settled is everything accrued to
``earnings:<agent>`` up to the end of M (calls, minus their refunds) that no earlier
settlement moved yet — capped by the current balance of ``earnings:<agent>``, so a
refund posted after M never drives it negative: such a refund takes what earnings cannot
cover from ``carry:<agent>`` (a negative carry-over, ``revenue_share``), and the next
settlement repays that carry-over before anything reaches the agent's balance. Each agent is settled in ONE database
transaction: the ledger posting (``earnings:<agent>`` → ``acct:<agent account>``, kind
``agent_settlement``, ref ``settle:<agent>:<YYYY-MM>``, unique), the statement row
(unique per agent and month) and the outbox row of the signed ``settlement.completed``
event. A crash at any point leaves each agent fully settled or not at all; running a
month again changes nothing (statement exists → skipped; the unique ref and statement
stop a concurrent run). Agents with nothing to settle get no statement.

A month is settled only once it ended ``SETTLEMENT_GRACE_SECONDS`` ago (default 1 h),
so calls charged in its last seconds have been finalized or refunded.
"""
from __future__ import annotations

import logging
import re
from datetime import datetime, timedelta, timezone

from flask import current_app
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.errors import InternalError, InvalidRequest
from app.extensions import db
from app.ids import new_id
from app.models import Account, Agent, AgentSettlement, LedgerEntry, LedgerTransaction, PayoutDestination
from app.models.base import utcnow
from app.services.money import ledger
from app.services.agents.identity import send_event
from app.services.platform.uow import unit_of_work
from app.services.money import revenue_share
from app.services.agents.earnings import (_EARNINGS_HI, _EARNINGS_LO, SETTLEMENT_KIND, settled_micros,
                                         statement_amounts)

log = logging.getLogger(__name__)
_MONTH_RE = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


class SettlementIncomplete(InternalError):
    message = "Some agents could not be settled."


def month_bounds(month: str) -> tuple[datetime, datetime]:
    m = _MONTH_RE.match(month or "")
    if not m:
        raise InvalidRequest("month: must be YYYY-MM.")
    start = datetime(int(m.group(1)), int(m.group(2)), 1, tzinfo=timezone.utc)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def previous_month(now: datetime | None = None) -> str:
    now = (now or utcnow()).astimezone(timezone.utc)
    last = now.replace(day=1) - timedelta(days=1)
    return f"{last.year:04d}-{last.month:02d}"


def _accrued_until(agent_id: str, end: datetime) -> int:
    """Sum of the non-settlement entries on ``earnings:<agent>`` created before ``end``."""
    return int(db.session.execute(
        select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0))
        .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.txn_id)
        .where(LedgerEntry.ledger_account == ledger.earnings(agent_id), LedgerEntry.created_at < end,
               LedgerTransaction.kind != SETTLEMENT_KIND)).scalar_one())


def candidates(end: datetime) -> list[str]:
    """Earners (agents, owner accounts) with earnings entries before ``end``."""
    codes = db.session.execute(
        select(LedgerEntry.ledger_account).distinct()
        .where(LedgerEntry.ledger_account >= _EARNINGS_LO, LedgerEntry.ledger_account < _EARNINGS_HI,
               LedgerEntry.created_at < end)).scalars()
    return sorted(c[len(ledger.EARNINGS):] for c in codes)


def credit_account(beneficiary: str) -> str:
    """Where a settlement of ``beneficiary``'s earnings goes: ``payable:<account>`` when the
    account has a payout destination (paid out by ``billing.payouts``), else its balance."""
    paid_out = db.session.execute(select(PayoutDestination.id).where(
        PayoutDestination.account_id == beneficiary)).first()
    return ledger.payable(beneficiary) if paid_out else ledger.customer(beneficiary)


def settle_agent(agent_id: str, month: str, *, end: datetime) -> dict:
    """Settle one earner (agent or owner account) for ``month`` in one unit of work."""
    try:
        with unit_of_work():
            return _settle_earner(agent_id, month, end)
    except IntegrityError:  # a concurrent run settled this earner and month first
        return {"agent_id": agent_id, "status": "already_settled"}


settle_earner = settle_agent


def _settle_earner(earner: str, month: str, end: datetime) -> dict:
    s = db.session
    agent = None
    if revenue_share.is_agent(earner):
        agent = s.execute(select(Agent).where(Agent.id == earner).with_for_update()).scalar_one_or_none()
        if agent is None:
            return {"agent_id": earner, "status": "unknown_agent"}
        beneficiary, mine = agent.account_id, AgentSettlement.agent_id == earner
    else:
        if s.get(Account, earner) is None:
            return {"agent_id": earner, "status": "unknown_owner"}
        revenue_share.lock_earner(earner)
        beneficiary, mine = earner, AgentSettlement.owner_account_id == earner
    done = s.execute(select(AgentSettlement.id).where(mine, AgentSettlement.month == month)).first()
    if done is not None:
        return {"agent_id": earner, "status": "already_settled", "settlement_id": done[0]}
    amount = min(_accrued_until(earner, end) - settled_micros(earner), ledger.balance(ledger.earnings(earner)))
    if amount <= 0:
        return {"agent_id": earner, "status": "nothing_to_settle"}
    now = utcnow()
    recovered = revenue_share.recover(earner, amount)  # a negative carry-over is repaid first
    # a disabled agent's earnings go to its balance, which goes back to its owner
    # (agents.disable), never to a payout destination set with the agent's credential
    to = ledger.customer(beneficiary) if agent is not None and agent.disabled_at is not None \
        else credit_account(beneficiary)
    txn_id = ledger.post(SETTLEMENT_KIND, [(ledger.earnings(earner), -amount),
                                           (ledger.carry(earner), recovered),
                                           (to, amount - recovered)],
                         ref=f"settle:{earner}:{month}", account_id=beneficiary,
                         meta={"agent_id": earner, "month": month, "to": to}, created_at=now)
    stmt = AgentSettlement(id=new_id("stl"), agent_id=agent.id if agent else None,
                           owner_account_id=None if agent else earner, month=month, amount_micros=amount,
                           ledger_txn_id=txn_id, created_at=now)
    s.add(stmt)
    if agent is not None:  # delivery is enqueued after the commit (none for a disabled agent)
        send_event(agent, "settlement.completed", {
            "settlement_id": stmt.id, "agent_id": earner, "account_id": agent.account_id,
            "month": month, **statement_amounts(amount, recovered), "settled_at": now.isoformat()},
            source=f"settlement:{stmt.id}")
    # as its statement reads: ``amount`` reached the earner, the rest repaid the carry-over
    return {"agent_id": earner, "status": "settled", "settlement_id": stmt.id,
            **statement_amounts(amount, recovered)}


def settle_month(month: str, *, now: datetime | None = None) -> dict:
    """Settle every agent for ``month`` (``YYYY-MM``). Idempotent. An agent that fails is
    rolled back and reported (the others are still settled); then SettlementIncomplete.
    ``total_cents`` is what reached the earners (not what repaid carry-overs)."""
    start, end = month_bounds(month)
    now = now or utcnow()
    grace = timedelta(seconds=int(current_app.config["SETTLEMENT_GRACE_SECONDS"]))
    if now < end + grace:
        raise InvalidRequest(f"month: {month} can be settled from {(end + grace).isoformat()} on.")
    results, failed = [], []
    for agent_id in candidates(end):
        try:
            results.append(settle_agent(agent_id, month, end=end))
        except Exception as exc:  # noqa: BLE001 - rolled back; reported and retried next run
            log.exception("settlement of %s for %s failed", agent_id, month)
            failed.append({"agent_id": agent_id, "status": "failed", "error": type(exc).__name__})
    summary = {"month": month, "settled": sum(r["status"] == "settled" for r in results),
               "already_settled": sum(r["status"] == "already_settled" for r in results),
               "total_cents": ledger.micros_to_cents(sum(r.get("amount_micros", 0) for r in results)),
               "agents": results + failed, "failed": len(failed)}
    if failed:
        raise SettlementIncomplete(f"{len(failed)} agent(s) could not be settled for {month}; "
                                   "run again to retry them.", extra={"summary": summary})
    return summary


def settle_due(now: datetime | None = None) -> dict | None:
    """Scheduled: settle the previous month once its grace period is over (else None)."""
    now = now or utcnow()
    month = previous_month(now)
    _, end = month_bounds(month)
    if now < end + timedelta(seconds=int(current_app.config["SETTLEMENT_GRACE_SECONDS"])):
        return None
    return settle_month(month, now=now)
