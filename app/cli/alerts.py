"""``flask alerts …``: evaluate spend alerts now."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import click
from flask.cli import AppGroup

from app.services.billing import alerts

alerts_cli = AppGroup("alerts", help="Spend alerts.")


@alerts_cli.command("evaluate")
@click.option("--at", "at", help="Evaluate as of this ISO 8601 time (default: now, UTC).")
@click.option("--no-dispatch", is_flag=True, help="Record firings; leave delivery to the outbox sweep.")
def evaluate_cmd(at, no_dispatch):
    """Evaluate every alert once and fire those that are due."""
    now = None
    if at:
        try:
            now = datetime.fromisoformat(at)
        except ValueError:
            raise click.BadParameter("not an ISO 8601 date-time", param_hint="--at")
        if now.tzinfo is None:
            now = now.replace(tzinfo=timezone.utc)
    click.echo(json.dumps(alerts.evaluate_all(now, dispatch=not no_dispatch)))
