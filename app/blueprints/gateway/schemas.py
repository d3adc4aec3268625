"""Schemas of module calls (SPEC part 2: ModuleCallRequest/Response) and the listing."""
import marshmallow as ma

from app.blueprints.fields import (MAX_JSON_DEPTH, FastLoad, InputSchema, derived, header_text,
                                   idempotency_key_header, json_depth, plain_text, text_or_empty)
from app.services.gateway import tools

ACTION_MAX = 64


class ModuleCallRequestSchema(FastLoad, InputSchema):
    """`action` is required; every other property is module-specific and forwarded."""

    class Meta:
        unknown = ma.INCLUDE

    action = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=ACTION_MAX),
                              metadata={"description": "One of the module's actions."})

    def fast_load(self, data):
        """An object whose ``action`` passes the policy, nesting at most MAX_JSON_DEPTH:
        the parsed object itself (what marshmallow returns, other than key order)."""
        if type(data) is not dict or not plain_text(data.get("action"), ACTION_MAX, min_len=1) \
                or json_depth(data) > MAX_JSON_DEPTH:
            return None
        return data


# Below gunicorn's 8,190-byte header line limit, so a longer value is our 400, not its 431.
HEADER_MAX = 8000


class PaymentHeadersSchema(FastLoad, InputSchema):
    """The x402 payment headers (module calls and chat completions)."""

    class Meta:
        unknown = ma.EXCLUDE

    def fast_load(self, data):
        """The two headers, when each is absent or passes its rules (else None)."""
        out = {}
        for name, attr in (("X-Payment", "x_payment"), ("PAYMENT-SIGNATURE", "payment_signature")):
            value = data.get(name, ma.missing)
            if value is not ma.missing:
                if not plain_text(value, HEADER_MAX):
                    return None
                out[attr] = value
        return out

    x_payment = ma.fields.String(
        data_key="X-Payment", validate=ma.validate.Length(max=HEADER_MAX),
        metadata={"description": "x402 v1 payment (base64 or base64url JSON of an `exact` EVM payload: "
                                 "EIP-3009 authorization and signature) for a call the balance cannot cover. "
                                 "Used only then: the gateway verifies it (amount ≥ price, recipient "
                                 "`X-Pay-To`, validity window, network, asset, single use), settles it, "
                                 "credits the amount and charges the call in one transaction; the answer "
                                 "carries `X-PAYMENT-RESPONSE`. Undecodable: 400 `invalid_payment`; refused: "
                                 "402 `payment_invalid` with `reason`. When x402 is not offered (no `X-Pay-To` "
                                 "on the 402) a payment is refused: `x402_disabled` (no X402_PAY_TO) or "
                                 "`facilitator_required` (no facilitator; live payments settle only "
                                 "through one)."})
    payment_signature = ma.fields.String(
        data_key="PAYMENT-SIGNATURE", validate=ma.validate.Length(max=HEADER_MAX),
        metadata={"description": "x402 v2 name of the payment header; same meaning as X-Payment. When both "
                                 "are sent, this one is read."})




class ModuleCallHeadersSchema(PaymentHeadersSchema):
    class Meta:
        unknown = ma.EXCLUDE

    def fast_load(self, data):
        """The three headers, when each is absent or passes its rules (else None)."""
        out = {}
        key = data.get("Idempotency-Key", ma.missing)
        if key is not ma.missing:
            key = header_text(key)
            if not plain_text(key, 128, min_len=1):
                return None
            out["idempotency_key"] = key
        payment = super().fast_load(data)
        if payment is None:
            return None
        out.update(payment)
        return out

    idempotency_key = idempotency_key_header(
        "Optional, 1–128 characters (UTF-8 is read as UTF-8), "
        "per account, kept 24 h. The same key "
        "with the same request returns the stored response "
        "(`Idempotent-Replayed: true`) without a second charge.")


class ReceiptSchema(ma.Schema):
    hash = ma.fields.String(required=True, metadata={"description": "SHA-256 hex of the canonical signed facts."})
    sig = ma.fields.String(required=True, metadata={"description": "Base64 ed25519 signature over the canonical facts."})
    v = ma.fields.Integer(metadata={"description": "Receipt format version (2; version 1, signed before "
                                                   "2026-11-28, has no `actor` / `actor_account_id` and still "
                                                   "verifies)."})
    kid = ma.fields.String(metadata={"description": "Signing key id (see GET /api/receipts/keys)."})
    alg = ma.fields.String(metadata={"description": "`ed25519`."})
    ts = ma.fields.String(metadata={"description": "Time of the call (RFC 3339, UTC)."})
    account_id = ma.fields.String(metadata={"description": "The account that paid (an organisation for an "
                                                          "organisation key)."})
    actor = ma.fields.String(allow_none=True, metadata={"description": "The credential that acted: the API key "
                                                                      "or agent session id (signed)."})
    actor_account_id = ma.fields.String(metadata={"description": "The person behind the credential: an "
                                                                "organisation key's member, else the paying "
                                                                "account (signed)."})
    action = ma.fields.String()
    mode = ma.fields.String(metadata={"description": "`live` or `test`."})


class ModuleCallResponseSchema(ma.Schema):
    ok = ma.fields.Boolean(required=True, metadata={"description": "false when the provider answered 4xx (still charged)."})
    module = ma.fields.String(required=True)
    call_id = ma.fields.String(required=True)
    cost_cents = ma.fields.Integer(required=True)
    result = ma.fields.Dict(required=True, metadata={
        "description": "The provider's JSON object; other JSON values as `{data}`, non-JSON bodies as "
                       "`{text, content_type}`, an empty body as `{}`."})
    receipt = ma.fields.Nested(ReceiptSchema, required=True)


class ActionSchema(ma.Schema):
    name = ma.fields.String(required=True)
    description = text_or_empty("description")
    price_cents = ma.fields.Integer(required=True)


class ModuleSchema(ma.Schema):
    slug = ma.fields.String(required=True)
    name = ma.fields.String(required=True)
    description = derived(ma.fields.String(required=True), lambda m: m.listed_description)
    owner = derived(ma.fields.String(required=True), lambda m: m.owner_name)
    owner_agent_id = ma.fields.String(allow_none=True, required=True)
    source = ma.fields.String(required=True, metadata={"description": "`catalog` or `agent`."})
    sandbox = derived(ma.fields.Boolean(required=True, metadata={"description": "Callable with svc_test_ keys."}),
                      lambda m: bool(m.sandbox_url))
    actions = derived(ma.fields.List(ma.fields.Nested(ActionSchema), required=True),
                      lambda m: [a for a in m.actions if a.active])
    mcp_tools = derived(ma.fields.List(ma.fields.String(), required=True, metadata={
        "description": "The module's actions as tools of the MCP server at `/mcp` (`<slug>__<action>`)."}),
        tools.tool_names)


class ModuleListSchema(ma.Schema):
    modules = ma.fields.List(ma.fields.Nested(ModuleSchema), required=True)
