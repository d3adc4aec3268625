"""Disabling an agent: its owner takes back its identity and its money (docs/agents.md,
"Disabling an agent"; docs/teams.md, "Agents of an organisation").

An agent's private key lives with whoever set it up. When that person must lose it (a
member leaves the organisation, a key leaked, the agent is retired), its owner disables
it:

1. ``agents.disabled_at`` is set (once; a repeat answers ``replayed`` and moves nothing);
2. in the same unit of work, every live session is revoked, and dropped from every
   worker's credential cache after the commit (the revocation channel, like a revoked
   key), and the events waiting for its webhook are cancelled (it receives no more,
   ``identity.send_event``); sign-in, by ed25519 and by SIWX, answers 401 ``agent_disabled`` from then on,
   and registering the pubkey again is 409;
3. right after that commit, in a unit of work of its own, the agent's whole balance (of
   its mode) moves back to the owner: one ``agent_return`` posting (agent ``acct:`` −B,
   owner ``acct:`` +B), both account rows locked first, in id order, so a concurrent call
   or funding waits instead of racing it. (Not in step 2's unit: that one holds the
   agent's row — and a member's removal the organisation's — so account locks there could
   run against the engine's id order and deadlock with a funding.)

A payout destination the agent's credential set is removed first (``_drop_destination``:
what is owed to it moves to the agent's balance and so back too), and a disabled agent's
settlement goes to its balance, never to a destination (``money.settlement``): its
earnings are its owner's, not paid out to whoever held its key.

Money that reaches the agent's account later — a refund of a call that was in flight, a
chat hold released, a credit to its pay-to address — and a balance a crash left between
steps 2 and 3 go back to the owner on the ``agent-balances-return`` job's next pass
(``return_balances``). Modules the agent owns
stay in the catalog; their earnings settle as before.

``DELETE /api/agent/{id}`` calls ``disable`` for the owner account (a person, or an
organisation: owners and admins disable any of its agents, developers those they
registered); ``orgs.remove_member`` calls it for every agent the removed member
registered for the organisation.
"""
from __future__ import annotations

from sqlalchemy import and_, case, exists, or_, select, update

from app import auth
from app.errors import NotFound
from app.extensions import db
from app.models import Account, Agent, AgentSession, PayoutDestination
from app.models.base import utcnow
from app.services.money import funding, ledger
from app.services.platform import outbox
from app.services.platform.uow import after_commit, unit_of_work

RETURN_KIND = "agent_return"


def disable(owner_account_id: str, agent_id: str, *, mode: str, registered_by: str | None = None,
            actor=None) -> dict:
    """Disable ``agent_id`` of ``owner_account_id`` in ``mode`` (404 for another account's
    agent, or one of the other mode; ``registered_by``: also 404 unless that person
    registered it — a developer of an organisation disables only their own agents)."""
    with unit_of_work():
        agent = db.session.get(Agent, agent_id, with_for_update=True) \
            if isinstance(agent_id, str) and len(agent_id) <= 32 else None
        if agent is None or agent.owner_account_id != owner_account_id or agent.mode != mode or \
                (registered_by is not None and agent.registered_by != registered_by):
            raise NotFound("No such agent.")
        replayed = agent.disabled_at is not None
        revoked = 0 if replayed else _disable(agent, actor)
        agent_id, disabled_at = agent.id, agent.disabled_at
    returned = 0 if replayed else _return_one(agent_id)
    with unit_of_work():
        return {"agent_id": agent_id, "disabled": True, "disabled_at": disabled_at,
                "revoked_sessions": revoked, "returned_micros": returned,
                "owner_balance_cents": ledger.micros_to_cents(ledger.cached_balance(owner_account_id, mode)),
                "replayed": replayed}


def disable_registered_by(org_id: str, member_id: str, actor=None) -> list[str]:
    """Disable every agent ``member_id`` registered for ``org_id``, in the caller's unit of
    work (the member's removal); their balances move back right after its commit. Returns
    their ids."""
    agents = list(db.session.execute(select(Agent).where(
        Agent.owner_account_id == org_id, Agent.registered_by == member_id, Agent.disabled_at.is_(None))
        .order_by(Agent.id).with_for_update()).scalars())
    for agent in agents:
        _disable(agent, actor)
        after_commit(_return_one, agent.id)
    return [agent.id for agent in agents]


