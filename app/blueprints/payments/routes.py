"""Payment endpoints (SPEC 14–16) and the processor webhook."""
from flask import Response, request

from app.auth import principal
from app.blueprints.payments.autotopup_schemas import (AutoTopupRequestSchema, AutoTopupSchema,
                                                       BillingReadQuerySchema, BillingWriteQuerySchema,
                                                       CheckoutStateSchema, DeletedSchema, SavedMethodListSchema)
from app.blueprints.payments.schemas import (CheckoutCreatedSchema, CheckoutHeadersSchema, CheckoutSchema,
                                             MethodRequestSchema, MethodSchema, PaymentHistorySchema, PaymentSchema,
                                             WebhookHeadersSchema, WebhookResultSchema)
from app.blueprints.payments.invoice_schemas import (InvoiceListQuerySchema, InvoiceListSchema, InvoiceQuerySchema,
                                                     InvoiceSchema)
from app.blueprints.routing import NOT_MEMBER, acting_account, endpoint, link
from app.extensions import Blueprint
from app.services.billing import autotopup, checkouts, invoices, methods, payment_events, payments
from app.services.platform import redirects

BILLING_WRITE = "billing:write"
BILLING_READ = "billing:read"

blp = Blueprint("payments", __name__, url_prefix="/api/pay",
                description="Checkout (resume, cancel), payment history, saved payment methods and the "
                            "default one, auto top-up and the processor webhook.")


_NEW_PAYMENT = "$response.body#/payment_id"
_CHECKOUT_LINK = "The checkout just started (an organisation's: with its `org_id`)."


@endpoint(blp, "/checkout", "post", "billing:write", body=CheckoutSchema, ok=CheckoutCreatedSchema,
          headers=CheckoutHeadersSchema, idempotent=True, errors={422: redirects.REFUSED_DOC},
          links={"GetCheckout": link("/api/pay/checkout/{payment_id}", "get", _CHECKOUT_LINK, payment_id=_NEW_PAYMENT),
                 "CancelCheckout": link("/api/pay/checkout/{payment_id}/cancel", "post", _CHECKOUT_LINK,
                                        payment_id=_NEW_PAYMENT)})
def checkout(body):
    """Start a hosted checkout and get its `url`.

    Credits arrive only when the processor confirms the payment (a verified webhook),
    exactly once. `svc_test_` keys (and the embedded default) use the sandbox checkout.
    With `org_id` the organisation's balance is funded."""
    return payments.create_checkout(acting_account(body.get("org_id"), BILLING_WRITE), principal().mode, body["amount_cents"],
                                    body.get("product"), body.get("return_url"), save_method=body["save_method"])


@endpoint(blp, "/history", "get", "billing:read", query=BillingReadQuerySchema, ok=PaymentHistorySchema,
          errors={404: NOT_MEMBER})
def history(query):
    """The last 50 payments (card, ACH, USDC, x402, auto top-ups), newest first; with `org_id`
    the organisation's."""
    return {"payments": payments.history(acting_account(query.get("org_id"), BILLING_READ), principal().mode)}


@endpoint(blp, "/method", "post", "billing:write", body=MethodRequestSchema, ok=MethodSchema,
          name="MethodView_", errors={
              404: "`payment_method_not_found`: the processor does not know the id (the sandbox: its test ids "
                   "only).",
              409: "`payment_method_invalid`: the processor knows the method but it cannot be used (its type "
                   "is not card or us_bank_account, or the processor refused to attach it)."})
def default_method(body):
    """Save `payment_method_id` as the default method used by `/api/wallet/fund`.

    Validated with the processor (unknown id → 404 `payment_method_not_found`; known but
    unusable → 409 `payment_method_invalid`), attached
    to the account's customer. A card serves `method: card`, a `us_bank_account` serves
    `method: ach`."""
    return payments.set_default_method(acting_account(body.get("org_id"), BILLING_WRITE), principal().mode,
                                       body["payment_method_id"])


@endpoint(blp, "/webhook", "post", public=True, headers=WebhookHeadersSchema, ok=WebhookResultSchema,
          errors={400: "`invalid_request`: a missing `Stripe-Signature` or one not of the documented shape, or "
                       "a verified body that is not an event.",
                  401: "`webhook_signature_invalid`: the `Stripe-Signature` has the documented shape but does "
                       "not verify over the body, or its `t` is more than 300 s away."})
@blp.doc(requestBody={"required": True, "content": {"application/json": {"schema": {
    "type": "object", "description": "The processor's event, verified and read as sent (`id`, `type`, "
                                     "`data.object`)."}}}})
