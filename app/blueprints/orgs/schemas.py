"""Schemas of organisations, members and the audit log (docs/teams.md)."""
import marshmallow as ma
from marshmallow import validate

from app.blueprints.contact.schemas import EMAIL_DOC, address
from app.blueprints.fields import NOT_BLANK, InputSchema, JsonInteger, Pattern, QueryInteger, derived
from app.models.orgs import ROLES
from app.services.orgs.orgs import MAX_BUDGET_CENTS
from app.services.money.ledger import micros_to_cents

ID = validate.Length(min=1, max=32)


def org_id_field(what: str, **kw) -> ma.fields.String:
    """The optional ``org_id`` of a request that may act on an organisation."""
    return ma.fields.String(validate=ID, metadata={"description": (
        f"Act on this organisation instead of the credential's own account: {what}. The caller must be a "
        "member whose role allows it (403 `org_role_required` names the roles that do; not a member: 404). "
        "An organisation key acts on its own organisation without it.")}, **kw)


class OrgCreateSchema(InputSchema):
    name = ma.fields.String(required=True, validate=[validate.Length(min=1, max=100),
                                                     Pattern(NOT_BLANK, error="must not be blank.")],
                            metadata={"description": "The organisation's name (trimmed)."})


class OrgSchema(ma.Schema):
    id = ma.fields.String(required=True, metadata={"description": "The organisation's id (`acct_…`): pass it "
                                                                  "as `org_id`."})
    name = ma.fields.String(required=True)
    plan = ma.fields.String(required=True, validate=validate.OneOf(["starter", "pro", "scale", "enterprise"]))
    balance_cents = derived(ma.fields.Integer(required=True, metadata={
        "description": "The organisation's balance in the caller's mode, in cents (floor)."}),
        lambda o: micros_to_cents(o["balance_micros"]))
    role = ma.fields.String(required=True, validate=validate.OneOf(ROLES),
                            metadata={"description": "The caller's role in the organisation."})
    created_at = ma.fields.DateTime(required=True)


class OrgListSchema(ma.Schema):
    orgs = ma.fields.List(ma.fields.Nested(OrgSchema), required=True)


class MemberSchema(ma.Schema):
    member_id = ma.fields.String(required=True, metadata={"description": "The member's own account id."})
    email = ma.fields.String(required=True, allow_none=True)
    role = ma.fields.String(required=True, validate=validate.OneOf(ROLES))
    created_at = ma.fields.DateTime(required=True, metadata={"description": "When the member joined."})
    monthly_budget_cents = ma.fields.Integer(required=True, allow_none=True, metadata={
        "description": "The most the member's organisation keys together may spend per UTC month (module "
                       "calls and chat, live mode); a charge that does not fit is refused with 402 "
                       "`member_budget_exceeded` before anything is charged. Null: no budget."})
    spent_this_month_cents = ma.fields.Integer(required=True, metadata={
        "description": "What the member's organisation keys spent this UTC month (counted with or without a "
                       "budget; refunds and unused chat holds give it back), floor cents."})


class MemberUpdatedSchema(MemberSchema):
    disabled_agents = ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The agents the member registered for the organisation, disabled because the new role "
                       "(`billing`, `viewer`) may not register agents (`DELETE /api/agent/{id}`: sessions "
                       "revoked, balance returned to the organisation); empty otherwise."})
    revoked_invites = ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The pending invitations the member sent that the new role may not send (all of them "
                       "for a role that does not manage members; the `owner` invitations for an owner made "
                       "`admin`), revoked: their links stop working (audited `invite.revoke`, reason "
                       "`inviter_role_changed`); empty otherwise."})


class MemberListSchema(ma.Schema):
    members = ma.fields.List(ma.fields.Nested(MemberSchema), required=True)


class MemberUpdateSchema(InputSchema):
    class Meta:
        json_schema = {"anyOf": [{"required": ["role"]}, {"required": ["monthly_budget_cents"]}]}

    role = ma.fields.String(validate=validate.OneOf(ROLES), metadata={
        "description": "New role; only an owner gives or takes the role `owner`; the last owner keeps it."})
    monthly_budget_cents = JsonInteger(allow_none=True, validate=validate.Range(min=0, max=MAX_BUDGET_CENTS),
                                       metadata={"description": (
        "The member's monthly budget in cents over all their organisation keys (UTC month; 0 refuses every "
        "charge); null removes it. Set below what the member spent this month, it refuses their next "
        "charge. Only an owner sets an owner's budget.")})

    @ma.validates_schema
    def _something(self, data, **kwargs):
        if not data:
            raise ma.ValidationError("Give `role` and/or `monthly_budget_cents`.")


