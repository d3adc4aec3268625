"""Schemas of payments (SPEC endpoints 14–16, the webhook and the sandbox checkout)."""
import marshmallow as ma
from marshmallow import validate

from app.blueprints.orgs.schemas import org_id_field
from app.blueprints.fields import (SPACE, HeaderString, InputSchema, JsonBoolean, JsonInteger, Pattern, cents,
                                  idempotency_headers)

from app.services.billing.payments import disputed_micros
from app.services.billing.processors import SANDBOX_METHODS

MAX_AMOUNT_CENTS = 1_000_000


def amount_cents_field(**kw):
    return JsonInteger(required=True, validate=validate.Range(min=100, max=MAX_AMOUNT_CENTS), metadata={
        "description": f"Cents, at least 100 and at most {MAX_AMOUNT_CENTS:,}."}, **kw)


# The shape of a redirect target (services/platform/redirects.py applies the whole rule):
# the authority ends at the first / ? or #, so an "@" there is refused like the service does.
_RETURN_URL = Pattern(
    rf"^https?://[^{SPACE}/?#@\\]+([/?#][^{SPACE}\\]*)?$",
    error="must be an absolute http(s) URL with a host and no userinfo (user@host), backslashes "
          "or whitespace.")


CheckoutHeadersSchema = idempotency_headers(
    "CheckoutHeadersSchema", "Optional, 1–128 characters: one checkout per key (Stripe's "
    "semantics: the same key and body answer the first session, another body is 409).")


class CheckoutSchema(InputSchema):
    amount_cents = amount_cents_field()
    org_id = org_id_field("the checkout funds the organisation's balance (roles owner, billing)")
    product = ma.fields.String(validate=validate.Length(min=1, max=200),
                               metadata={"description": "Label shown on the checkout page."})
    save_method = JsonBoolean(load_default=False, metadata={"description": (
        "Save the card the checkout is paid with and make it the default (`GET /api/pay/methods`; "
        "charged by `/api/wallet/fund` and auto top-up). Stripe: `setup_future_usage=off_session`.")})
    return_url = ma.fields.String(validate=[validate.Length(max=2000), _RETURN_URL],
                               metadata={"description": "Where the checkout sends the user afterwards, with "
                                                        "`checkout=success|cancel&payment_id=…` appended. An "
                                                        "absolute https URL (http outside production) without "
                                                        "userinfo or backslashes; in `RETURN_URL_HOSTS` when "
                                                        "the operator set it."})


class CheckoutCreatedSchema(ma.Schema):
    url = ma.fields.Url(required=True, metadata={"description": "Hosted checkout to redirect the user to."})
    payment_id = ma.fields.String(required=True)
    status = ma.fields.String(required=True, metadata={"description": "`pending` until the processor confirms."})
    expires_at = ma.fields.DateTime(required=True)


class PaymentSchema(ma.Schema):
    id = ma.fields.String(required=True)
    method = ma.fields.String(required=True, metadata={"description": "`card`, `ach`, `usdc` or `x402`."})
    kind = ma.fields.String(required=True, metadata={"description": "`checkout`, `charge`, `deposit` or `x402`."})
    processor = ma.fields.String(required=True, metadata={"description": "`stripe`, `sandbox`, `chain` or `x402`."})
    mode = ma.fields.String(required=True, metadata={"description": "`live` or `test` (sandbox)."})
    amount_cents = cents("amount_micros")
    amount_micros = ma.fields.Integer(required=True)
    refunded_cents = cents("refunded_micros")
    disputed_cents = ma.fields.Method("_disputed_cents", required=True, metadata={
        "type": "integer", "description": "Taken back by chargebacks (disputes' withdrawn funds not reinstated)."})
    dispute_status = ma.fields.Method("_dispute_status", required=True, allow_none=True, metadata={
        "type": "string", "nullable": True,
        "description": "Status of the payment's latest dispute as the processor reports it (`needs_response`, "
                       "`under_review`, `won`, `lost`, …); null when it was never disputed."})
    status = ma.fields.String(required=True, metadata={
        "description": "`pending`, `succeeded`, `failed`, `canceled`, `expired`, `refunded`, `partially_refunded`."})
    product = ma.fields.String(required=True, allow_none=True)
    failure_code = ma.fields.String(required=True, allow_none=True)
    failure_message = ma.fields.String(required=True, allow_none=True)
    created_at = ma.fields.DateTime(required=True)

    def _disputed_cents(self, payment) -> int:
        return disputed_micros(payment) // 10_000

    def _dispute_status(self, payment) -> str | None:
        return (payment.meta or {}).get("dispute_status")


