"""Invitations by e-mail (issue 37 item 3).

``invite`` (owners and admins; only an owner invites an owner) stores an ``org_invites``
row and a platform single-use token (purpose ``org_invite``, subject = the invite's id,
valid ``INVITE_TTL``) and e-mails the link ``{BASE_URL}/invites/{token}`` through the
outbox, in one unit of work; a new invite to the same address replaces the pending one
(audited ``invite.revoke`` with ``replaced_by``).
The link is used once, by one of two doors, each one unit of work that consumes the token
and makes the member together:

* ``accept_with_credential`` (``POST /api/orgs/invites/{token}/accept``): a person who
  already has an account accepts with their own credential; the invite's address must be
  theirs (403 ``invite_email_mismatch``, the token stays usable).
* ``accept_from_link`` (the page's button): the account of the invite's address, created
  if needed (``accounts.new_account``: the promotional grant stays one per mailbox), joins,
  and the page signs it in on the console (``console.open_session``), acting for the
  organisation joined.

A used, expired, revoked or unknown token is 404 ``invalid_token``; an address that is
already a member is 409 (at invite time and at acceptance)."""
from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from app.errors import Conflict, Forbidden, InvalidRequest, NotFound
from app.extensions import db
from app.ids import new_id
from app.models import Account
from app.models.base import utcnow
from app.models.orgs import ROLES, OrgInvite, OrgMember
from app.services.accounts import accounts
from app.services.accounts.signup import TokenInvalid
from app.services.orgs import roles
from app.services.orgs.audit import Actor, record
from app.services.orgs.orgs import add_member, membership, view
from app.services.platform import outbox, tokens
from app.services.platform.uow import unit_of_work

ORG_INVITE = "org_invite"
INVITE_TTL = timedelta(days=7)


class InviteInvalid(TokenInvalid):
    message = "This invitation link is unknown, expired, revoked or already used."


class InviteEmailMismatch(Forbidden):
    code = "invite_email_mismatch"
    description = "The invitation was sent to another address than the accepting account's."


class AlreadyMember(Conflict):
    code = "already_member"
    description = "The address (or account) is already a member of the organisation."


def _pending(org_id: str):
    return select(OrgInvite).where(OrgInvite.org_id == org_id, OrgInvite.accepted_at.is_(None),
                                   OrgInvite.revoked_at.is_(None), OrgInvite.expires_at > utcnow())


def _is_member(org_id: str, email: str) -> bool:
    return db.session.execute(select(OrgMember.account_id).join(Account, Account.id == OrgMember.account_id)
                              .where(OrgMember.org_id == org_id, Account.email == email)).first() is not None


def name_of_org(org_id: str) -> str | None:
    """The organisation's name, as the invitation e-mail and page show it."""
    return db.session.execute(select(Account.name).where(Account.id == org_id)).scalar()


def _org_label(org_id: str) -> str:
    """How a message names the organisation: its name and id (``"Acme" (acct_…)``)."""
    name = name_of_org(org_id)
    return f'"{name}" ({org_id})' if name else org_id


def inviter_email(row: OrgInvite) -> str | None:
    """The address of the person who sent the invitation, as the e-mail and page show it."""
    return db.session.execute(select(Account.email).where(Account.id == row.invited_by)).scalar()


def _revoke(row: OrgInvite, actor: Actor, after: dict | None = None) -> None:
    """(In the caller's unit of work.) The pending ``row`` stops working: revoked, its link's
    token revoked, audited ``invite.revoke`` (``after``: why, when not the plain revoke)."""
    row.revoked_at = utcnow()
    tokens.revoke(ORG_INVITE, row.id)
    record(row.org_id, actor, "invite.revoke", row.id, before={"email": row.email, "role": row.role}, after=after)


def invite(principal, actor: Actor, org_id: str, email: str, role: str) -> OrgInvite:
    """POST /api/orgs/{id}/invites."""
    email = accounts.normalize_email(email)
    if role not in ROLES:
        raise InvalidRequest(f"role: must be one of {', '.join(ROLES)}.")
    with unit_of_work():
        me = membership(principal, org_id, lock=True)
        roles.require(me.role, "manage_members", org_id)
        if role == roles.OWNER:
            roles.require(me.role, "manage_owners", org_id)
        if _is_member(org_id, email):
            raise AlreadyMember(f"{email} is already a member of {_org_label(org_id)}.")
        invite_id = new_id("inv")
        for old in db.session.execute(_pending(org_id).where(OrgInvite.email == email)).scalars():
            _revoke(old, actor, after={"replaced_by": invite_id})  # the newest invite replaces it
        now = utcnow()
        row = OrgInvite(id=invite_id, org_id=org_id, email=email, role=role, invited_by=actor.account_id,
                        created_at=now, expires_at=now + INVITE_TTL)
        db.session.add(row)
        token = tokens.issue(ORG_INVITE, row.id, INVITE_TTL, now=now)
        org_name, inviter = name_of_org(org_id), inviter_email(row)
        outbox.add_email(
            email, "You are invited to join an organisation",
            f"{inviter + ' invited you' if inviter else 'You are invited'} to join the organisation "
            f"\"{org_name}\" ({org_id}) as {role}: its members "
            f"share one balance for module calls and chat.\n\nOpen this link to accept (it works once, "
            f"for {INVITE_TTL.days} days):\n{tokens.link('/invites/' + token)}\n\n"
            "If you do not know this organisation, ignore this e-mail.",
            source="orgs:invite", capability=True)
        record(org_id, actor, "invite.create", row.id, after={"email": email, "role": role})
    return row