class MemberRemovedSchema(ma.Schema):
    removed = ma.fields.Boolean(required=True)
    member_id = ma.fields.String(required=True)
    revoked_keys = ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The member's organisation keys, revoked with the removal."})
    disabled_agents = ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The agents the member registered for the organisation, disabled with the removal "
                       "(`DELETE /api/agent/{id}`: sessions revoked, balance returned to the organisation)."})
    revoked_invites = ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The pending invitations the member sent, revoked with the removal: their links stop "
                       "working (audited `invite.revoke`, reason `inviter_removed`)."})


class InviteCreateSchema(InputSchema):
    email = ma.fields.String(required=True, validate=[validate.Length(min=3, max=254), address], metadata={
        **EMAIL_DOC, "description": "E-mail address (at most 254 characters) where the single-use link is sent; "
                                    "only the account of this address can accept."})
    role = ma.fields.String(required=True, validate=validate.OneOf(ROLES), metadata={
        "description": "The role the person gets on accepting (only an owner invites an owner)."})


class InviteSchema(ma.Schema):
    id = ma.fields.String(required=True)
    org_id = ma.fields.String(required=True)
    email = ma.fields.String(required=True)
    role = ma.fields.String(required=True, validate=validate.OneOf(ROLES))
    invited_by = ma.fields.String(required=True, metadata={"description": "The inviting member's account id."})
    created_at = ma.fields.DateTime(required=True)
    expires_at = ma.fields.DateTime(required=True, metadata={"description": "7 days after it was sent."})
    accepted_at = ma.fields.DateTime(required=True, allow_none=True)
    revoked_at = ma.fields.DateTime(required=True, allow_none=True)


class InviteListSchema(ma.Schema):
    invites = ma.fields.List(ma.fields.Nested(InviteSchema), required=True, metadata={
        "description": "Pending invitations (not accepted, revoked or expired), oldest first."})


class AuditQuerySchema(InputSchema):
    limit = QueryInteger(load_default=50, validate=validate.Range(min=1, max=200),
                              metadata={"description": "Entries per page (JSON), 1–200, default 50."})
    cursor = ma.fields.String(validate=[validate.Length(max=18), Pattern(r"^[0-9]{1,18}$")],
                              metadata={"description": "`next_cursor` of the previous page."})
    format = ma.fields.String(load_default="json", validate=validate.OneOf(["json", "csv"]), metadata={
        "description": "`json` (default): one page; `csv`: every entry, newest first, streamed as `text/csv` "
                       "with a header row (`limit` and `cursor` do not apply)."})


class AuditEntrySchema(ma.Schema):
    id = ma.fields.String(required=True)
    created_at = ma.fields.DateTime(required=True)
    actor_account_id = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "The person who acted (their own account id); null when no person did (a processor's "
                       "confirmation, a job)."})
    credential_id = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "The key or session they used; null for the invitation page and the console; the "
                       "processor (`sandbox`, `stripe`) for `payment.credit`."})
    action = ma.fields.String(required=True, metadata={
        "description": "`org.create`, `member.add`, `member.update`, `member.remove`, `key.create`, `key.update`, "
                       "`key.rotate`, `key.revoke`, `invite.create`, `invite.revoke`, `checkout.create`, "
                       "`checkout.cancel`, `funding.create`, `payment.credit` (money credited: by the processor, "
                       "no person), `method.default`, `method.remove`, `autotopup.set`, `autotopup.delete`, "
                       "`wallet.connect`, `payout_destination.set`, `payout_destination.remove`, `alert.create`, `alert.delete`, `agent.register`, `agent.fund`, `credit.adjust` and `account.plan` (by an operator)."})
    target = ma.fields.String(required=True, allow_none=True, metadata={"description": "The id acted on."})
    before = ma.fields.Dict(required=True, allow_none=True)
    after = ma.fields.Dict(required=True, allow_none=True)
    request_id = ma.fields.String(required=True, allow_none=True)
    ip = ma.fields.String(required=True, allow_none=True)


class AuditPageSchema(ma.Schema):
    entries = ma.fields.List(ma.fields.Nested(AuditEntrySchema), required=True, metadata={
        "description": "Newest first."})
    next_cursor = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "Pass as `cursor` for the next page; null on the last page."})