def webhook(stripe_signature):
    """Processor webhook (Stripe events; sandbox events use the same code).

    Verifies `Stripe-Signature` on the raw body (300 s tolerance), stores the event under
    its unique id and applies it in the same transaction. Handled: `checkout.session.*`,
    `payment_intent.succeeded|payment_failed|canceled`, `charge.refunded` (the refund taken
    back, and a credit note for the payment's invoice) and `charge.dispute.*` (a chargeback's
    funds withdrawn or reinstated). A replayed event id answers 200 with `duplicate: true` and
    changes nothing."""
    return payment_events.handle_webhook(request.get_data(cache=False), stripe_signature)


@endpoint(blp, "/auto-topup", "put", "billing:write", body=AutoTopupRequestSchema, ok=AutoTopupSchema,
          errors={403: "`beyond_own_limits`: the key has a spend limit (its own, or its rotation's) or is an "
                       "organisation key whose member has a monthly budget; auto "
                       "top-up charges the card past any key's limit, so it needs a key without one or the "
                       "console. Turning it off (`DELETE`) is allowed.",
                  404: NOT_MEMBER, 409: "`no_payment_method`: no saved card to charge.",
                  422: "`unprocessable`: `monthly_cap_cents` is less than `amount_cents`."},
          name="AutoTopupSetView")
def set_auto_topup(body):
    """Set auto top-up: when a charge leaves the balance under `threshold_cents`, one top-up of
    `amount_cents` is charged to the saved card (off-session), at most `monthly_cap_cents` a month.

    Replaces the previous rule and turns it on (failures reset). Needs a saved card (409
    `no_payment_method`). If the balance is already under the threshold, one top-up starts now.
    A top-up starts within seconds of the crossing; exactly one per crossing, whatever the
    concurrency. A declined or 3-D Secure attempt is retried later; after
    `AUTOTOPUP_MAX_FAILURES` (default 3) in a row the rule is disabled and the owner e-mailed.
    With `org_id` the organisation's rule: its balance, its saved card, its owners and billing
    members e-mailed. A key with a spend limit, or an organisation key whose member has a monthly
    budget, cannot set it (403 `beyond_own_limits`)."""
    account_id = acting_account(body.pop("org_id", None), BILLING_WRITE)
    return autotopup.configure(account_id, principal().mode, acting_key_id=principal().credential_id, **body)


@endpoint(blp, "/auto-topup", "get", "billing:read", query=BillingReadQuerySchema, ok=AutoTopupSchema,
          errors={404: f"No auto top-up is set, or {NOT_MEMBER}"}, name="AutoTopupView")
def get_auto_topup(query):
    """The auto top-up rule, its card, this month's total and the last 10 runs (with `org_id`:
    the organisation's)."""
    return autotopup.view(acting_account(query.get("org_id"), BILLING_READ), principal().mode)


@endpoint(blp, "/auto-topup", "delete", "billing:write", query=BillingWriteQuerySchema, ok=DeletedSchema,
          errors={404: f"No auto top-up was ever set in this mode, or {NOT_MEMBER}"}, name="AutoTopupDeleteView")
def delete_auto_topup(query):
    """Turn auto top-up off and delete the rule (with `org_id`: the organisation's); queued
    runs are skipped (a charge already sent to the processor is still booked). Deleting it
    again answers the same 200 and changes nothing (a retry whose first answer was lost), as
    deleting an alert does."""
    autotopup.remove(acting_account(query.get("org_id"), BILLING_WRITE), principal().mode)
    return {"deleted": True}


@endpoint(blp, "/checkout/<string:payment_id>", "get", "billing:read", query=BillingReadQuerySchema,
          ok=CheckoutStateSchema, errors={404: f"No such checkout of this account and mode, or {NOT_MEMBER}"},
          name="CheckoutStateView")
def resume_checkout(query, payment_id):
    """Resume a checkout: its status and, while it can still be paid, its hosted page `url`
    (null once paid, canceled, expired or its bank payment submitted). An organisation's
    checkout (created with `org_id`) is resumed with the same `org_id`."""
    return checkouts.resume(acting_account(query.get("org_id"), BILLING_READ), principal().mode, payment_id)


@endpoint(blp, "/checkout/<string:payment_id>/cancel", "post", "billing:write", query=BillingWriteQuerySchema,
          ok=PaymentSchema, errors={404: f"No such checkout of this account and mode, or {NOT_MEMBER}",
                  409: "`checkout_not_cancelable`: it is no longer pending, or it was paid or its bank payment "
                       "submitted."}, name="CheckoutCancelView")
