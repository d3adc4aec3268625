"""The one schedule of periodic work, run by ``flask scheduler``.

Each entry is (name, interval in seconds, job function): the function itself, so a
renamed or moved job breaks at import, and ``tests/test_wiring.py`` runs every entry once.
Features add their entries here. Every due entry is enqueued once per interval across
all scheduler processes (a Redis ``SET NX`` claim per slot), so running two schedulers
for availability is safe.
"""
from __future__ import annotations

from typing import Callable

from app.services.billing.x402.settlement import RECONCILE_EVERY_SECONDS
from app.tasks import (agents, alerts, billing, chain_watch, chat, gateway, maintenance, outbox, public, tokens,
                       usage, x402_sweep)

SCHEDULE: list[tuple[str, int, Callable]] = [
    ("flush-last-used", 60, maintenance.flush_last_used),
    ("watch-usdc-deposits", 30, chain_watch.watch_usdc_deposits),
    ("x402-reconcile", RECONCILE_EVERY_SECONDS, x402_sweep.reconcile_x402),
    ("outbox-sweep", 30, outbox.sweep),
    ("public-prune", 3600, public.prune),
    ("tokens-purge", 3600, tokens.purge),
    ("alerts-evaluate", 60, alerts.evaluate),
    # Auto top-up runs the balance trigger queued (and runs whose worker died).
    ("autotopup-start", 5, billing.start_autotopups),
    # Invoices (billing.invoices): credited payments without one (x402), then each month's usage.
    ("invoices-payments", 60, billing.issue_payment_invoices),
    ("invoices-usage", 3600, billing.issue_usage_invoices),
    # The sandbox's unpaid checkouts past their time: expired, as Stripe reports its own.
    ("sandbox-checkouts-expire", 60, billing.expire_sandbox_checkouts),
    ("calls-sweep", 30, gateway.sweep_pending_calls),
    ("idempotency-purge", 3600, gateway.purge_idempotency),
    # usage_hourly from the call logs: final hours, then the settled minutes of the
    # current ones, so readers aggregate a minute or two of the log (billing.usage_log)
    ("usage-roll", 60, usage.roll_usage),
    ("chat-release-stale-holds", 300, chat.release_stale_holds),
    ("heartbeat", 30, maintenance.heartbeat),
    # Monthly partitions (PostgreSQL): create the coming months; drop expired call-log months.
    ("partitions-ensure", 6 * 3600, maintenance.ensure_partitions),
    ("call-log-retention", 24 * 3600, maintenance.call_log_retention),
    # Rate counters in PostgreSQL (no Redis): rows whose windows have all ended.
    ("rate-windows-purge", 600, maintenance.rate_windows_purge),
    # Agents: settle the previous month once it is over (a no-op once settled); purge
    # expired sessions (sign-in nonces are single-use tokens: tokens-purge).
    ("agent-settlement", 6 * 3600, agents.settle_due),
    # Payouts of settled earnings: open due ones, send, retry failed, recover unbooked.
    ("payouts", 600, billing.run_payouts),
    ("agent-auth-purge", 3600, agents.purge_expired),
    # What reached a disabled agent's account (a refund of a call in flight when it was
    # disabled) goes back to its owner.
    ("agent-balances-return", 60, agents.return_disabled_balances),
]
