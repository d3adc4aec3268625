"""Organisation endpoints: organisations, members and roles (docs/teams.md)."""
from flask import Response, g, request, stream_with_context

from app.auth import principal
from app.blueprints.orgs.schemas import (AuditPageSchema, AuditQuerySchema, InviteCreateSchema, InviteListSchema, InviteSchema, MemberListSchema,
                                         MemberRemovedSchema, MemberUpdatedSchema, MemberUpdateSchema,
                                         OrgCreateSchema,
                                         OrgListSchema, OrgSchema)
from app.blueprints.routing import endpoint, link
from app.extensions import Blueprint
from app.services.orgs import audit, invites, orgs
from app.services.orgs.audit import Actor

blp = Blueprint("orgs", __name__, url_prefix="/api/orgs",
                description="Organisations: one balance shared by members with roles (docs/teams.md).")

_ROLE_403 = "`org_role_required`: the caller's role does not allow it (the message names the roles that do)."
_NOT_MEMBER = "No such organisation (or the caller is not a member), or no such member."


def current_actor() -> Actor:
    """The person behind this request's credential, for the audit log."""
    return audit.current() or audit.actor_of(principal(), g.get("request_id"), request.remote_addr)


_NEW_ORG = "$response.body#/id"


@endpoint(blp, "", "post", "orgs:write", body=OrgCreateSchema, ok=OrgSchema, status=201, name="OrgCreateView",
          errors={409: "`org_limit_reached`: the caller already belongs to 50 organisations."},
          links={"GetOrg": link("/api/orgs/{org_id}", "get", "The organisation just created.", org_id=_NEW_ORG),
                 "ListMembers": link("/api/orgs/{org_id}/members", "get", "Its members.", org_id=_NEW_ORG),
                 "InviteMember": link("/api/orgs/{org_id}/invites", "post", "Invite a person.", org_id=_NEW_ORG),
                 "ListInvites": link("/api/orgs/{org_id}/invites", "get", "Its invitations.", org_id=_NEW_ORG),
                 "OrgAudit": link("/api/orgs/{org_id}/audit", "get", "Its audit log.", org_id=_NEW_ORG)})
def create_org(body):
    """Create an organisation: its own balances (live and test, starting at 0; no
    promotional credit) and plan; the caller is its owner. Fund it with any rail by passing
    its `id` as `org_id` (`POST /api/pay/checkout`, `POST /api/wallet/fund`). A person
    belongs to at most 50 organisations (409 `org_limit_reached`)."""
    return orgs.create_org(principal(), current_actor(), body["name"])


@endpoint(blp, "", "get", "orgs:read", ok=OrgListSchema, name="OrgListView")
def list_orgs():
    """The caller's organisations with the caller's role (an organisation key: its own)."""
    return {"orgs": orgs.list_orgs(principal())}


@endpoint(blp, "/<string:org_id>", "get", "orgs:read", ok=OrgSchema, errors={404: _NOT_MEMBER}, name="OrgView")
def get_org(org_id):
    """One of the caller's organisations: balance (in the key's mode), plan, the caller's role."""
    return orgs.get_org(principal(), org_id)


@endpoint(blp, "/<string:org_id>/members", "get", "orgs:read", ok=MemberListSchema, errors={404: _NOT_MEMBER},
          name="MemberListView")
def list_members(org_id):
    """The organisation's members with their roles (any member may read)."""
    return {"members": orgs.list_members(principal(), org_id)}


@endpoint(blp, "/<string:org_id>/members/<string:member_id>", "patch", "orgs:write", body=MemberUpdateSchema,
          ok=MemberUpdatedSchema, errors={403: _ROLE_403, 404: _NOT_MEMBER,
                                   409: "`last_owner`: the organisation's only owner keeps the role."},
          name="MemberUpdateView")
def update_member(body, org_id, member_id):
    """Change a member's `role` and/or `monthly_budget_cents` (owners and admins; only an
    owner gives or takes `owner`, sets an owner's budget, or changes an admin's own
    budget). The new role applies to the
    member's organisation keys on every worker within 60 s (about 1 s with Redis); the
    budget from the next charge (the engine reads it in the charge's own statement). A
    role that may not register agents (`billing`, `viewer`) disables the agents the
    member registered for the organisation (`disabled_agents`), as a removal does."""
    return orgs.update_member(principal(), current_actor(), org_id, member_id, body.get("role"),
                              monthly_budget_cents=body.get("monthly_budget_cents", orgs.UNSET))


@endpoint(blp, "/<string:org_id>/members/<string:member_id>", "delete", "orgs:write", ok=MemberRemovedSchema,
          errors={403: _ROLE_403, 404: _NOT_MEMBER,
                  409: "`last_owner`: the organisation's only owner cannot leave."},
          name="MemberView")
def remove_member(org_id, member_id):
    """Remove a member, or leave (`member_id` = your own account id). Owners and admins
    remove others; only an owner removes an owner; the last owner cannot leave. The
    member's organisation keys are revoked (refused on every worker within 60 s)."""
    return orgs.remove_member(principal(), current_actor(), org_id, member_id)