def list_invites(principal, org_id: str) -> list[OrgInvite]:
    """GET /api/orgs/{id}/invites: the pending invitations (owners and admins)."""
    me = membership(principal, org_id)
    roles.require(me.role, "manage_members", org_id)
    return list(db.session.execute(_pending(org_id).order_by(OrgInvite.created_at, OrgInvite.id)).scalars())


def revoke(principal, actor: Actor, org_id: str, invite_id: str) -> OrgInvite:
    """DELETE /api/orgs/{id}/invites/{invite_id}: the link stops working (idempotent)."""
    with unit_of_work():
        me = membership(principal, org_id)
        roles.require(me.role, "manage_members", org_id)
        row = db.session.get(OrgInvite, invite_id) if isinstance(invite_id, str) and len(invite_id) <= 32 else None
        if row is None or row.org_id != org_id:
            raise NotFound("No such invitation.")
        if row.revoked_at is None and row.accepted_at is None:
            _revoke(row, actor)
    return row


def revoke_sent_by(org_id: str, member_id: str, role: str | None, actor: Actor) -> list[str]:
    """(In the caller's unit of work.) An invitation carries its sender's authority: revoke
    the pending invitations ``member_id`` sent that ``role`` could not send — all of them
    when the member is removed or leaves (``role`` None, audited with reason
    ``inviter_removed``) or gets a role that does not manage members, the owner
    invitations when an owner becomes an admin (``inviter_role_changed``). Returns their
    ids."""
    if role is not None and role in roles.ACTIONS["manage_owners"]:
        return []
    rows = _pending(org_id).where(OrgInvite.invited_by == member_id)
    if role is not None and role in roles.ACTIONS["manage_members"]:
        rows = rows.where(OrgInvite.role.in_(roles.ACTIONS["manage_owners"]))
    revoked = []
    for row in db.session.execute(rows.order_by(OrgInvite.created_at, OrgInvite.id)).scalars():
        _revoke(row, actor, after={"reason": "inviter_removed" if role is None else "inviter_role_changed"})
        revoked.append(row.id)
    return revoked


def preview(token: str | None) -> OrgInvite | None:
    """The pending invitation of a usable link (read-only, for the page), else None."""
    found = tokens.lookup(ORG_INVITE, token)
    if not tokens.is_usable(found):
        return None
    row = db.session.get(OrgInvite, found.subject)
    return row if row is not None and row.revoked_at is None and row.accepted_at is None else None


def _redeem(token: str | None) -> OrgInvite:
    """Consume the link (in the caller's unit of work) and return its pending invitation."""
    used = tokens.consume(ORG_INVITE, token)
    row = db.session.get(OrgInvite, used.subject) if used is not None else None
    if row is None or row.revoked_at is not None or row.accepted_at is not None:
        raise InviteInvalid()
    return row


def _join(row: OrgInvite, account_id: str, actor: Actor) -> None:
    if db.session.get(OrgMember, (row.org_id, account_id)) is not None:
        raise AlreadyMember(f"You are already a member of {_org_label(row.org_id)}.")
    row.accepted_at, row.accepted_by = utcnow(), account_id
    add_member(row.org_id, account_id, row.role, actor, via=row.id)


def accept_with_credential(principal, actor: Actor, token: str | None) -> dict:
    """POST /api/orgs/invites/{token}/accept with the person's own credential."""
    person = actor.account_id
    with unit_of_work():
        pending = preview(token)
        if pending is None:
            raise InviteInvalid()
        email = db.session.execute(select(Account.email).where(Account.id == person)).scalar()
        if email != pending.email:
            raise InviteEmailMismatch("This invitation was sent to another address than this account's.")
        row = _redeem(token)
        _join(row, person, actor)
        org = db.session.get(Account, row.org_id)
    return view(org, row.role, principal.mode)


def accept_from_link(token: str | None, *, request_id: str | None = None,
                     ip: str | None = None) -> tuple[str, str, str]:
    """The page's button: the invite's address gets an account if it has none, joins, and a
    console session is opened for it; returns (account id, organisation id, console session
    token): the page opens the console acting for that organisation."""
    from app.services.accounts import console

    with unit_of_work():
        row = _redeem(token)
        acct = accounts.find_by_email(row.email) or accounts.new_account(row.email)
        _join(row, acct.id, Actor(acct.id, None, request_id, ip))
        session = console.open_session(acct.id)
    return acct.id, row.org_id, session
