"""``flask partitions``: monthly partitions of the call log and ledger legs (PostgreSQL)."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from app.services.platform import partitions

partitions_cli = AppGroup("partitions", help="Monthly partitions (PostgreSQL).")


@partitions_cli.command("ensure")
@click.option("--months", type=click.IntRange(min=0), default=None, help="Months ahead (default PARTITIONS_AHEAD_MONTHS).")
def ensure(months):
    """Create this month's and the coming months' partitions."""
    click.echo(json.dumps({"created": partitions.ensure_ahead(months)}))


@partitions_cli.command("prune")
@click.option("--months", type=click.IntRange(min=0), default=None,
              help="Retention in months (default CALL_LOG_RETENTION_MONTHS; 0 keeps everything).")
def prune(months):
    """Drop call-log months older than the retention (never the ledger)."""
    res = partitions.drop_expired(months)
    click.echo(json.dumps({"dropped": res.dropped, "kept_unfinished": res.kept_unfinished}))


@partitions_cli.command("list")
def list_():
    """The partitions of each partitioned table."""
    click.echo(json.dumps({t: [p.name for p in partitions.partitions(t)] for t in partitions.PARTITIONED}))
