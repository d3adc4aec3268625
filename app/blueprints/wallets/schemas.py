"""Schemas of the wallet (SPEC endpoints 17–20 and the connect message)."""
import marshmallow as ma
from marshmallow import validate

from app.blueprints.orgs.schemas import org_id_field
from app.blueprints.fields import InputSchema, Pattern, cents, idempotency_headers
from app.blueprints.payments.schemas import amount_cents_field
from app.services.billing.chains import CHAINS


class ConnectMessageQuerySchema(InputSchema):
    chain = ma.fields.String(required=True, validate=validate.OneOf(CHAINS))
    address = ma.fields.String(required=True, validate=[validate.Length(min=32, max=44), Pattern(r"^(0x[0-9a-fA-F]{40}|[1-9A-HJ-NP-Za-km-z]{32,44})$")], metadata={
        "description": "EVM: 0x + 40 hex (EIP-55 checked when mixed case). Solana: base58 32-byte key."})


class ConnectMessageSchema(ma.Schema):
    message = ma.fields.String(required=True, metadata={
        "description": "EIP-4361 text to sign: EIP-191 `personal_sign` for EVM chains, ed25519 over the "
                       "UTF-8 bytes for Solana."})
    nonce = ma.fields.String(required=True, metadata={"description": "Single use; embedded in `message`."})
    expires_at = ma.fields.DateTime(required=True)
    chain = ma.fields.String(required=True)
    address = ma.fields.String(required=True, metadata={"description": "Normalized (EIP-55 for EVM)."})


class WalletConnectSchema(InputSchema):
    chain = ma.fields.String(required=True, validate=validate.OneOf(CHAINS))
    address = ma.fields.String(required=True, validate=[validate.Length(min=32, max=44), Pattern(r"^(0x[0-9a-fA-F]{40}|[1-9A-HJ-NP-Za-km-z]{32,44})$")], metadata={
        "description": "EVM: 0x + 40 hex (EIP-55 checked when mixed case). Solana: base58 32-byte key."})
    signature = ma.fields.String(required=True, validate=Pattern(
        r"^(0x[0-9a-fA-F]{130}|(base58:)?[1-9A-HJ-NP-Za-km-z]{64,88})$"), metadata={
        "description": "EVM: 0x-hex 65-byte signature. Solana: base58 64-byte signature (`base58:` prefix optional)."})
    nonce = ma.fields.String(validate=Pattern(r"^[0-9A-Za-z]{8,40}$"), metadata={
        "description": "Optional: which issued message was signed (default: the latest one for this chain/address)."})


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
    "WalletFundHeadersSchema", "Optional, 1–128 characters (at most 256 bytes): the funding happens once per "
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


class TransactionsQuerySchema(InputSchema):
    limit = ma.fields.Integer(load_default=50, validate=validate.Range(min=1, max=200))
    cursor = ma.fields.String(validate=[validate.Length(max=18), Pattern(r"^[0-9]{1,18}$")],
                              metadata={"description": "`next_cursor` of the previous page."})


class TransactionSchema(ma.Schema):
    id = ma.fields.String(required=True)
    type = ma.fields.String(required=True, metadata={"description": "`credit` or `debit`."})
    kind = ma.fields.String(required=True, metadata={"description": "Ledger posting kind (payment, call_charge, refund, …)."})
    amount_cents = ma.fields.Integer(required=True, metadata={"description": "Signed; debits negative."})
    amount_micros = ma.fields.Integer(required=True, metadata={"description": "Signed, exact."})
    payment_id = ma.fields.String(allow_none=True)
    call_id = ma.fields.String(allow_none=True, metadata={
        "description": "The module call (`call_…`, its receipt's call_id) or chat completion (`chatcmpl-…`) "
                       "the entry belongs to: charges, refunds, chat holds and settlements, and x402 payments."})
    created_at = ma.fields.DateTime(required=True)


class TransactionListSchema(ma.Schema):
    transactions = ma.fields.List(ma.fields.Nested(TransactionSchema), required=True)
    next_cursor = ma.fields.String(required=True, allow_none=True, metadata={"description": "Pass as `cursor` for the next page; null at the end."})
