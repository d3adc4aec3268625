"""Payment endpoints (SPEC 14–16) and the processor webhook."""
from flask import request

from app.auth import principal
from app.blueprints.payments.schemas import (CheckoutCreatedSchema, CheckoutHeadersSchema, CheckoutSchema, MethodRequestSchema,
                                             MethodSchema, PaymentHistorySchema, WebhookHeadersSchema,
                                             WebhookResultSchema)
from app.blueprints.routing import endpoint
from app.extensions import Blueprint
from app.services.billing import payment_events, payments

blp = Blueprint("payments", __name__, url_prefix="/api/pay",
                description="Checkout, payment history, the default payment method and the processor webhook.")


@endpoint(blp, "/checkout", "post", "billing:write", body=CheckoutSchema, ok=CheckoutCreatedSchema,
          headers=CheckoutHeadersSchema, idempotent=True)
def checkout(body):
    """Start a hosted checkout and get its `url`.

    Credits arrive only when the processor confirms the payment (a verified webhook),
    exactly once. `svc_test_` keys (and the embedded default) use the sandbox checkout."""
    p = principal()
    return payments.create_checkout(p.account_id, p.mode, body["amount_cents"], body.get("product"),
                                    body.get("return_url"))


@endpoint(blp, "/history", "get", "billing:read", ok=PaymentHistorySchema)
def history():
    """The last 50 payments (card, ACH, USDC, x402), newest first."""
    return {"payments": payments.history(principal().account_id, principal().mode)}


@endpoint(blp, "/method", "post", "billing:write", body=MethodRequestSchema, ok=MethodSchema,
          name="MethodView_")
def default_method(body):
    """Save `payment_method_id` as the default method used by `/api/wallet/fund`.

    Validated with the processor (unknown id → 400 `payment_method_invalid`), attached
    to the account's customer. A card serves `method: card`, a `us_bank_account` serves
    `method: ach`."""
    p = principal()
    return payments.set_default_method(p.account_id, p.mode, body["payment_method_id"])


@endpoint(blp, "/webhook", "post", public=True, headers=WebhookHeadersSchema, ok=WebhookResultSchema,
          errors={400: "Forged or stale signature (`webhook_signature_invalid`), a body that is not an "
                       "event, or a missing or malformed header (`invalid_request`)."})
@blp.doc(requestBody={"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "The processor's event, verified and read as sent (`id`, `type`, "
                                     "`data.object`)."}}}})
def webhook(stripe_signature):
    """Processor webhook (Stripe events; sandbox events use the same code).

    Verifies `Stripe-Signature` on the raw body (300 s tolerance), stores the event under
    its unique id and applies it in the same transaction. Handled: `checkout.session.*`,
    `payment_intent.succeeded|payment_failed|canceled`, `charge.refunded`. A replayed
    event id answers 200 with `duplicate: true` and changes nothing."""
    return payment_events.handle_webhook(request.get_data(cache=False), stripe_signature)