def cancel_checkout(query, payment_id):
    """Cancel a pending checkout: the processor's session is closed first (it can no longer be
    paid), then the payment becomes `canceled`. Nothing was charged. An organisation's
    checkout is canceled with its `org_id`."""
    return checkouts.cancel(acting_account(query.get("org_id"), BILLING_WRITE), principal().mode, payment_id)


@endpoint(blp, "/methods", "get", "billing:read", query=BillingReadQuerySchema, ok=SavedMethodListSchema,
          errors={404: NOT_MEMBER}, name="SavedMethodsView")
def saved_methods(query):
    """The saved payment methods (each `POST /api/pay/method` saves one), with the default
    marked; with `org_id` the organisation's."""
    return {"methods": methods.list_methods(acting_account(query.get("org_id"), BILLING_READ), principal().mode)}


@endpoint(blp, "/methods/<string:payment_method_id>/default", "post", "billing:write",
          query=BillingWriteQuerySchema, ok=MethodSchema,
          errors={404: f"No such saved payment method, or {NOT_MEMBER}"}, name="SavedMethodDefaultView")
def default_saved_method(query, payment_method_id):
    """Make a saved method the default again (the one `/api/wallet/fund` and auto top-up
    charge); with `org_id` one of the organisation's."""
    return methods.make_default(acting_account(query.get("org_id"), BILLING_WRITE), principal().mode, payment_method_id)


@endpoint(blp, "/methods/<string:payment_method_id>", "delete", "billing:write", query=BillingWriteQuerySchema,
          ok=DeletedSchema, errors={404: f"No such payment method saved in this mode, or {NOT_MEMBER}"},
          name="SavedMethodView")
def remove_saved_method(query, payment_method_id):
    """Remove a saved method: detached at the processor first, then forgotten. Removing the
    default leaves none: funding by card and auto top-up answer `no_payment_method` until
    another is made the default. Removing it again answers the same 200 and changes nothing
    (a retry whose first answer was lost), as deleting an alert does. With `org_id` one of
    the organisation's."""
    methods.remove(acting_account(query.get("org_id"), BILLING_WRITE), principal().mode, payment_method_id)
    return {"deleted": True}


def _invoice_response(inv):
    pdf = invoices.invoice_pdf(inv)
    return Response(pdf, mimetype="application/pdf",
                    headers={"Content-Disposition": f'inline; filename="{inv.number}.pdf"',
                             "Cache-Control": "private, max-age=3600"})


_PDF_DOC = {"200": {"description": "The invoice (JSON, or the PDF with `Accept: application/pdf`).", "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/Invoice"}},
    "application/pdf": {"schema": {"type": "string", "format": "binary"}}}}}


@endpoint(blp, "/invoices", "get", "billing:read", query=InvoiceListQuerySchema, ok=InvoiceListSchema,
          name="InvoiceListView")
def list_invoices(query):
    """The invoices of the key's mode, newest first: one per payment (checkout, wallet funding,
    auto top-up, USDC, x402) and one per month of usage; `next_cursor` pages on. A refunded
    payment's invoice lists its credit notes, `credited` and `net_total`."""
    return invoices.list_invoices(acting_account(query.get("org_id"), BILLING_READ), principal().mode, query["limit"],
                                  query.get("cursor"))


@endpoint(blp, "/invoices/<string:invoice_id>", "get", "billing:read", query=InvoiceQuerySchema, ok=InvoiceSchema,
          errors={404: "No such invoice of this account and mode."}, name="InvoiceView")
@blp.doc(responses=_PDF_DOC)
def get_invoice(query, invoice_id):
    """One invoice or credit note as issued (numbered, never changed): JSON, or its PDF when the
    request prefers `Accept: application/pdf` (also at `/api/pay/invoices/{id}.pdf`)."""
    inv = invoices.get_invoice(acting_account(query.get("org_id"), BILLING_READ), principal().mode, invoice_id)
    if request.accept_mimetypes.best_match(("application/json", "application/pdf")) == "application/pdf":
        return _invoice_response(inv)
    return invoices.view(inv)


@endpoint(blp, "/invoices/<string:invoice_id>.pdf", "get", "billing:read", query=InvoiceQuerySchema,
          errors={404: "No such invoice of this account and mode."}, name="InvoicePdfView")
@blp.doc(responses={"200": {"description": "The invoice's PDF.", "content": {
    "application/pdf": {"schema": {"type": "string", "format": "binary"}}}}})
def get_invoice_pdf(query, invoice_id):
    """One invoice's PDF (A4, made with fpdf2 from the stored document: the same bytes each time)."""
    return _invoice_response(invoices.get_invoice(acting_account(query.get("org_id"), BILLING_READ), principal().mode,
                                                  invoice_id))
