"""Owner funds an agent: one ledger transfer from the owner's balance to the agent's
account (issue 16 item 2; docs/agents.md "Funding an agent").

``fund(owner_account_id, agent_id, amount_cents, idempotency_key)`` is one unit of work
posting ``agent_fund`` (owner ``acct:`` −N, agent ``acct:`` +N). The posting's unique
``ref`` (``agent_fund:<owner>:<sha256 of the Idempotency-Key>``) makes it happen exactly
once per key: a repeat with the same agent and amount answers the first transfer
(``replayed: true``), with anything else 409 ``idempotency_key_reused``. Without a key
every request is a new transfer.
"""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.errors import Conflict, InvalidRequest, NotFound, PaymentRequired
from app.extensions import db
from app.ids import new_id, sha256_hex
from app.models import LedgerTransaction
from app.services.agents.identity import get_agent
from app.models.base import utcnow
from app.services.money import funding, ledger, spend
from app.services.platform.idempotency import IdempotencyKeyReused
from app.services.platform.uow import unit_of_work

MAX_FUND_CENTS = 10_000_000  # 100,000 USD per transfer


class OwnerFundsShort(PaymentRequired):
    code = "insufficient_funds"
    description = ("The owner's balance cannot cover the transfer to the agent; nothing moved. "
                   "Add credits to the owner account first (`POST /api/pay/checkout`, `POST /api/wallet/fund`).")


class AgentNotFundable(Conflict):
    code = "agent_not_fundable"
    description = ("The agent was disabled (`DELETE /api/agent/{id}`): it takes no more money, and what it held "
                   "went back to its owner; nothing moved.")


def _balance_cents(account_id: str, mode: str) -> int:
    return ledger.micros_to_cents(ledger.cached_balance(account_id, mode))


def fund(owner_account_id: str, agent_id: str, amount_cents: int, *,
         idempotency_key: str | None = None, mode: str = "live", spend_key: str | None = None) -> dict:
    """Move ``amount_cents`` from the owner to its agent, in ``mode`` (the caller's: both
    balances of that mode). 404 for an agent of another account (or an agent's own
    credential) or of the other mode (a test key never moves live money, nor funds a live
    agent), 400 for a bad amount, 402 ``insufficient_funds`` when the owner's balance is
    short, 409 ``agent_not_fundable`` for a disabled agent (a replay of a funding made
    before it was disabled still answers that funding). A funding that races the
    disabling and commits first is returned by the ``agent-balances-return`` job.
    ``spend_key``: the API key whose spend limit (and member budget) the transfer counts
    against, as a charge does (``auth.key_of``; live mode only): 402
    ``key_spend_limit_reached`` / ``member_budget_exceeded`` past it, nothing moved."""
    if isinstance(amount_cents, bool) or not isinstance(amount_cents, int) or not 1 <= amount_cents <= MAX_FUND_CENTS:
        raise InvalidRequest(f"amount_cents: must be an integer from 1 to {MAX_FUND_CENTS}.")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= 128:
        raise InvalidRequest("Idempotency-Key: must be 1 to 128 characters.")
    kind = "agent_fund" if mode == "live" else "agent_fund_test"  # a key's idempotency is per mode
    ref = (f"{kind}:{owner_account_id}:{sha256_hex(idempotency_key)[:40]}" if idempotency_key
           else f"{kind}:{new_id('fund')}")
    micros = ledger.cents_to_micros(amount_cents)
    try:
        with unit_of_work():
            agent = get_agent(agent_id)
            if agent.owner_account_id != owner_account_id or agent.mode != mode:
                raise NotFound("No such agent.")
            done = _earlier(ref, agent, amount_cents, owner_account_id)
            if done is not None:
                return done
            if agent.disabled_at is not None:  # its balance would only go back on the next return pass
                raise AgentNotFundable(f"Agent {agent.id} was disabled; it takes no more money. Nothing moved.")
            if spend_key is not None and mode == "live":  # money leaving through a limited key
                spend.reserve(spend_key, micros, utcnow())
            try:
                txn = funding.transfer("agent_fund", from_account=owner_account_id,
                                       to_account=agent.account_id, mode=mode, micros=micros, ref=ref,
                                       meta={"agent_id": agent.id, "amount_cents": amount_cents})
            except ledger.InsufficientFunds:
                # A concurrent request with this key may have just spent the balance on it.
                done = _earlier(ref, agent, amount_cents, owner_account_id)
                if done is not None:
                    return done
                raise OwnerFundsShort(
                    f"Your balance ({_balance_cents(owner_account_id, mode)} cents) cannot cover "
                    f"{amount_cents} cents for agent {agent.id}; nothing moved.") from None
            from app.services.orgs import audit

            audit.record(owner_account_id, None, "agent.fund", agent.id,
                         after={"amount_micros": micros, "mode": mode, "transaction_id": str(txn)})
            return _result(agent, txn, amount_cents, owner_account_id, replayed=False)
    except IntegrityError:  # a concurrent request with this Idempotency-Key posted first
        with unit_of_work():
            agent = get_agent(agent_id)
            return _earlier(ref, agent, amount_cents, owner_account_id)


def _earlier(ref: str, agent, amount_cents: int, owner_account_id: str) -> dict | None:
    """The answer of the transfer already made with this ref (``replayed``), None when
    there is none; 409 when it moved another amount or went to another agent."""
    txn = db.session.execute(select(LedgerTransaction).where(LedgerTransaction.ref == ref)).scalar_one_or_none()
    if txn is None:
        return None
    if (txn.meta or {}) != {"agent_id": agent.id, "amount_cents": amount_cents}:
        raise IdempotencyKeyReused("This Idempotency-Key already funded a different agent or amount.")
    return _result(agent, txn.id, amount_cents, owner_account_id, replayed=True)


def _result(agent, txn_id: int, amount_cents: int, owner_account_id: str, *, replayed: bool) -> dict:
    return {"agent_id": agent.id, "amount_cents": amount_cents, "transaction_id": str(txn_id),
            "owner_balance_cents": _balance_cents(owner_account_id, agent.mode),
            "agent_balance_cents": _balance_cents(agent.account_id, agent.mode), "replayed": replayed}
