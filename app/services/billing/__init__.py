"""Billing: everything that moves money.

Owns the double-entry ledger (``ledger``: the only code that writes ledger rows and
cached balances), usage rollups (``usage``), chat holds (``holds``), payments and their
processors (``payments``, ``processors``), wallets and chains (``wallets``, ``chains``),
x402 pay-per-call (``x402``) and spend alerts (``alerts``).

Transactions: ``ledger`` and ``usage`` never commit (they join their caller's unit of
work); ``payments``, ``wallets``, ``x402``, ``holds`` and ``alerts`` entry points each
commit one unit of work (see docs/architecture.md, "The transaction rule").
"""
