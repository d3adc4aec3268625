"""Module calls (SPEC endpoint 1) and the public module listing (SPEC part 3)."""
from flask import Response, g
from flask.views import MethodView

from app.auth import authenticated, controls_of, key_of, person_of, principal
from app.jsonutil import INTEGER_RANGE_DOC
from app.errors import ErrorSchema
from app.blueprints.gateway.schemas import (ModuleCallHeadersSchema, ModuleCallRequestSchema,
                                            ModuleCallResponseSchema, ModuleListSchema,
                                            ModuleSchema)
from app.blueprints.fields import PAYMENT_REQUIRED_HEADERS, X402_UNAVAILABLE_DOC
from app.blueprints.routing import document_errors, endpoint
from app.extensions import Blueprint
from app.services.gateway import catalog
from app.services.gateway import calls as gateway

blp = Blueprint("modules", __name__, url_prefix="", description="Catalog modules: list and call.")


@blp.route("/v1/module/<string:slug>/call")
class ModuleCallView(MethodView):
    @authenticated("call:write")
    @blp.arguments(ModuleCallHeadersSchema, location="headers", as_kwargs=True)
    @blp.arguments(ModuleCallRequestSchema)
    @blp.response(200, ModuleCallResponseSchema, headers={
        "Idempotent-Replayed": {"description": "`true` on an Idempotency-Key replay.",
                                "schema": {"type": "string"}},
        "PAYMENT-RESPONSE": {"description": "x402 v2 settlement of a call paid with `PAYMENT-SIGNATURE`: "
                                            "base64 JSON `{success, transaction, network, payer, amount}`.",
                             "schema": {"type": "string"}},
        "X-PAYMENT-RESPONSE": {"description": "The same for x402 v1 (`X-Payment`).", "schema": {"type": "string"}}})
    @document_errors(blp, {
        400: "`invalid_request` or `invalid_payment` (the X-Payment / PAYMENT-SIGNATURE "
             "header is not base64/base64url JSON of an x402 exact EVM payload).",
        402: ("`payment_required`: the balance cannot cover the price. The body adds `price_cents`, "
              "`pay_to`, `nonce`, `fund_endpoint` and, when x402 is offered, the x402 v1 payment request "
              "(`x402Version`, `accepts`); nothing was charged or recorded. `payment_invalid`: the X-Payment was refused "
              "(the body adds `price_cents`; when x402 is offered a fresh `PAYMENT-REQUIRED` comes with it; "
              "`reason`: unsupported_scheme, unsupported_network, wrong_asset, wrong_recipient, "
              "insufficient_amount, amount_exceeds_price, not_yet_valid, expired, invalid_signature, "
              "replayed, x402_disabled, facilitator_required, or the facilitator's reason).",
              PAYMENT_REQUIRED_HEADERS),
        404: "`module_not_found`: no active module has this slug; `unknown_action`: the module has "
             "no active action of that name (the module's actions are catalog data, `GET /api/modules/{slug}`).",
        409: "`idempotency_key_reused` / `idempotency_key_in_use`",
        413: "`payload_too_large`",
        422: INTEGER_RANGE_DOC,
        502: "`provider_error` (not charged; when an x402 payment paid the call, it stays as account "
             "credit and the answer carries its `PAYMENT-RESPONSE` / `X-PAYMENT-RESPONSE`)",
        503: X402_UNAVAILABLE_DOC,
        504: "`provider_timeout` (not charged; an x402 payment as for 502)"}, schema=ErrorSchema)
    def post(self, body, slug, idempotency_key=None, x_payment=None, payment_signature=None):
        """Call a module action; charged before forwarding, refunded if the provider fails.

        Every body property (including `action`) is forwarded as JSON to the provider with the
        gateway's provider credentials (never the caller's key). Provider 2xx → `ok: true`;
        provider 4xx → `ok: false` with the provider's body as `result`, **charged** (the
        provider did the work of rejecting the input); connection error, 3xx, 5xx, 401/407
        (the gateway's own credentials refused), 429 → 502 `provider_error`; timeout or 408 →
        504 `provider_timeout`; both refunded. `svc_test_` keys call the
        sandbox upstream and are never charged (`cost_cents` shows the live price).
        """
        p = principal()
        res = gateway.call(account_id=p.account_id, mode=p.mode, slug=slug, body=body,
                           idempotency_key=idempotency_key, payment=payment_signature or x_payment,
                           request_id=g.get("request_id"), key_id=key_of(p),
                           actor=p.credential_id, controls=controls_of(p), actor_account=person_of(p))
        resp = Response(res.body, 200, mimetype="application/json")
        if res.replayed:
            resp.headers["Idempotent-Replayed"] = "true"
        resp.headers.update(res.headers)
        return resp


@endpoint(blp, "/api/modules", "get", public=True, ok=ModuleListSchema, name="ModuleListView")
def list_modules():
    """Approved modules with their actions and prices in cents (public)."""
    return {"modules": catalog.list_modules()}


@endpoint(blp, "/api/modules/<string:slug>", "get", public=True, ok=ModuleSchema, name="ModuleDetailView",
          errors={404: "`module_not_found`"})
def module_detail(slug):
    """One approved module with its actions and prices (public)."""
    return catalog.describe_module(slug)
