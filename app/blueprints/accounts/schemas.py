"""Schemas of the account resource (SPEC part 2)."""
import marshmallow as ma

from app.blueprints.fields import cents


class ActorSchema(ma.Schema):
    account_id = ma.fields.String(required=True, metadata={
        "description": "The person acting: the member who owns an organisation key, else the account itself."})
    credential_id = ma.fields.String(required=True, metadata={
        "description": "The credential (key or session id): calls and ledger postings record it as `actor`."})
    org_role = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "The member's role in the organisation (an organisation key); null otherwise."})


class AccountSchema(ma.Schema):
    id = ma.fields.String(required=True)
    email = ma.fields.Email(required=True, allow_none=True,
                           metadata={"description": "Null for agent accounts."})
    plan = ma.fields.String(required=True, validate=ma.validate.OneOf(["starter", "pro", "scale", "enterprise"]))
    balance_cents = cents("balance_micros", metadata={"description": "Balance in cents (floor of micros / 10,000)."})
    agent_id = ma.fields.String(required=True, allow_none=True)
    kind = ma.fields.String(required=True, validate=ma.validate.OneOf(["human", "agent", "org"]), metadata={
        "description": "`org`: the credential is an organisation key and this is the organisation, the account "
                       "that pays (see `actor`)."})
    name = ma.fields.String(required=True, allow_none=True, metadata={"description": "An organisation's name; "
                                                                                     "null otherwise."})
    actor = ma.fields.Nested(ActorSchema, required=True)
