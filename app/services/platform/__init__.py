"""Platform: shared primitives every domain uses.

Owns ``outbox`` (reliable e-mail and webhook delivery), ``mailer`` (RFC 5322 messages,
SMTP or ``.eml``), ``http`` (the one outbound HTTP layer: pooled, timeouts, no redirects,
capped bodies, connections pinned to the screened address), ``netguard`` (the SSRF
policy it enforces, also checked when a URL is registered), ``tokens`` (single-use and signed
tokens), ``crypto`` (canonical base58, ed25519, EVM signature recovery, Standard Webhooks
signing) and ``health`` (liveness and readiness).

Transactions: none of these commit on their own except the outbox delivery job, which
records each attempt in its own unit of work, and the token purge job.
"""
