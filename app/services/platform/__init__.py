"""Platform: shared primitives every domain uses.

Owns ``outbox`` (reliable e-mail and webhook delivery), ``mailer`` (RFC 5322 messages,
SMTP or ``.eml``), ``netguard`` (the SSRF policy), ``tokens`` (single-use and signed
tokens), ``crypto`` (canonical base58, ed25519, EVM signature recovery, Standard Webhooks
signing) and ``health`` (liveness and readiness).

Transactions: none of these commit on their own except the outbox delivery job, which
records each attempt in its own unit of work, and the token purge job.
"""
