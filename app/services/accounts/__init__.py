"""Accounts: accounts with their promotional grant, API keys and self-serve sign-up.

Owns ``accounts`` (create, plans, admin flag, operator credits), ``keys`` (mint, list,
scoped creation, revocation) and ``signup`` (e-mail verification, then an account).

Transactions: every entry point commits one unit of work.
"""
