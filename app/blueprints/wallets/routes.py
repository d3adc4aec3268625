"""Wallet endpoints (SPEC 17–20) and the wallet-connect message."""
from flask.views import MethodView

from app.auth import authenticated, principal
from app.blueprints.wallets.schemas import (ConnectMessageQuerySchema, ConnectMessageSchema, TransactionListSchema,
                                           TransactionsQuerySchema, WalletBalanceSchema, WalletConnectSchema,
                                           WalletFundResultSchema, WalletFundSchema, WalletSchema)
from app.extensions import Blueprint
from app.services.billing import payments
from app.services.billing import wallets

blp = Blueprint("wallet", __name__, url_prefix="/api/wallet",
                description="On-chain wallet: connect, balance, funding and ledger transactions.")


@blp.route("/connect/message")
class ConnectMessageView(MethodView):
    @authenticated("billing:write")
    @blp.arguments(ConnectMessageQuerySchema, location="query")
    @blp.response(200, ConnectMessageSchema)
    def get(self, query):
        """Issue the message to sign for `POST /api/wallet/connect` (single use, expires)."""
        return wallets.connect_message(principal().account_id, query["chain"], query["address"])


@blp.route("/connect")
class ConnectView(MethodView):
    @authenticated("billing:write")
    @blp.arguments(WalletConnectSchema)
    @blp.response(200, WalletSchema)
    @blp.alt_response(409, response="CONFLICT", description="The address is connected to another account.")
    def post(self, body):
        """Attach a wallet by signing the issued message.

        400 `nonce_invalid`: no unused, unexpired message for this chain and address (replay,
        wrong chain, wrong address). 401 `signature_invalid`: the signature is not by the
        address. 409 `conflict`: the address belongs to another account. Connecting again
        replaces the account's wallet."""
        return wallets.connect(principal().account_id, body["chain"], body["address"], body["signature"],
                               body.get("nonce"))


@blp.route("/balance")
class BalanceView(MethodView):
    @authenticated("billing:read")
    @blp.response(200, WalletBalanceSchema)
    def get(self):
        """Credits and the connected wallet's on-chain USDC (read through the chain's JSON-RPC,
        cached for WALLET_BALANCE_CACHE_SECONDS). No wallet: `connected: false`, `chain: null`,
        `usdc: "0.000000"`. RPC down: 503 `service_unavailable`."""
        return wallets.balance(principal().account_id)


@blp.route("/transactions")
class TransactionsView(MethodView):
    @authenticated("billing:read")
    @blp.arguments(TransactionsQuerySchema, location="query")
    @blp.response(200, TransactionListSchema)
    def get(self, query):
        """Credits and debits of the account's balance from the ledger, newest first, paginated
        with `limit` (1–200, default 50) and `cursor`."""
        return wallets.transactions(principal().account_id, query["limit"], query.get("cursor"))


@blp.route("/fund")
class FundView(MethodView):
    @authenticated("billing:write")
    @blp.arguments(WalletFundSchema)
    @blp.response(200, WalletFundResultSchema)
    @blp.alt_response(402, response="PAYMENT_REQUIRED", description="`card_declined`: the card was declined.")
    def post(self, body):
        """Add credits. `card`: charges the saved default card off-session; credits at once
        (no saved card → 400 `no_payment_method`; decline → 402 `card_declined`). `ach`: debits
        the saved bank account; `pending` until it settles (webhook). `usdc`: returns deposit
        instructions; the chain watcher credits the transfer once confirmed."""
        p = principal()
        if body["method"] == "usdc":
            return wallets.fund_usdc(p.account_id, p.mode, body["amount_cents"])
        return payments.fund_with_saved_method(p.account_id, p.mode, body["amount_cents"], body["method"])
