"""Schemas of auto top-up (``/api/pay/auto-topup``), a pending checkout's resume and the saved
payment methods (``/api/pay/methods``)."""
import marshmallow as ma
from marshmallow import validate

from app.blueprints.fields import InputSchema, JsonInteger, cents
from app.blueprints.orgs.schemas import org_id_field
from app.blueprints.payments.schemas import MAX_AMOUNT_CENTS, amount_cents_field
from app.blueprints.payments.schemas import MethodSchema


class AutoTopupRequestSchema(InputSchema):
    threshold_cents = JsonInteger(required=True, validate=validate.Range(min=1, max=MAX_AMOUNT_CENTS), metadata={
        "description": "When a charge leaves the balance under this many cents, one top-up starts. At least 1: "
                       "a balance is never under 0, so a rule at 0 would never start one."})
    amount_cents = amount_cents_field()
    monthly_cap_cents = JsonInteger(required=True, validate=validate.Range(min=100, max=100 * MAX_AMOUNT_CENTS),
                                    metadata={"description": "At most this many cents of auto top-ups per calendar "
                                                             "month (UTC); at least `amount_cents`."})
    org_id = org_id_field("the rule tops up the organisation's balance from its saved card (roles owner, "
                          "billing)")


class AutoTopupRunSchema(ma.Schema):
    id = ma.fields.Integer(required=True)
    status = ma.fields.String(required=True, metadata={"description": (
        "`queued`, `processing`, `succeeded`, `pending` (the processor is still working; its webhook "
        "completes the payment and closes the run: `succeeded` or `failed`), `failed` (declined), `requires_action` (3-D Secure asked for; pay a "
        "checkout on-session) or `skipped`.")})
    reason = ma.fields.String(required=True, allow_none=True, metadata={"description": (
        "Why it was skipped (`disabled`, `above_threshold`, `cap_reached`, `no_method: …`) or failed "
        "(`<decline code>: <message>`).")})
    amount_cents = cents("amount_micros", metadata={
        "description": "What the run charges, fixed when it is charged: 0 while `queued` and when `skipped` "
                       "(nothing charged)."})
    payment_id = ma.fields.String(required=True, allow_none=True,
                                  metadata={"description": "Its payment (in `GET /api/pay/history`)."})
    due_at = ma.fields.DateTime(required=True, metadata={"description": "When it may run (a retry: later)."})
    created_at = ma.fields.DateTime(required=True)
    updated_at = ma.fields.DateTime(required=True)


class AutoTopupSchema(ma.Schema):
    threshold_cents = cents("threshold_micros")
    amount_cents = cents("amount_micros")
    monthly_cap_cents = cents("monthly_cap_micros")
    enabled = ma.fields.Boolean(required=True, metadata={
        "description": "False once it was disabled after failed attempts (`disabled_reason`)."})
    failures = ma.fields.Integer(required=True, metadata={"description": "Consecutive failed attempts."})
    disabled_reason = ma.fields.String(required=True, allow_none=True)
    month_cents = cents("month_micros", metadata={
        "description": "Auto top-ups charged (or in progress) this calendar month (UTC)."})
    method = ma.fields.Nested(MethodSchema, required=True, allow_none=True,
                              metadata={"description": "The saved card it charges (null: no default card — none "
                                                       "saved, the default removed, or the default is a bank "
                                                       "account; runs are then skipped and the owner told)."})
    runs = ma.fields.List(ma.fields.Nested(AutoTopupRunSchema), required=True,
                          metadata={"description": "The last 10 runs, newest first."})
    card_needs_authentication = ma.fields.Boolean(required=True, dump_only=True, metadata={"description": (
        "Read-only: true when the saved card is known to need 3-D Secure, so auto top-up's off-session "
        "charges on it fail (runs `requires_action`): the processor says so of the card, or its latest "
        "off-session charge failed with `authentication_required`. False when not known (the bank decides at "
        "each charge) or there is no card. The rule is accepted either way; pay a checkout on-session, or "
        "save another card.")})


class DeletedSchema(ma.Schema):
    deleted = ma.fields.Boolean(required=True)


class CheckoutStateSchema(ma.Schema):
    url = ma.fields.Url(required=True, allow_none=True, metadata={
        "description": "The hosted checkout page while it can still be paid; null once it is paid, "
                       "canceled, expired or its bank payment was submitted."})
    payment_id = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={"description": "The payment's status (`pending`, …)."})
    expires_at = ma.fields.DateTime(required=True, allow_none=True)


class SavedMethodSchema(MethodSchema):
    default = ma.fields.Boolean(required=True, metadata={"description": "The method `/api/wallet/fund` and auto "
                                                                        "top-up charge."})
    created_at = ma.fields.DateTime(required=True)


class SavedMethodListSchema(ma.Schema):
    methods = ma.fields.List(ma.fields.Nested(SavedMethodSchema), required=True,
                             metadata={"description": "Saved with the processor of the key's mode, oldest first."})


class BillingReadQuerySchema(InputSchema):
    """``org_id`` of a billing read (payment history, saved methods, auto top-up, a checkout)."""

    org_id = org_id_field("the organisation's payments, saved methods, auto top-up or checkout (roles owner, "
                          "admin, billing, viewer)")


class BillingWriteQuerySchema(InputSchema):
    """``org_id`` of a billing change without a body (a saved method, auto top-up, a checkout)."""

    org_id = org_id_field("the organisation's saved method, auto top-up or checkout (roles owner, billing)")
