"""``flask outbox …``: inspect and re-deliver e-mails and outgoing webhooks."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from app.extensions import db
from app.models import OutboxMessage
from app.services.platform import outbox

outbox_cli = AppGroup("outbox", help="Outgoing e-mails and webhooks.")


@outbox_cli.command("status")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True,
              help="How many failing messages to list (most recently created first).")
def status(limit):
    """What an operator needs when mail or webhooks do not arrive (JSON): counts by channel
    and status, the oldest message still pending and its age, and the failing messages
    (given up, or pending after a failed attempt) with their attempts and last error."""
    click.echo(json.dumps(outbox.status(limit), default=str))


@outbox_cli.command("sweep")
def sweep_cmd():
    """Enqueue every pending message that is due now."""
    click.echo(json.dumps({"enqueued": outbox.sweep()}))


@outbox_cli.command("redeliver")
@click.argument("message_id", required=False)
@click.option("--all-failed", is_flag=True, help="Re-arm every failed message.")
def redeliver(message_id, all_failed):
    """Re-arm a failed message (or all of them) and deliver again."""
    if not message_id and not all_failed:
        raise click.UsageError("give a MESSAGE_ID or --all-failed")
    n = outbox.redeliver(message_id, all_failed=all_failed)
    if message_id and not n:
        msg = db.session.get(OutboxMessage, message_id)
        if msg is None:
            raise click.ClickException(f"no outbox message {message_id}")
        raise click.ClickException(f"message {message_id} is {msg.status}, not failed: nothing to re-arm "
                                   "(a pending message is retried by the sweep on its own)")
    outbox.sweep()
    click.echo(json.dumps({"rearmed": n}))
