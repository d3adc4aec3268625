"""Schemas of the wallet (SPEC endpoints 17–20 and the connect message)."""
import marshmallow as ma
from marshmallow import validate

from app.blueprints.orgs.schemas import org_id_field
from app.blueprints.fields import InputSchema, Pattern, QueryInteger, cents, idempotency_headers
from app.blueprints.payments.schemas import amount_cents_field
from app.services.billing.chains import CHAINS, EVM_CHAINS

# The shapes of a wallet address and of its signature, per chain family. What a pattern
# cannot state (an EIP-55 checksum; base58 that is the canonical spelling of exactly 32 /
# 64 bytes) is 422 ``unprocessable`` (docs/decisions.md "Schema-valid requests").
EVM_ADDRESS = r"0x[0-9a-fA-F]{40}"
SOLANA_ADDRESS = r"[1-9A-HJ-NP-Za-km-z]{32,44}"
_SHAPES = {
    "evm": (EVM_ADDRESS, r"0x[0-9a-fA-F]{130}"),
    "solana": (SOLANA_ADDRESS, r"(base58:)?[1-9A-HJ-NP-Za-km-z]{64,88}"),
}
_FAMILY = {**{chain: "evm" for chain in EVM_CHAINS}, "solana": "solana"}
_CHECKS = {family: {"address": Pattern(f"^{address}$", error=f"not a {family.upper()} address (chain family "
                                                                 f"{family})."),
                    "signature": Pattern(f"^{signature}$", error=f"not a {family.upper()} signature (chain "
                                                                  f"family {family}).")}
           for family, (address, signature) in _SHAPES.items()}
ADDRESS_DESCRIPTION = ("EVM chains (base, ethereum, polygon): `0x` + 40 hex digits; a mixed-case address must "
                       "carry a valid EIP-55 checksum (422 otherwise). Solana: the canonical base58 of the "
                       "32-byte public key (422 when it does not decode to 32 bytes).")


_ORG_WRITE = ("the organisation's wallet (roles owner, billing; the console's billing page does the same for "
              "the organisation it acts for)")
_ORG_READ = "the organisation's balance and ledger entries (roles owner, admin, billing, viewer)"


class WalletQuerySchema(InputSchema):
    """``org_id`` of a wallet read (``GET /api/wallet/balance``)."""

    org_id = org_id_field(_ORG_READ)


class ConnectMessageQuerySchema(InputSchema):
    org_id = org_id_field(_ORG_WRITE)
    chain = ma.fields.String(required=True, validate=validate.OneOf(CHAINS))
    address = ma.fields.String(required=True, validate=[validate.Length(min=32, max=44), Pattern(
        rf"^({EVM_ADDRESS}|{SOLANA_ADDRESS})$")], metadata={
        "description": ADDRESS_DESCRIPTION + " Query parameters are described one by one, so an address of "
                       "the other family than `chain`'s is 422 `unprocessable` here (the request body of "
                       "`POST /api/wallet/connect` states it per chain)."})


class ConnectMessageSchema(ma.Schema):
    message = ma.fields.String(required=True, metadata={
        "description": "EIP-4361 text to sign: EIP-191 `personal_sign` for EVM chains, ed25519 over the "
                       "UTF-8 bytes for Solana."})
    nonce = ma.fields.String(required=True, metadata={"description": "Single use; embedded in `message`."})
    expires_at = ma.fields.DateTime(required=True)
    chain = ma.fields.String(required=True)
    address = ma.fields.String(required=True, metadata={"description": "Normalized (EIP-55 for EVM)."})


class WalletConnectSchema(InputSchema):
    """The address and signature shapes per chain (``if``/``then`` on ``chain``); the server
    applies the same patterns (``_chain_shapes``)."""

    class Meta:
        json_schema = {"allOf": [
            {"if": {"required": ["chain"], "properties": {"chain": {"enum": sorted(
                chain for chain, fam in _FAMILY.items() if fam == family)}}},
             "then": {"properties": {"address": {"pattern": f"^{address}$"},
                                     "signature": {"pattern": f"^{signature}$"}}}}
            for family, (address, signature) in _SHAPES.items()]}

    @ma.validates_schema
    def _chain_shapes(self, data, **kwargs):
        checks = _CHECKS.get(_FAMILY.get(data.get("chain")), {})
        errors = {}
        for name, check in checks.items():
            if isinstance(data.get(name), str):
                try:
                    check(data[name])
                except ma.ValidationError as err:
                    errors[name] = err.messages
        if errors:
            raise ma.ValidationError(errors)

    chain = ma.fields.String(required=True, validate=validate.OneOf(CHAINS))
    address = ma.fields.String(required=True, validate=[validate.Length(min=32, max=44), Pattern(
        rf"^({EVM_ADDRESS}|{SOLANA_ADDRESS})$")], metadata={"description": ADDRESS_DESCRIPTION + " The shape "
                                                                           "follows `chain`."})
    signature = ma.fields.String(required=True, validate=Pattern(
        r"^(0x[0-9a-fA-F]{130}|(base58:)?[1-9A-HJ-NP-Za-km-z]{64,88})$"), metadata={
        "description": "EVM chains: 0x-hex 65-byte signature. Solana: base58 64-byte signature (`base58:` prefix "
                       "optional; 422 when it is not the canonical base58 of 64 bytes). The shape follows `chain`."})
    nonce = ma.fields.String(validate=Pattern(r"^[0-9A-Za-z]{8,40}$"), metadata={
        "description": "Optional: which issued message was signed (default: the latest one for this chain/address)."})
    org_id = org_id_field(_ORG_WRITE + "; the message must have been issued with the same `org_id`")


