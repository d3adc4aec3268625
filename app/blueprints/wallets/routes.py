"""Wallet endpoints (SPEC 17–20) and the wallet-connect message."""
from app.auth import principal
from app.blueprints.routing import NOT_MEMBER, acting_account, endpoint
from app.blueprints.wallets.schemas import (ConnectMessageQuerySchema, ConnectMessageSchema, TransactionListSchema,
                                           TransactionsQuerySchema, WalletBalanceSchema, WalletConnectSchema,
                                           WalletFundHeadersSchema, WalletFundResultSchema, WalletFundSchema,
                                           WalletQuerySchema, WalletSchema)
from app.extensions import Blueprint
from app.services.billing import payments
from app.services.billing import wallets

# a billing member holds no organisation key: the organisation's wallet is reached with org_id
_NOT_MEMBER = {404: NOT_MEMBER}


blp = Blueprint("wallet", __name__, url_prefix="/api/wallet",
                description="On-chain wallet: connect, balance, funding and ledger transactions.")


@endpoint(blp, "/connect/message", "get", "billing:write", query=ConnectMessageQuerySchema,
          ok=ConnectMessageSchema, errors={**_NOT_MEMBER,
              422: "`unprocessable`: `address` is not one of `chain`'s (the other family's shape, an EIP-55 "
                   "checksum mismatch, base58 that does not decode to 32 bytes)."})
def connect_message(query):
    """Issue the message to sign for `POST /api/wallet/connect` (single use, expires). With
    `org_id` the message connects the organisation's wallet."""
    return wallets.connect_message(acting_account(query.get("org_id"), "billing:write"), query["chain"], query["address"])


@endpoint(blp, "/connect", "post", "billing:write", body=WalletConnectSchema, ok=WalletSchema,
          errors={**_NOT_MEMBER, 403: "`forbidden`: a test key (the wallet attributes live USDC deposits); "
                                      "`org_role_required`: the caller's role in `org_id`.",
                  401: "`signature_invalid`: the signature was not made by the address.",
                  409: "`conflict`: the address is connected to another account. `nonce_invalid`: no unused, "
                       "unexpired connect message for this chain and address (or the `nonce` given).",
                  422: "`unprocessable`: an EIP-55 checksum mismatch, or base58 that is not the canonical "
                       "spelling of a 32-byte address / 64-byte signature."})
def connect(body):
    """Attach a wallet by signing the issued message.

    The address and signature shapes follow `chain` (the schema says so per chain; 400
    otherwise). 409 `nonce_invalid`: no unused, unexpired message for this chain and
    address (replay, wrong chain, wrong address). 401 `signature_invalid`: the signature is
    not by the address. 409 `conflict`: the address belongs to another account. Connecting
    again replaces the account's wallet. Live keys only (403 for a `svc_test_` key): the
    wallet attributes real USDC deposits to the live balance. With `org_id` the organisation's
    wallet (its USDC deposits fund the organisation)."""
    p = principal()
    return wallets.connect(acting_account(body.get("org_id"), "billing:write"), body["chain"], body["address"], body["signature"],
                           body.get("nonce"), mode=p.mode)


@endpoint(blp, "/balance", "get", "billing:read", query=WalletQuerySchema, ok=WalletBalanceSchema,
          errors=_NOT_MEMBER)
def balance(query):
    """Credits and the connected wallet's on-chain USDC (read through the chain's JSON-RPC,
    cached for WALLET_BALANCE_CACHE_SECONDS). No wallet: `connected: false`, `chain: null`,
    `usdc: "0.000000"`. RPC down: 503 `service_unavailable`. With `org_id` the organisation's."""
    return wallets.balance(acting_account(query.get("org_id"), "billing:read"), principal().mode)


@endpoint(blp, "/transactions", "get", "billing:read", query=TransactionsQuerySchema, ok=TransactionListSchema,
          errors=_NOT_MEMBER)
def transactions(query):
    """Credits and debits of the account's balance from the ledger, newest first, paginated
    with `limit` (1–200, default 50) and `cursor`. With `org_id` the organisation's."""
    return wallets.transactions(acting_account(query.get("org_id"), "billing:read"), query["limit"], query.get("cursor"), principal().mode)


@endpoint(blp, "/fund", "post", "billing:write", body=WalletFundSchema, ok=WalletFundResultSchema,
          errors={402: "`card_declined`: the card was declined.",
                  403: "`forbidden`: `usdc` with a test key (the transfer is real USDC).",
                  409: "`no_payment_method`: no saved method of that kind; `wallet_not_connected`: "
                       "`usdc` without a connected wallet; `conflict`: `usdc` with a Solana wallet "
                       "(deposits are watched on EVM chains); `payment_method_invalid`: the saved method "
                       "can no longer be charged."}, headers=WalletFundHeadersSchema,
          idempotent=True)
def fund(body):
    """Add credits. `card`: charges the saved default card off-session; credits at once
    (no saved card → 409 `no_payment_method`; decline → 402 `card_declined`). `ach`: debits
    the saved bank account; `pending` until it settles (webhook). `usdc`: returns deposit
    instructions; the chain watcher credits the transfer once confirmed. With `org_id`
    the organisation's balance is funded (its own saved method or connected wallet). With
    an `Idempotency-Key` a retry never charges twice: the same key and body answer the
    first response (`Idempotent-Replayed: true`), another body is 409."""
    p = principal()
    payer = acting_account(body.get("org_id"), "billing:write")
    if body["method"] == "usdc":
        return wallets.fund_usdc(payer, p.mode, body["amount_cents"])
    return payments.fund_with_saved_method(payer, p.mode, body["amount_cents"], body["method"])
