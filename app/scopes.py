"""Scopes: the table of credential scopes and what each allows (DESIGN §5)."""
from __future__ import annotations

SCOPES: dict[str, str] = {
    "call:read": "Read usage and call history (/api/usage/*).",
    "call:write": "Call modules (/v1/module/*/call) and chat completions.",
    "agent:read": "Read agents, builds, agent usage, earnings and the leaderboard.",
    "agent:write": "Register agents and submit agent-built modules.",
    "account:read": "Read the account (/api/account).",
    "keys:read": "List API keys.",
    "keys:write": "Create and revoke API keys.",
    "billing:read": "Read payments, wallet balance and wallet transactions.",
    "billing:write": "Start checkouts, save payment methods, connect and fund wallets.",
    "alerts:read": "List alerts and alert events.",
    "alerts:write": "Create and delete alerts.",
    "orgs:read": "Read the caller's organisations and their members (/api/orgs).",
    "orgs:write": "Create organisations, manage members, roles, budgets and invitations.",
    "analytics:read": "Read the product-analytics funnel (admins also: recent events, sessions).",
    "admin": "Admin routes (module review queue, /api/track/recent, /api/track/sessions): only on "
             "live keys of admin accounts, never granted by default.",
}
ADMIN_SCOPE = "admin"
# Every scope a key may name (validation).
KNOWN_SCOPES: tuple[str, ...] = tuple(SCOPES)
# The customer scopes: what a key gets by default ("all scopes"). ``admin`` is never implied:
# only an admin account can hold it, and only when asked for explicitly.
ALL_SCOPES: tuple[str, ...] = tuple(s for s in SCOPES if s != ADMIN_SCOPE)
# Agent sessions (svc_sess_) act for the agent: call modules, read their own data, see and
# hold their own money (account, wallet, funding, x402), submit builds. They cannot manage
# keys or alerts of the account.
SESSION_SCOPES: tuple[str, ...] = ("call:read", "call:write", "agent:read", "agent:write", "account:read",
                                  "billing:read", "billing:write")