class WalletSchema(ma.Schema):
    id = ma.fields.String(required=True)
    chain = ma.fields.String(required=True)
    address = ma.fields.String(required=True)
    connected = ma.fields.Boolean(required=True, dump_default=True)
    connected_at = ma.fields.DateTime(required=True)


class WalletBalanceSchema(ma.Schema):
    credits_cents = ma.fields.Integer(required=True)
    usdc = ma.fields.String(required=True, metadata={
        "description": "On-chain USDC of the connected wallet, six decimals; `0.000000` when none is connected."})
    chain = ma.fields.String(required=True, allow_none=True, metadata={"description": "null when no wallet is connected."})
    address = ma.fields.String(required=True, allow_none=True)
    connected = ma.fields.Boolean(required=True)


WalletFundHeadersSchema = idempotency_headers(
    "WalletFundHeadersSchema", "Optional, 1–128 characters: the funding happens once per "
    "key (Stripe's semantics: the same key and body answer the first response, another body is 409).")


class WalletFundSchema(InputSchema):
    amount_cents = amount_cents_field()
    method = ma.fields.String(required=True, validate=validate.OneOf(["card", "usdc", "ach"]))
    org_id = org_id_field("funds the organisation's balance with its own saved method or wallet (roles owner, "
                          "billing)")


class DepositSchema(ma.Schema):
    chain = ma.fields.String(required=True)
    chain_id = ma.fields.Integer(required=True)
    token = ma.fields.String(required=True, metadata={"description": "USDC contract address."})
    pay_to = ma.fields.String(required=True)
    from_ = ma.fields.String(required=True, data_key="from", attribute="from", metadata={"description": "The connected wallet; "
                                                                                       "transfers are attributed by sender."})
    amount_atomic = ma.fields.String(required=True, metadata={"description": "Exact amount in USDC atomic units (6 decimals)."})
    amount_usdc = ma.fields.String(required=True)
    reference = ma.fields.String(required=True, metadata={"description": "The payment id."})
    expires_at = ma.fields.DateTime(required=True)
    confirmations = ma.fields.Integer(required=True)


class WalletFundResultSchema(ma.Schema):
    payment_id = ma.fields.String(required=True, attribute="payment.id")
    method = ma.fields.String(required=True, attribute="payment.method")
    status = ma.fields.String(required=True, attribute="payment.status",
                              metadata={"description": "`succeeded` (card) or `pending` (ach, usdc)."})
    amount_cents = cents("payment.amount_micros")
    balance_cents = cents("balance_micros")
    deposit = ma.fields.Nested(DepositSchema, allow_none=True, required=True,
                               metadata={"description": "USDC deposit instructions (method `usdc` only)."})


class TransactionsQuerySchema(WalletQuerySchema):
    limit = QueryInteger(load_default=50, validate=validate.Range(min=1, max=200))
    cursor = ma.fields.String(validate=[validate.Length(max=18), Pattern(r"^[0-9]{1,18}$")],
                              metadata={"description": "`next_cursor` of the previous page."})


class TransactionSchema(ma.Schema):
    id = ma.fields.String(required=True)
    type = ma.fields.String(required=True, metadata={"description": "`credit` or `debit`."})
    kind = ma.fields.String(required=True, metadata={"description": "Ledger posting kind (payment, call_charge, refund, …)."})
    amount_cents = ma.fields.Integer(required=True, metadata={"description": "Signed; debits negative."})
    amount_micros = ma.fields.Integer(required=True, metadata={"description": "Signed, exact."})
    payment_id = ma.fields.String(required=True, allow_none=True)
    call_id = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "The module call (`call_…`, its receipt's call_id) or chat completion (`chatcmpl-…`) "
                       "the entry belongs to: charges, refunds, chat holds and settlements, and x402 payments."})
    created_at = ma.fields.DateTime(required=True)


class TransactionListSchema(ma.Schema):
    transactions = ma.fields.List(ma.fields.Nested(TransactionSchema), required=True)
    next_cursor = ma.fields.String(required=True, allow_none=True, metadata={"description": "Pass as `cursor` for the next page; null at the end."})