class PaymentHistorySchema(ma.Schema):
    payments = ma.fields.List(ma.fields.Nested(PaymentSchema), required=True,
                              metadata={"description": "The last 50 payments, newest first."})


class MethodRequestSchema(InputSchema):
    payment_method_id = ma.fields.String(required=True, validate=Pattern(r"^pm_[A-Za-z0-9_]{1,100}$"), metadata={
        "description": "Processor payment method id (`pm_…`). Sandbox: " + ", ".join(f"`{k}`" for k in SANDBOX_METHODS)})
    org_id = org_id_field("the method becomes the organisation's default (roles owner, billing)")


class MethodSchema(ma.Schema):
    payment_method_id = ma.fields.String(required=True, allow_none=True)
    type = ma.fields.String(required=True, allow_none=True, attribute="payment_method_type", metadata={"description": "`card` or `us_bank_account`."})
    brand = ma.fields.String(required=True, allow_none=True)
    last4 = ma.fields.String(required=True, allow_none=True)
    processor = ma.fields.String(required=True, allow_none=True)


# Stripe's signature header: ``t=<unix seconds>`` then the signatures (``v1``, and ``v0`` in
# Stripe's test mode), each an HMAC-SHA256 in lower-case hex (what stripe-python compares).
STRIPE_SIGNATURE_PATTERN = r"^t=[0-9]{1,12}(,v[01]=[0-9a-f]{64}){1,10}$"
STRIPE_SIGNATURE_MAX = 2 + 12 + 10 * 68


class WebhookHeadersSchema(InputSchema):
    """Headers of the processor webhook."""

    class Meta:
        unknown = ma.EXCLUDE

    stripe_signature = HeaderString(
        data_key="Stripe-Signature", required=True,
        validate=[validate.Length(min=1, max=STRIPE_SIGNATURE_MAX), Pattern(STRIPE_SIGNATURE_PATTERN)],
        metadata={"description": "`t=<unix time>,v1=<hex HMAC-SHA256 of \"<t>.<raw body>\">` with the "
                                 "endpoint's signing secret (Stripe's scheme; the sandbox signs the same "
                                 "way): the timestamp, then one to ten `v1=` (or test-mode `v0=`) "
                                 "signatures of 64 lower-case hex digits. A header of another shape is "
                                 "400 `invalid_request`; one of this shape that does not verify, or whose "
                                 "`t` is more than 300 s away, is 401 `webhook_signature_invalid`."})


class WebhookResultSchema(ma.Schema):
    received = ma.fields.Boolean(required=True)
    duplicate = ma.fields.Boolean(required=True, metadata={"description": "The event id was already processed; nothing changed."})
    event_id = ma.fields.String(required=True)
    outcome = ma.fields.String(required=True)


class SandboxActionSchema(InputSchema):
    action = ma.fields.String(required=True, validate=validate.OneOf(
        ["pay", "cancel", "authenticate", "fail_authentication"]), metadata={"description": (
            "`pay` or `cancel`; a card that requires 3-D Secure answers a challenge, completed with "
            "`authenticate` or failed with `fail_authentication` (the same `payment_method`).")})
    payment_method = ma.fields.String(validate=validate.OneOf(list(SANDBOX_METHODS)),
                                      load_default="pm_card_visa")
    save_method = ma.fields.Boolean(load_default=False, metadata={"description": (
        "Save the method paid with as the account's default (as Stripe Checkout's \"save my card\"): it then "
        "serves auto top-up and paying without a checkout.")})
