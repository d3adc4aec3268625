"""Disabling an agent: its owner takes back its identity and its money (docs/agents.md,
"Disabling an agent"; docs/teams.md, "Agents of an organisation").

An agent's private key lives with whoever set it up. When that person must lose it (a
member leaves the organisation, a key leaked, the agent is retired), its owner disables
it, in one unit of work:

1. ``agents.disabled_at`` is set (once; a repeat answers the first result again, with
   nothing more moved);
2. every live session is revoked, and dropped from every worker's credential cache after
   the commit (the revocation channel, like a revoked key); sign-in, by ed25519 and by
   SIWX, answers 401 ``agent_disabled`` from then on, and registering the pubkey again is
   409;
3. the agent's whole balance (of its mode) moves back to the owner: one ``agent_return``
   posting (agent ``acct:`` −B, owner ``acct:`` +B), both account rows locked first, in
   id order, so a concurrent call or funding waits instead of racing it.

Money that reaches the agent's account later — a refund of a call that was in flight, a
chat hold released, a credit to its pay-to address — goes back to the owner too, on the
``agent-balances-return`` job's next pass (``return_balances``). Modules the agent owns
stay in the catalog; their earnings settle as before.

``DELETE /api/agent/{id}`` calls ``disable`` for the owner account (a person, or an
organisation: owners and admins disable any of its agents, developers those they
registered); ``orgs.remove_member`` calls it for every agent the removed member
registered for the organisation.
"""
from __future__ import annotations

from sqlalchemy import and_, case, select, update

from app.errors import NotFound
from app.extensions import db
from app.models import Account, Agent, AgentSession
from app.models.base import utcnow
from app.services.money import funding, ledger
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
        if agent.disabled_at is not None:
            return _result(agent, revoked_sessions=0, returned_micros=0, replayed=True)
        revoked, returned = _disable(agent, actor)
        return _result(agent, revoked_sessions=revoked, returned_micros=returned, replayed=False)


def disable_registered_by(org_id: str, member_id: str, actor=None) -> list[str]:
    """Disable every agent ``member_id`` registered for ``org_id``, in the caller's unit of
    work (the member's removal). Returns their ids."""
    agents = list(db.session.execute(select(Agent).where(
        Agent.owner_account_id == org_id, Agent.registered_by == member_id, Agent.disabled_at.is_(None))
        .order_by(Agent.id).with_for_update()).scalars())
    for agent in agents:
        # The removal holds the organisation's row (taken before the agents'): the balances
        # move right after its commit, each in its own unit of work, so no lock is taken out
        # of the engine's account order (a funding racing the removal cannot deadlock).
        _disable(agent, actor, return_now=False)
        after_commit(_return_one, agent.id)
    return [agent.id for agent in agents]


def _disable(agent: Agent, actor, *, return_now: bool = True) -> tuple[int, int]:
    """Steps 1–3 on a locked, enabled agent in the caller's unit of work: (sessions
    revoked, micros returned); ``return_now`` False: step 3 is the caller's."""
    agent.disabled_at = utcnow()
    hashes = list(db.session.execute(
        update(AgentSession).where(AgentSession.agent_id == agent.id, AgentSession.revoked_at.is_(None),
                                   AgentSession.expires_at > agent.disabled_at)
        .values(revoked_at=agent.disabled_at).returning(AgentSession.token_hash)
        .execution_options(synchronize_session=False)).scalars())
    returned = _return_balance(agent) if return_now else 0
    from app.services.orgs import audit

    audit.record(agent.owner_account_id, actor, "agent.disable", agent.id,
                 after={"revoked_sessions": len(hashes), "returned_micros": returned, "mode": agent.mode})
    after_commit(_drop_cached, hashes)
    return len(hashes), returned


def return_balances() -> int:
    """The ``agent-balances-return`` job: what reached a disabled agent's account since it
    was disabled goes back to its owner, one unit of work per agent. Returns how many
    agents' balances moved."""
    balance = case((Agent.mode == "test", Account.test_balance_micros), else_=Account.balance_micros)
    with unit_of_work():
        due = list(db.session.execute(select(Agent.id).join(Account, Account.id == Agent.account_id).where(
            and_(Agent.disabled_at.is_not(None), balance > 0)).order_by(Agent.id)).scalars())
    return sum(_return_one(agent_id) for agent_id in due)


def _return_one(agent_id: str) -> bool:
    """One disabled agent's balance back to its owner, in a unit of work of its own
    (audited ``agent.return``); whether anything moved."""
    with unit_of_work():
        agent = db.session.get(Agent, agent_id)
        micros = _return_balance(agent)
        if micros:
            from app.services.orgs import audit

            audit.record(agent.owner_account_id, None, "agent.return", agent.id,
                         after={"returned_micros": micros, "mode": agent.mode})
    return bool(micros)


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


def _result(agent: Agent, *, revoked_sessions: int, returned_micros: int, replayed: bool) -> dict:
    return {"agent_id": agent.id, "disabled": True, "disabled_at": agent.disabled_at,
            "revoked_sessions": revoked_sessions, "returned_micros": returned_micros,
            "owner_balance_cents": ledger.micros_to_cents(ledger.cached_balance(agent.owner_account_id, agent.mode)),
            "replayed": replayed}


def _drop_cached(hashes: list[str]) -> None:
    from app import auth

    for token_hash in hashes:
        auth.broadcast_revocation(token_hash)
