"""Schemas of the account resource (SPEC part 2)."""
import marshmallow as ma

from app.blueprints.fields import cents


class AccountSchema(ma.Schema):
    id = ma.fields.String(required=True)
    email = ma.fields.Email(required=True, allow_none=True,
                           metadata={"description": "Null for agent accounts."})
    plan = ma.fields.String(required=True, validate=ma.validate.OneOf(["starter", "pro", "scale", "enterprise"]))
    balance_cents = cents("balance_micros", metadata={"description": "Balance in cents (floor of micros / 10,000)."})
    agent_id = ma.fields.String(required=True, allow_none=True)
