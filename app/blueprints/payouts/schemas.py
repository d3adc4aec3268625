"""Schemas of the payouts and owner-earnings routes."""
import marshmallow as ma

from app.blueprints.agents.schemas import StatementSchema
from app.blueprints.fields import InputSchema, Pattern, idempotency_key_header
from app.blueprints.orgs.schemas import org_id_field
from app.services.billing import chains

CONNECT_PATTERN = r"^acct_[A-Za-z0-9]{6,64}$"
EVM_ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"


_ORG_WRITE = "the organisation's payout destination and payouts (roles owner, billing)"


class PayoutsReadQuerySchema(InputSchema):
    """``org_id`` of a payouts read (earnings, payouts, the destination)."""

    org_id = org_id_field("the organisation's earnings, payouts and destination (roles owner, admin, billing, "
                          "viewer)")


class PayoutsWriteQuerySchema(InputSchema):
    """``org_id`` of a payouts change without a body (pay out now, remove the destination)."""

    org_id = org_id_field(_ORG_WRITE)


class StripeDestinationInSchema(InputSchema):
    org_id = org_id_field(_ORG_WRITE)
    account = ma.fields.String(required=True, validate=Pattern(CONNECT_PATTERN), metadata={
        "description": "The Stripe Connect account id. In the sandbox an id containing `fail` makes every "
                       "transfer to it fail."})


class UsdcDestinationInSchema(InputSchema):
    org_id = org_id_field(_ORG_WRITE)
    chain = ma.fields.String(required=True, validate=ma.validate.OneOf(chains.EVM_CHAINS), metadata={
        "description": "The chain the USDC is sent on."})
    address = ma.fields.String(required=True, validate=Pattern(EVM_ADDRESS_PATTERN), metadata={
        "description": "The receiving address: all one case, or EIP-55 checksummed (a mixed-case address "
                       "whose checksum does not match is 422 `unprocessable`)."})


class DestinationSchema(ma.Schema):
    kind = ma.fields.String(required=True)
    account = ma.fields.String()
    chain = ma.fields.String()
    address = ma.fields.String()
    updated_at = ma.fields.DateTime()


class DestinationRemovedSchema(ma.Schema):
    kind = ma.fields.String(allow_none=True, required=True, metadata={"description": "null: kept as balance."})
    moved_to_balance_cents = ma.fields.Integer(required=True, metadata={
        "description": "Settled earnings that were owed to the destination, now in the balance."})


class PayoutSchema(ma.Schema):
    id = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={
        "description": "`pending`, `sending`, `paid`, `failed` (still owed; retried at `next_attempt_at`) "
                       "or `canceled` (the destination was removed; the amount went to the balance)."})
    amount_cents = ma.fields.Integer(required=True)
    amount_micros = ma.fields.Integer(required=True)
    kind = ma.fields.String(required=True)
    destination = ma.fields.String(required=True)
    chain = ma.fields.String(allow_none=True, required=True)
    attempts = ma.fields.Integer(required=True)
    processor_ref = ma.fields.String(allow_none=True, required=True, metadata={
        "description": "The transfer id (Stripe `tr_…`, sandbox `tr_sbx_…`) or transaction hash once paid."})
    failure_code = ma.fields.String(allow_none=True, required=True)
    failure_message = ma.fields.String(allow_none=True, required=True)
    next_attempt_at = ma.fields.DateTime(allow_none=True, required=True)
    created_at = ma.fields.DateTime(required=True)
    paid_at = ma.fields.DateTime(allow_none=True, required=True)


class PayoutListSchema(ma.Schema):
    payouts = ma.fields.List(ma.fields.Nested(PayoutSchema), required=True)
    destination = ma.fields.Nested(DestinationSchema, allow_none=True, required=True)
    minimum_cents = ma.fields.Integer(required=True)
    owed_cents = ma.fields.Integer(required=True, metadata={
        "description": "Settled earnings owed to the destination, not yet paid out."})
    owed_micros = ma.fields.Integer(required=True)


class PayoutHeadersSchema(InputSchema):
    class Meta:
        unknown = ma.EXCLUDE

    idempotency_key = idempotency_key_header(
        "Optional, 1–128 characters: the payout is started once per key "
        "(Stripe's semantics: the same key and body answer the first response, another body is 409).")


class OwnerEarningsSchema(ma.Schema):
    account_id = ma.fields.String(required=True)
    share_pct = ma.fields.Integer(required=True)
    accrued_cents = ma.fields.Integer(required=True, metadata={
        "description": "Earned, not yet settled, net of any carry-over (negative after a refund of a call "
                       "whose month was already settled, until the next earnings repay it)."})
    settled_cents = ma.fields.Integer(required=True, metadata={
        "description": "Moved out by settlements to the balance or `payable` (not what repaid a carry-over)."})
    lifetime_cents = ma.fields.Integer(required=True, metadata={"description": "Floor of `lifetime_micros`."})
    accrued_micros = ma.fields.Integer(required=True)
    settled_micros = ma.fields.Integer(required=True)
    lifetime_micros = ma.fields.Integer(required=True, metadata={"description": "accrued_micros + settled_micros."})
    owed_cents = ma.fields.Integer(required=True, metadata={
        "description": "Settled, owed to the payout destination, not yet paid out."})
    owed_micros = ma.fields.Integer(required=True)
    settlements = ma.fields.List(ma.fields.Nested(StatementSchema), required=True)
