"""Official Python client of the metered API gateway.

    from gateway_client import Gateway
    gw = Gateway(api_key="svc_live_…", base_url="http://127.0.0.1:8000")
    res = gw.call("weather", action="current", city="Paris")
    print(res.result, res.cost_cents, res.verify())

``Gateway`` (sync) and ``AsyncGateway`` (async) cover accounts, modules, keys, usage,
alerts and their firings, wallet (connecting one too), checkout, invoices, payment
methods, auto top-up, payouts, agents (their usage, builds, earnings and leaderboard),
organisations (members, invitations, audit log), provider keys (BYOK) and receipts;
``AgentSession`` (``AsyncAgentSession``) signs an agent in with its ed25519 key or its EVM
wallet (Sign-In-With-X); errors are ``ApiError`` subclasses (see gateway_client.errors).
"""
from gateway_client._async import AsyncGateway
from gateway_client._core import RetryPolicy
from gateway_client._sync import Gateway
from gateway_client._version import __version__
from gateway_client.agent import AgentSession, AsyncAgentSession, agent_pubkey, sign_nonce, wallet_pubkey
from gateway_client.errors import (ApiError, AuthenticationError, Conflict, GatewayError,
                                   InvalidRequest, NotFound, PaymentFailed, PaymentRequired,
                                   PermissionDenied, RateLimited, ReceiptInvalid, ServerError)
from gateway_client.models import (Account, Action, Agent, AgentDisabled, AgentUsage, Alert, AlertEvent,
                                   AuditEntry, AuditPage, CheckoutState, ConnectedWallet, ConnectMessage, ModelUsage,
                                   AutoTopup, AutoTopupRun, ByokSettings, Invite, Member, MemberRemoved, Org,
                                   ProviderKey, ProviderKeys,
                                   BillingDetails, Build, CallResult, Checkout, DailyUsage,
                                   DestinationRemoved, Earnings, Funding, Invoice, InvoiceBrief,
                                   InvoicePage, Key, KeyCreated, Leaderboard, LeaderboardEntry, Module,
                                   ModuleUsage, Payment, PaymentMethod, Payout, PayoutDestination,
                                   PayoutList, Receipt, ReceiptKey, Statement, Transaction,
                                   TransactionPage, UsageCurrent, WalletBalance, WalletFunding)

__all__ = [
    "Gateway", "AsyncGateway", "AgentSession", "AsyncAgentSession", "RetryPolicy", "__version__",
    "agent_pubkey", "sign_nonce", "wallet_pubkey", "GatewayError", "ApiError", "InvalidRequest", "AuthenticationError",
    "PaymentRequired", "PermissionDenied", "NotFound", "Conflict", "RateLimited",
    "ServerError", "ReceiptInvalid", "PaymentFailed", "Account", "Action", "Agent", "Alert",
    "CallResult", "Checkout", "DailyUsage", "Funding", "Key", "KeyCreated", "Module",
    "ModuleUsage", "Payment", "Receipt", "ReceiptKey", "Transaction", "TransactionPage", "UsageCurrent",
    "WalletBalance", "AgentDisabled", "BillingDetails", "Earnings", "AutoTopup", "AutoTopupRun", "Build",
    "DestinationRemoved", "Invoice", "InvoiceBrief", "InvoicePage", "Leaderboard", "LeaderboardEntry",
    "PaymentMethod", "Payout", "PayoutDestination", "PayoutList", "Statement", "WalletFunding",
    "AuditEntry", "AuditPage", "ByokSettings", "Invite", "Member", "MemberRemoved", "Org", "ProviderKey",
    "ProviderKeys", "AgentUsage", "AlertEvent", "CheckoutState", "ConnectedWallet", "ConnectMessage", "ModelUsage",
]
