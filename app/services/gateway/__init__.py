"""Gateway: the metered module call (SPEC endpoint 1) and the module catalog.

Owns ``calls`` (idempotency, charge, forward, finalize, refund, sweep), ``catalog``
(YAML loading, listing, lookup cache), ``upstream`` (forwarding to providers) and
``receipts`` (canonical hash and ed25519 signature).

Transactions: a call commits twice (reserve+debit before forwarding, finalize after);
no transaction is open while the provider is called. ``catalog.load`` commits once.
"""