@endpoint(blp, "/<string:org_id>/invites", "post", "orgs:write", body=InviteCreateSchema, ok=InviteSchema,
          status=201, email_limit="INVITE_EMAIL_RATE_LIMIT", errors={403: _ROLE_403, 404: _NOT_MEMBER,
                              409: "`already_member`: the address is already a member."},
          name="InviteCreateView", links={"RevokeInvite": link(
              "/api/orgs/{org_id}/invites/{invite_id}", "delete", "Revoke the invitation just sent.",
              org_id="$request.path.org_id", invite_id="$response.body#/id")})
def create_invite(body, org_id):
    """Invite a person by e-mail (owners and admins; only an owner invites an owner). The
    e-mail carries a single-use link `{BASE_URL}/invites/{token}`, valid 7 days: its page
    creates the person's account if needed and signs them in on the console, or they
    accept with their own key (`POST /api/orgs/invites/{token}/accept`). A new invitation
    to the same address replaces the pending one. At most `INVITE_EMAIL_RATE_LIMIT` (5 an
    hour) invitations to one address (429)."""
    return invites.invite(principal(), current_actor(), org_id, body["email"], body["role"])


@endpoint(blp, "/<string:org_id>/invites", "get", "orgs:read", ok=InviteListSchema,
          errors={403: _ROLE_403, 404: _NOT_MEMBER}, name="InviteListView")
def list_invites(org_id):
    """The pending invitations (owners and admins)."""
    return {"invites": invites.list_invites(principal(), org_id)}


@endpoint(blp, "/<string:org_id>/invites/<string:invite_id>", "delete", "orgs:write", ok=InviteSchema,
          errors={403: _ROLE_403, 404: _NOT_MEMBER + " No such invitation."}, name="InviteView")
def revoke_invite(org_id, invite_id):
    """Revoke an invitation: its link stops working (owners and admins; idempotent)."""
    return invites.revoke(principal(), current_actor(), org_id, invite_id)


@endpoint(blp, "/invites/<string:token>/accept", "post", "orgs:write", ok=OrgSchema,
          errors={403: "`invite_email_mismatch`: the invitation was sent to another address (the link "
                       "stays usable).",
                  404: "`invalid_token`: the link is unknown, expired, revoked or already used.",
                  409: "`already_member`: the caller is already a member. `org_limit_reached`: the caller "
                       "already belongs to 50 organisations (the link stays usable)."},
          name="InviteAcceptView")
def accept_invite(token):
    """Accept an invitation with your own credential: the invitation's address must be
    your account's. You become a member with the invited role; the answer is the
    organisation with your role."""
    return invites.accept_with_credential(principal(), current_actor(), token)


@endpoint(blp, "/<string:org_id>/audit", "get", "orgs:read", query=AuditQuerySchema, ok=AuditPageSchema,
          errors={403: _ROLE_403, 404: _NOT_MEMBER}, name="AuditView")
@blp.doc(responses={200: {"content": {"text/csv": {"schema": {"type": "string"}, "example": (
    "id,created_at,actor_account_id,credential_id,action,target,before,after,request_id,ip\r\n")}}}})
def audit_log(query, org_id):
    """The organisation's audit log (owners and admins): who (the person and the
    credential), what, on what, before and after, request id and IP, newest first.
    Append-only: entries are written in the transaction of each change and never change.
    `format=csv` streams every entry as CSV."""
    if query["format"] == "csv":
        audit.check_csv(principal(), org_id)
        return _csv(org_id)
    return audit.entries(principal(), org_id, query["limit"], query.get("cursor"))


def _csv(account_id: str) -> Response:
    body = stream_with_context(audit.csv_rows(principal(), account_id))
    return Response(body, mimetype="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="audit-{account_id}.csv"'})


own_blp = Blueprint("audit", __name__, url_prefix="/api/audit",
                    description="The audit log of the caller's own account (docs/teams.md, \"Audit log\").")


@endpoint(own_blp, "", "get", "account:read", query=AuditQuerySchema, ok=AuditPageSchema,
          errors={403: _ROLE_403}, name="OwnAuditView")
@own_blp.doc(responses={200: {"content": {"text/csv": {"schema": {"type": "string"}, "example": (
    "id,created_at,actor_account_id,credential_id,action,target,before,after,request_id,ip\r\n")}}}})
def own_audit_log(query):
    """The audit log of the credential's own account, newest first, in the same form as an
    organisation's: every change to its keys, payments and funding, saved methods, auto
    top-up, payout destination, wallet and alerts (who, with which credential, before and after, request id, IP).
    With an organisation key: the organisation's log (owners and admins; 403
    `org_role_required`). `format=csv` streams every entry as CSV."""
    account_id = audit.own_log(principal())
    if query["format"] == "csv":
        return _csv(account_id)
    return audit.page(account_id, query["limit"], query.get("cursor"))
