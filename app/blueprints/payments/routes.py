"""Payment endpoints (SPEC 14–16) and the processor webhook."""
from flask import request
from flask.views import MethodView

from app.auth import authenticated, principal, public
from app.blueprints.payments.schemas import (CheckoutCreatedSchema, CheckoutSchema, MethodRequestSchema,
                                             MethodSchema, PaymentHistorySchema, WebhookResultSchema)
from app.extensions import Blueprint
from app.services.billing import payment_events, payments

blp = Blueprint("payments", __name__, url_prefix="/api/pay",
                description="Checkout, payment history, the default payment method and the processor webhook.")


@blp.route("/checkout")
class CheckoutView(MethodView):
    @authenticated("billing:write")
    @blp.arguments(CheckoutSchema)
    @blp.response(200, CheckoutCreatedSchema)
    def post(self, body):
        """Start a hosted checkout and get its `url`.

        Credits arrive only when the processor confirms the payment (a verified webhook),
        exactly once. `svc_test_` keys (and the embedded default) use the sandbox checkout."""
        p = principal()
        return payments.create_checkout(p.account_id, p.mode, body["amount_cents"], body.get("product"),
                                        body.get("return_url"))


@blp.route("/history")
class HistoryView(MethodView):
    @authenticated("billing:read")
    @blp.response(200, PaymentHistorySchema)
    def get(self):
        """The last 50 payments (card, ACH, USDC, x402), newest first."""
        return {"payments": payments.history(principal().account_id)}


@blp.route("/method")
class MethodView_(MethodView):
    @authenticated("billing:write")
    @blp.arguments(MethodRequestSchema)
    @blp.response(200, MethodSchema)
    def post(self, body):
        """Save `payment_method_id` as the default method used by `/api/wallet/fund`.

        Validated with the processor (unknown id → 400 `payment_method_invalid`), attached
        to the account's customer. A card serves `method: card`, a `us_bank_account` serves
        `method: ach`."""
        p = principal()
        return payments.set_default_method(p.account_id, p.mode, body["payment_method_id"])


@blp.route("/webhook")
class WebhookView(MethodView):
    @public
    @blp.response(200, WebhookResultSchema)
    @blp.alt_response(400, response="BAD_REQUEST", description="Missing, forged or stale signature "
                      "(`webhook_signature_invalid`) or a body that is not an event.")
    def post(self):
        """Processor webhook (Stripe events; sandbox events use the same code).

        Verifies `Stripe-Signature` on the raw body (300 s tolerance), stores the event under
        its unique id and applies it in the same transaction. Handled: `checkout.session.*`,
        `payment_intent.succeeded|payment_failed|canceled`, `charge.refunded`. A replayed
        event id answers 200 with `duplicate: true` and changes nothing."""
        return payment_events.handle_webhook(request.get_data(cache=False), request.headers.get("Stripe-Signature"))
