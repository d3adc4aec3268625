"""Agents: identities, sign-in, agent-built modules, earnings and settlement.

Owns ``identity`` (register, nonce, ed25519 sign-in, sessions), ``builds`` (submissions
and operator review), ``earnings`` (usage, earnings, leaderboard) and ``settlement``
(monthly revenue-share settlement, idempotent per agent and month).

Transactions: every entry point commits one unit of work; settlement commits one per
(agent, month).
"""