def _disable(agent: Agent, actor) -> int:
    """Steps 1–2 on a locked, enabled agent in the caller's unit of work; the sessions
    revoked. Step 3 (the money) is a unit of work of its own after the commit
    (``_return_one``): this one holds the agent's row, and the removal of a member the
    organisation's row too, so taking account rows here could run against the engine's
    account order (a funding racing it would deadlock); a crash between the two leaves the
    balance to the ``agent-balances-return`` job."""
    agent.disabled_at = utcnow()
    hashes = list(db.session.execute(
        update(AgentSession).where(AgentSession.agent_id == agent.id, AgentSession.revoked_at.is_(None),
                                   AgentSession.expires_at > agent.disabled_at)
        .values(revoked_at=agent.disabled_at).returning(AgentSession.token_hash)
        .execution_options(synchronize_session=False)).scalars())
    from app.services.orgs import audit

    # its webhook receives nothing more: what waits for it, or failed, is cancelled
    # (docs/decisions.md, "A disabled agent's webhook"; identity.send_event queues no more)
    outbox.cancel(agent.account_id, "webhook", "the agent was disabled: its webhook receives no more events")
    audit.record(agent.owner_account_id, actor, "agent.disable", agent.id,
                 after={"revoked_sessions": len(hashes), "mode": agent.mode})
    after_commit(auth.broadcast_revocation, *hashes)
    return len(hashes)


def return_balances() -> int:
    """The ``agent-balances-return`` job: what reached a disabled agent's account since it
    was disabled goes back to its owner, one unit of work per agent (and a payout
    destination it still has is removed first). Returns how many agents' balances moved."""
    balance = case((Agent.mode == "test", Account.test_balance_micros), else_=Account.balance_micros)
    has_destination = exists().where(PayoutDestination.account_id == Agent.account_id)
    with unit_of_work():
        due = list(db.session.execute(select(Agent.id).join(Account, Account.id == Agent.account_id).where(
            and_(Agent.disabled_at.is_not(None), or_(balance > 0, has_destination)))
            .order_by(Agent.id)).scalars())
    return sum(1 for agent_id in due if _return_one(agent_id))


def _drop_destination(account_id: str) -> None:
    """Remove the payout destination the agent's credential may have set (what is owed to
    it moves to the agent's balance, an open payout is canceled): its earnings are its
    owner's now. One payout being sent keeps it until the job's next pass."""
    from app.services.billing import payouts

    try:
        payouts.remove_destination(account_id)
    except (NotFound, payouts.PayoutInFlight):
        pass


def _return_one(agent_id: str) -> int:
    """One disabled agent's balance back to its owner, in a unit of work of its own
    (audited ``agent.return``), after its payout destination is removed; the micros moved."""
    with unit_of_work():
        account_id = db.session.get(Agent, agent_id).account_id
    _drop_destination(account_id)
    with unit_of_work():
        agent = db.session.get(Agent, agent_id)
        micros = _return_balance(agent)
        if micros:
            from app.services.orgs import audit

            audit.record(agent.owner_account_id, None, "agent.return", agent.id,
                         after={"returned_micros": micros, "mode": agent.mode})
    return micros


def _return_balance(agent: Agent) -> int:
    """Move the agent's whole balance of its mode to its owner (both rows locked first, in
    id order, so nothing can spend it between the read and the posting); the micros moved."""
    held = {}
    for account_id in sorted((agent.account_id, agent.owner_account_id)):
        held[account_id] = ledger.cached_balance(account_id, agent.mode, lock=True)
    micros = held[agent.account_id]
    if micros <= 0:
        return 0
    funding.transfer(RETURN_KIND, from_account=agent.account_id, to_account=agent.owner_account_id,
                     mode=agent.mode, micros=micros, ref=None, meta={"agent_id": agent.id})
    return micros
