"""The one schedule of periodic work, run by ``flask scheduler``.

Each entry is (name, interval in seconds, job path). Features add their entries here.
Every due entry is enqueued once per interval across all scheduler processes (a Redis
``SET NX`` claim per slot), so running two schedulers for availability is safe.
"""
from __future__ import annotations

SCHEDULE: list[tuple[str, int, str]] = [
    ("flush-last-used", 60, "app.tasks.maintenance.flush_last_used"),
    ("watch-usdc-deposits", 30, "app.tasks.chain_watch.watch_usdc_deposits"),
    ("book-orphan-x402", 300, "app.tasks.x402_sweep.book_orphan_x402_payments"),
    ("outbox-sweep", 30, "app.tasks.outbox.sweep"),
    ("public-prune", 3600, "app.tasks.public.prune"),
    ("tokens-purge", 3600, "app.tasks.tokens.purge"),
    ("alerts-evaluate", 60, "app.tasks.alerts.evaluate"),
    ("calls-sweep", 30, "app.tasks.gateway.sweep_pending_calls"),
    ("idempotency-purge", 3600, "app.tasks.gateway.purge_idempotency"),
    ("chat-release-stale-holds", 300, "app.tasks.chat.release_stale_holds"),
    ("heartbeat", 30, "app.tasks.maintenance.heartbeat"),
    # Agents: settle the previous month once it is over (a no-op once settled); purge
    # expired sessions.
    ("agent-settlement", 6 * 3600, "app.tasks.agents.settle_due"),
    ("agent-auth-purge", 3600, "app.tasks.agents.purge_expired"),
]
