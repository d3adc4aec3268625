"""Organisations: creation, membership and roles, and the helpers other areas
call to act in an organisation (who pays, who owns a key, which keys a member sees).

Entry points (each one unit of work): ``create_org``, ``list_orgs``, ``list_members``,
``update_member``, ``remove_member``. Every change is written to the audit log in its
unit of work (``audit.record``). Changes of one organisation's membership run under a
lock of the organisation's account row, so two concurrent demotions or removals cannot
both pass the "last owner" check."""
from __future__ import annotations

from sqlalchemy import func, select, update

from app import auth
from app.errors import Conflict, InvalidRequest, NotFound
from app.extensions import db
from app.models import Account, ApiKey
from app.models.base import utcnow
from app.models.orgs import ROLES, OrgMember
from app.services.money import ledger, spend
from app.services.orgs import roles
from app.services.orgs.audit import Actor, record
from app.services.platform.uow import after_commit, unit_of_work



MAX_ORGS_PER_PERSON = 50
MAX_BUDGET_CENTS = 100_000_000  # 1,000,000 USD a month, as the keys' spend limits


class _Unset:
    """A keyword argument that was not given (``update_member``: leave the field alone)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


class OrgLimitReached(Conflict):
    code = "org_limit_reached"
    description = (f"The person already belongs to {MAX_ORGS_PER_PERSON} organisations; leave one before "
                   "creating or joining another.")


def _check_org_limit(account_id: str) -> None:
    """409 ``org_limit_reached`` when ``account_id`` already belongs to ``MAX_ORGS_PER_PERSON``
    organisations (created or joined), counted under the person's row lock so concurrent
    creations and acceptances are counted one after the other (the caller's unit of work)."""
    db.session.execute(select(Account.id).where(Account.id == account_id).with_for_update())
    count = db.session.execute(select(func.count()).select_from(OrgMember)
                               .where(OrgMember.account_id == account_id)).scalar_one()
    if count >= MAX_ORGS_PER_PERSON:
        raise OrgLimitReached(f"You belong to {count} organisations (the maximum is {MAX_ORGS_PER_PERSON}); "
                              "leave one before creating or joining another.")


class LastOwner(Conflict):
    code = "last_owner"
    description = ("An organisation keeps at least one owner: its last owner cannot leave, be removed or "
                   "be given another role (make another member owner first).")


def person_of(principal) -> str:
    """The person behind a credential: the member who owns an organisation key, else the
    credential's own account (``auth.person_of``)."""
    from app.auth import person_of as of

    return of(principal)


def org_role_of(principal) -> str | None:
    """The member's role carried by an organisation key's principal (None: not one)."""
    return principal.extra.get("org_role")


def member_role(org_id: str, account_id: str) -> str | None:
    """The role of ``account_id`` in ``org_id`` (None: not a member)."""
    return db.session.execute(select(OrgMember.role).where(
        OrgMember.org_id == org_id, OrgMember.account_id == account_id)).scalar()


# the members of an organisation told about its money (auto top-up declines, 3-D Secure,
# caps): the roles that can change its billing
BILLING_CONTACT_ROLES = ("owner", "billing")


def billing_contacts(account_id: str) -> list[str]:
    """The e-mail addresses that hear about an account's billing: the account's own; for an
    agent identity without one, its owner account's; for an organisation (which has no
    mailbox), its owners' and billing members' (sorted). Empty when nobody can be told."""
    acct = db.session.get(Account, account_id)
    if acct is None:
        return []
    if acct.kind == "org":
        return list(db.session.execute(
            select(Account.email).join(OrgMember, OrgMember.account_id == Account.id)
            .where(OrgMember.org_id == account_id, OrgMember.role.in_(BILLING_CONTACT_ROLES),
                   Account.email.is_not(None))
            .order_by(Account.email)).scalars())
    if not acct.email and acct.owner_account_id:
        return billing_contacts(acct.owner_account_id)
    return [acct.email] if acct.email else []


def membership(principal, org_id: str, *, lock: bool = False) -> OrgMember:
    """The caller's membership of ``org_id`` (read now, not from the credential cache). An
    organisation key acts in its own organisation only; an organisation the caller is not
    a member of is 404 like one that does not exist."""
    if not isinstance(org_id, str) or len(org_id) > 32 or \
            (org_role_of(principal) is not None and org_id != principal.account_id):
        raise NotFound("No such organisation.")
    if lock:
        db.session.execute(select(Account.id).where(Account.id == org_id).with_for_update())
    row = db.session.get(OrgMember, (org_id, person_of(principal)))
    if row is None:
        raise NotFound("No such organisation.")
    return row


def view(org: Account, role: str, mode: str) -> dict:
    return {"id": org.id, "name": org.name, "plan": org.plan, "role": role, "created_at": org.created_at,
            "balance_micros": org.test_balance_micros if mode == "test" else org.balance_micros}


def create_org(principal, actor: Actor, name: str) -> dict:
    """POST /api/orgs: a new organisation (an account of kind ``org``: no promotional
    grant, the default plan, empty balances) whose only member is the caller, as owner."""
    from app.services.accounts.accounts import new_account

    name = (name or "").strip()
    if not name:
        raise InvalidRequest("name: must not be empty.")
    with unit_of_work():
        _check_org_limit(actor.account_id)
        org = new_account(None, kind="org", promo=False)
        org.name = name
        db.session.add(OrgMember(org_id=org.id, account_id=actor.account_id, role=roles.OWNER,
                                 created_at=utcnow()))
        record(org.id, actor, "org.create", org.id, after={"name": name, "plan": org.plan})
    return view(org, roles.OWNER, principal.mode)


def list_orgs(principal) -> list[dict]:
    """GET /api/orgs: the organisations the caller belongs to (an organisation key: its
    own), oldest membership first."""
    query = select(Account, OrgMember.role).join(OrgMember, OrgMember.org_id == Account.id) \
        .where(OrgMember.account_id == person_of(principal))
    if org_role_of(principal) is not None:
        query = query.where(Account.id == principal.account_id)
    rows = db.session.execute(query.order_by(OrgMember.created_at, Account.id)).all()
    return [view(org, role, principal.mode) for org, role in rows]


def get_org(principal, org_id: str) -> dict:
    """GET /api/orgs/{id}: one of the caller's organisations."""
    me = membership(principal, org_id)
    return view(db.session.get(Account, org_id), me.role, principal.mode)


def _member_view(row: OrgMember, email: str | None, spent_micros: int) -> dict:
    budget = row.monthly_budget_micros
    return {"member_id": row.account_id, "email": email, "role": row.role, "created_at": row.created_at,
            "monthly_budget_cents": None if budget is None else ledger.micros_to_cents(budget),
            "spent_this_month_cents": ledger.micros_to_cents(spent_micros)}


def _member_views(org_id: str, rows: list[tuple[OrgMember, str | None]]) -> list[dict]:
    spent = spend.member_spent(org_id, [row.account_id for row, _ in rows], utcnow())
    return [_member_view(row, email, spent.get(row.account_id, 0)) for row, email in rows]


def list_members(principal, org_id: str) -> list[dict]:
    """GET /api/orgs/{id}/members: every member (any role may read them), with their
    monthly budget and what their organisation keys spent this UTC month."""
    membership(principal, org_id)
    rows = db.session.execute(select(OrgMember, Account.email).join(Account, Account.id == OrgMember.account_id)
                              .where(OrgMember.org_id == org_id)
                              .order_by(OrgMember.created_at, OrgMember.account_id)).all()
    return _member_views(org_id, [tuple(r) for r in rows])


def _target(org_id: str, member_id: str) -> OrgMember:
    row = db.session.get(OrgMember, (org_id, member_id)) if isinstance(member_id, str) and len(member_id) <= 32 \
        else None
    if row is None:
        raise NotFound("No such member in this organisation.")
    return row


def _check_owners_left(org_id: str, target: OrgMember, what: str) -> None:
    """409 ``last_owner`` when ``target`` is the organisation's only owner (the caller
    holds the organisation's row lock)."""
    if target.role != roles.OWNER:
        return
    owners = db.session.execute(select(func.count()).select_from(OrgMember).where(
        OrgMember.org_id == org_id, OrgMember.role == roles.OWNER)).scalar_one()
    if owners <= 1:
        raise LastOwner(f"{target.account_id} is the last owner of {org_id} and cannot {what}; "
                        "make another member owner first.")


def _member_key_hashes(org_id: str, member_id: str) -> list[str]:
    return list(db.session.execute(select(ApiKey.key_hash).where(
        ApiKey.account_id == org_id, ApiKey.member_account_id == member_id)).scalars())


def _budget_micros(cents) -> int | None:
    """``monthly_budget_cents`` as micros (None: no budget); 400 unless null or an integer
    from 0 to ``MAX_BUDGET_CENTS``."""
    if cents is None:
        return None
    if isinstance(cents, bool) or not isinstance(cents, int) or not 0 <= cents <= MAX_BUDGET_CENTS:
        raise InvalidRequest(f"monthly_budget_cents: must be null or an integer from 0 to {MAX_BUDGET_CENTS}.")
    return ledger.cents_to_micros(cents)


def update_member(principal, actor: Actor, org_id: str, member_id: str, role: str | None = None, *,
                  monthly_budget_cents=UNSET) -> dict:
    """PATCH /api/orgs/{id}/members/{member_id}: a new ``role`` and/or
    ``monthly_budget_cents`` (null: no budget; ``UNSET``: unchanged). Owners and admins;
    only an owner makes, changes or demotes an owner, or sets an owner's budget or their
    own (an admin cannot lift the budget set on them); the last
    owner keeps the role (409 ``last_owner``). The new role applies to the member's
    organisation keys on every worker within the credential cache's TTL (the keys are
    dropped from every cache, like a revocation). A new role that may not register agents
    (billing, viewer) disables the agents the member registered for the organisation, as a
    removal does (``disabled_agents``; balances back to the organisation right after the
    commit). The budget applies from the next charge:
    the money engine reads it in the charge's own statement (``gw_spend_reserve``), so a
    budget lowered below what the member spent this month refuses their next charge. One
    audit entry ``member.update`` with the fields that changed, before and after."""
    if role is None and monthly_budget_cents is UNSET:
        raise InvalidRequest("Give `role` and/or `monthly_budget_cents`.")
    if role is not None and role not in ROLES:
        raise InvalidRequest(f"role: must be one of {', '.join(ROLES)}.")
    budget = UNSET if monthly_budget_cents is UNSET else _budget_micros(monthly_budget_cents)
    with unit_of_work():
        me = membership(principal, org_id, lock=True)
        roles.require(me.role, "manage_members", org_id)
        target = _target(org_id, member_id)
        if roles.OWNER in (target.role, role):
            roles.require(me.role, "manage_owners", org_id)
        if budget is not UNSET and budget != target.monthly_budget_micros and target.account_id == me.account_id:
            # a budget is a limit set on a member: an admin does not lift their own
            roles.require(me.role, "manage_owners", org_id, "Changing your own monthly budget")
        before, after = {}, {}
        disabled: list[str] = []
        revoked_invites: list[str] = []
        if role is not None and role != target.role:
            _check_owners_left(org_id, target, "be given another role")
            before["role"], after["role"] = target.role, role
            from app.services.orgs import invites

            revoked_invites = invites.revoke_sent_by(org_id, member_id, role, actor)
            if target.role in roles.SCOPE_ROLES["agent:write"] and role not in roles.SCOPE_ROLES["agent:write"]:
                # a role that may not register agents keeps none that spends the organisation's money
                from app.services.agents import disable

                disabled = disable.disable_registered_by(org_id, member_id, actor)
                if disabled:
                    after["disabled_agents"] = disabled
            target.role = role
            after_commit(auth.broadcast_revocation, *_member_key_hashes(org_id, member_id))
        if budget is not UNSET and budget != target.monthly_budget_micros:
            before["monthly_budget_cents"] = _member_view(target, None, 0)["monthly_budget_cents"]
            target.monthly_budget_micros = budget
            after["monthly_budget_cents"] = monthly_budget_cents
        if after:
            record(org_id, actor, "member.update", member_id, before=before, after=after)
        email = db.session.execute(select(Account.email).where(Account.id == member_id)).scalar()
        return {**_member_views(org_id, [(target, email)])[0], "disabled_agents": disabled,
                "revoked_invites": revoked_invites}


def remove_member(principal, actor: Actor, org_id: str, member_id: str) -> dict:
    """DELETE /api/orgs/{id}/members/{member_id}: a member may leave; owners and admins
    remove others (only an owner removes an owner); the last owner cannot leave (409
    ``last_owner``). In the same unit of work the member's organisation keys are revoked
    and the agents they registered for the organisation disabled (``agents.disable``:
    sessions revoked), both dropped from every worker's cache after the commit; the agents'
    balances return to the organisation right after it, each in a unit of work of its own."""
    with unit_of_work():
        me = membership(principal, org_id, lock=True)
        target = _target(org_id, member_id)
        if target.account_id != me.account_id:
            roles.require(me.role, "manage_members", org_id)
            if target.role == roles.OWNER:
                roles.require(me.role, "manage_owners", org_id)
        _check_owners_left(org_id, target, "leave or be removed")
        revoked = list(db.session.execute(
            update(ApiKey).where(ApiKey.account_id == org_id, ApiKey.member_account_id == member_id,
                                 ApiKey.revoked_at.is_(None))
            .values(revoked_at=utcnow()).returning(ApiKey.id).execution_options(synchronize_session=False)
        ).scalars())
        hashes = _member_key_hashes(org_id, member_id)
        from app.services.agents import disable

        agents = disable.disable_registered_by(org_id, member_id, actor)
        from app.services.orgs import invites

        revoked_invites = invites.revoke_sent_by(org_id, member_id, None, actor)
        record(org_id, actor, "member.remove", member_id,
               before={"role": target.role},
               after={"revoked_keys": sorted(revoked), "disabled_agents": agents})
        db.session.delete(target)
        after_commit(auth.broadcast_revocation, *hashes)
    return {"removed": True, "member_id": member_id, "revoked_keys": sorted(revoked), "disabled_agents": agents,
            "revoked_invites": revoked_invites}


def add_member(org_id: str, account_id: str, role: str, actor: Actor, *, via: str | None = None) -> OrgMember:
    """Make ``account_id`` a member with ``role`` in the caller's unit of work (an accepted
    invitation); 409 when it already is one, or already belongs to ``MAX_ORGS_PER_PERSON``
    organisations (``org_limit_reached``: the unit of work rolls back, the link stays usable)."""
    if db.session.get(OrgMember, (org_id, account_id)) is not None:
        raise Conflict(f"{account_id} is already a member of {org_id}.")
    _check_org_limit(account_id)
    row = OrgMember(org_id=org_id, account_id=account_id, role=role, created_at=utcnow())
    db.session.add(row)
    record(org_id, actor, "member.add", account_id, after={"role": role, "via": via})
    return row


# --- acting in an organisation (called by other areas' routes) ---------------------------

def payer(principal, org_id: str | None, scopes: tuple[str, ...]) -> str:
    """The account a request with optional ``org_id`` acts on: the credential's own
    account, or the organisation ``org_id`` when the caller is a member whose role allows
    ``scopes`` (403 ``org_role_required``; not a member: 404)."""
    if org_id is None:
        return principal.account_id
    me = membership(principal, org_id)
    roles.require_scopes(me.role, scopes, org_id)
    return org_id


def key_owner(principal, org_id: str | None) -> tuple[str, str | None]:
    """(account that pays, member who owns) for a key created by ``principal`` with optional
    ``org_id``: an organisation key's keys stay in its organisation, owned by its member."""
    if org_id is None:
        return principal.account_id, principal.extra.get("member")
    payer(principal, org_id, ("keys:write",))
    return org_id, person_of(principal)


def own_items_only(principal, account_id: str) -> str | None:
    """The person whose own keys and agents only the caller may change in ``account_id``:
    None when it may change all of them (its own account; owners and admins of an
    organisation), else the member itself (billing, developers, viewers)."""
    person = person_of(principal)
    if account_id == person:
        return None
    role = org_role_of(principal) if account_id == principal.account_id else None
    role = role or membership(principal, account_id).role  # an organisation key's role: no read
    return None if role in roles.ACTIONS["manage_keys"] else person


def keys_of(principal, org_id: str | None, scope: str, key_id: str | None = None) -> tuple[str, str | None]:
    """(account, member) for a keys route: the account whose keys it acts on — the
    credential's own, or the organisation ``org_id`` when the caller's role there allows
    ``scope`` (``payer``) — and the member whose keys alone the caller sees and changes
    there (None: all; ``own_items_only``). With ``key_id``: 404 for a key outside that."""
    account = payer(principal, org_id, (scope,))
    only = own_items_only(principal, account)
    if key_id is not None and only is not None:
        owner = db.session.execute(select(ApiKey.member_account_id).where(
            ApiKey.id == key_id, ApiKey.account_id == account)).scalar() if len(key_id) <= 32 else None
        if owner != only:
            raise NotFound("No such key.")
    return account, only


def usage_scope(principal, org_id: str | None, member_id: str | None, *, per_call: bool = False,
                key_id: str | None = None) -> tuple[str, str | None]:
    """(account, member) whose usage a usage route reads (docs/teams.md, "Usage").

    Without an organisation (no ``org_id``, a personal credential): the credential's own
    account. In an organisation (``org_id``, or an organisation key's own): every member
    reads the organisation's totals; ``member_id`` narrows them to the calls of one
    member's keys — the caller's own id for any member, another member's (or a former
    member's) for owners, admins and billing (``read_member_usage``). The per-call export
    (``per_call``) lists who called what, so for developers and viewers it is their own
    calls only: they pass their own ``member_id`` (403 ``org_role_required`` otherwise).
    Without an organisation ``member_id`` may only name the account itself (else 404, like
    an id that never was a member: a schema-valid request is not a 400). A ``key_id``
    filter is one more way to name a member's calls: for roles that do not read other
    members' usage it must be one of their own keys (404 otherwise, as ``keys_of``)."""
    if org_id is None and org_role_of(principal) is not None:
        org_id = principal.account_id
    if org_id is None:  # a personal account: its only member is itself
        if member_id is not None and member_id != principal.account_id:
            raise NotFound("No such member: member_id narrows an organisation's usage; pass org_id (or use "
                           "an organisation key).")
        return principal.account_id, None
    if org_role_of(principal) is not None and org_id == principal.account_id:
        role = org_role_of(principal)  # the key's role, checked with the credential (no read)
    else:
        role = membership(principal, org_id).role
        roles.require_scopes(role, ("call:read",), org_id)
    if key_id is not None and role not in roles.ACTIONS["read_member_usage"]:
        owner = db.session.execute(select(ApiKey.member_account_id).where(
            ApiKey.id == key_id, ApiKey.account_id == org_id)).scalar() if len(key_id) <= 32 else None
        if owner != person_of(principal):
            raise NotFound("No such key.")
    if member_id is None:
        if per_call:
            roles.require(role, "read_member_usage", org_id,
                          "The export of every member's calls (export your own with member_id=<your id>)")
        return org_id, None
    if member_id != person_of(principal):
        roles.require(role, "read_member_usage", org_id, "Another member's usage")
        if member_role(org_id, member_id) is None and db.session.execute(
                select(ApiKey.id).where(ApiKey.account_id == org_id, ApiKey.member_account_id == member_id)
                .limit(1)).first() is None:
            raise NotFound("No such member in this organisation.")
    return org_id, member_id
