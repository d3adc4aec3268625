"""Agent usage, earnings and the weekly leaderboard (SPEC endpoints 11–13).

Earnings are the ledger account ``earnings:<agent_id>``: each call to a module the agent
owns credits 30% of its price there (in the call's ledger transaction, by the gateway;
a refund reverses it), and monthly settlement (``app.services.money.settlement``) moves it to
the agent account's balance. So: accrued (unsettled) = the balance of
``earnings:<agent>`` plus its negative carry-over ``carry:<agent>`` (a refund after the
month was settled: negative while nothing accrued repays it); settled = what settlement
transactions moved to the agent's balance (or ``payable:``), not the part that repaid a
carry-over; lifetime = accrued + settled = the shares of its calls net of their refunds.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import and_, func, or_, select

from app.extensions import db
from app.models import Agent, AgentSettlement, LedgerEntry, LedgerTransaction
from app.models.base import utcnow
from app.services.money import ledger
from app.services.billing import usage

SETTLEMENT_KIND = "agent_settlement"
LEADERBOARD_DEFAULT = 10
LEADERBOARD_MAX = 100
# ledger_account range covering every "earnings:<id>" code (':' + 1 == ';'), index-friendly;
# and the agents' ones ("earnings:agt_…", '_' + 1 == '`') for the agent leaderboard.
_EARNINGS_LO, _EARNINGS_HI = ledger.EARNINGS, ledger.EARNINGS[:-1] + ";"
_AGENT_LO, _AGENT_HI = ledger.EARNINGS + "agt_", ledger.EARNINGS + "agt`"
_CARRY_LO, _CARRY_HI = ledger.CARRY + "agt_", ledger.CARRY + "agt`"  # agents' carry-overs


def agent_usage(agent: Agent, now: datetime | None = None) -> dict:
    """The agent account's calls and spend in the current billing period, by module and by
    chat model, in the agent's mode (its sessions act in it: a test-mode agent's calls are test calls)."""
    start, end = usage.billing_period(now)
    tot = usage.totals(agent.account_id, start, end, mode=agent.mode)
    rows = usage.by_product(agent.account_id, start, end, mode=agent.mode)
    return {"agent_id": agent.id, "period_start": start, "period_end": end,
            "calls": tot["calls"], "errors": tot["errors"],
            "spend_cents": ledger.micros_to_cents(tot["spend_micros"]),
            **usage.modules_and_models(rows)}


def _settled_from(*accounts: str) -> int:
    """What settlement transactions posted on ``accounts``, negated (positive)."""
    return -int(db.session.execute(
        select(func.coalesce(func.sum(LedgerEntry.amount_micros), 0))
        .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.txn_id)
        .where(LedgerEntry.ledger_account.in_(accounts),
               LedgerTransaction.kind == SETTLEMENT_KIND)).scalar_one())


def settled_micros(agent_id: str) -> int:
    """Total moved out of ``earnings:<agent>`` by settlements (positive)."""
    return _settled_from(ledger.earnings(agent_id))


def paid_micros(earner: str) -> int:
    """Total settlements moved to the earner's balance (or ``payable:``): what they took out
    of ``earnings:<earner>`` less what repaid ``carry:<earner>`` (positive)."""
    return _settled_from(ledger.earnings(earner), ledger.carry(earner))


def _statements(earner: str, mine, limit: int) -> list[dict]:
    """The ``limit`` most recent monthly statements, newest first. A statement's row holds
    what its settlement took out of ``earnings:<earner>`` (``earned``); the part of it that
    repaid a carry-over (its leg on ``carry:<earner>``) did not reach the earner, so
    ``amount`` is the rest: the statements add up to ``paid_micros``."""
    rows = list(db.session.execute(
        select(AgentSettlement).where(mine)
        .order_by(AgentSettlement.month.desc()).limit(limit)).scalars())
    repaid = dict(db.session.execute(
        select(LedgerEntry.txn_id, LedgerEntry.amount_micros)
        .where(LedgerEntry.txn_id.in_([r.ledger_txn_id for r in rows]),
               LedgerEntry.ledger_account == ledger.carry(earner))).all()) if rows else {}
    return [{"id": r.id, "month": r.month, "created_at": r.created_at,
             **statement_amounts(r.amount_micros, repaid.get(r.ledger_txn_id, 0))} for r in rows]


def statement_amounts(earned_micros: int, repaid_micros: int) -> dict:
    """A statement's amounts (the earnings page and the ``settlement.completed`` event):
    ``amount`` reached the earner, ``carry_over_repaid`` repaid a late refund's carry-over,
    ``earned`` is their sum (what the settlement took out of the earnings)."""
    amounts = {"amount_micros": earned_micros - repaid_micros, "earned_micros": earned_micros,
               "carry_over_repaid_micros": repaid_micros}
    return {**{k.replace("_micros", "_cents"): ledger.micros_to_cents(v) for k, v in amounts.items()}, **amounts}


def _earnings(earner: str, mine, statements: int) -> dict:
    accrued = ledger.balance(ledger.earnings(earner)) + ledger.balance(ledger.carry(earner))
    settled = paid_micros(earner)
    rows = _statements(earner, mine, statements)
    return {
        "share_pct": 30,
        "accrued_cents": ledger.micros_to_cents(accrued),
        "settled_cents": ledger.micros_to_cents(settled),
        "lifetime_cents": ledger.micros_to_cents(accrued + settled),
        "accrued_micros": accrued,
        "settled_micros": settled,
        "lifetime_micros": accrued + settled,
        "settlements": rows,
    }


def agent_earnings(agent: Agent, *, statements: int = 12) -> dict:
    return {"agent_id": agent.id, **_earnings(agent.id, AgentSettlement.agent_id == agent.id, statements)}


def owner_earnings(account_id: str, *, statements: int = 12) -> dict:
    """The earnings of the catalog modules ``account_id`` owns (an account or organisation
    as module owner, ``modules.owner_account_id``), as ``agent_earnings`` shows an agent's;
    with what is settled but still owed to a payout destination (``payable``)."""
    from app.services.billing import payouts

    out = _earnings(account_id, AgentSettlement.owner_account_id == account_id, statements)
    return {"account_id": account_id, **out, **payouts.owed(account_id)}


def iso_week(now: datetime | None = None) -> tuple[datetime, datetime]:
    """[Monday 00:00 UTC, next Monday) of the ISO week containing ``now``."""
    now = (now or utcnow()).astimezone(timezone.utc)
    start = (now - timedelta(days=now.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    return start, start + timedelta(days=7)


def leaderboard(limit: int = LEADERBOARD_DEFAULT, now: datetime | None = None) -> dict:
    """Top agents by earnings accrued this ISO week (UTC): the sum of this week's entries
    on ``earnings:*`` and ``carry:*`` excluding settlements (refunds count against, also
    one taken from the carry-over because its month was settled). Ties: agent id order."""
    limit = max(1, min(int(limit), LEADERBOARD_MAX))
    start, end = iso_week(now)
    total = func.sum(LedgerEntry.amount_micros)
    agent = func.split_part(LedgerEntry.ledger_account, ":", 2)  # earnings:<agent> / carry:<agent>
    rows = db.session.execute(
        select(agent, total)
        .join(LedgerTransaction, LedgerTransaction.id == LedgerEntry.txn_id)
        .where(or_(and_(LedgerEntry.ledger_account >= _AGENT_LO, LedgerEntry.ledger_account < _AGENT_HI),
                   and_(LedgerEntry.ledger_account >= _CARRY_LO, LedgerEntry.ledger_account < _CARRY_HI)),
               LedgerEntry.created_at >= start, LedgerEntry.created_at < end,
               LedgerTransaction.kind != SETTLEMENT_KIND)
        .group_by(agent)
        .having(total > 0)
        .order_by(total.desc(), agent)
        .limit(limit)).all()
    ids = [aid for aid, _ in rows]
    names = dict(db.session.execute(select(Agent.id, Agent.name).where(Agent.id.in_(ids))).all()) \
        if ids else {}
    entries = [{"rank": i + 1, "agent_id": aid, "name": names.get(aid, ""),
                "earnings_cents": ledger.micros_to_cents(int(amount))}
               for i, (aid, (_, amount)) in enumerate(zip(ids, rows))]
    return {"week_start": start, "week_end": end, "limit": limit, "entries": entries}


def usage_for(agent_id: str, *, account_id: str, caller_agent_id: str | None,
              mode: str = "live") -> dict:
    """Endpoint 11: ``agent_usage`` of an agent the caller may see (else 404)."""
    from app.services.agents.identity import visible_agent

    return agent_usage(visible_agent(agent_id, account_id=account_id, caller_agent_id=caller_agent_id, mode=mode))


def earnings_for(agent_id: str, *, account_id: str, caller_agent_id: str | None,
              mode: str = "live") -> dict:
    """Endpoint 12: ``agent_earnings`` of an agent the caller may see (else 404)."""
    from app.services.agents.identity import visible_agent

    return agent_earnings(visible_agent(agent_id, account_id=account_id, caller_agent_id=caller_agent_id, mode=mode))
