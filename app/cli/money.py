"""``flask money reconcile``: the ledger against every external book (Stripe events and
payments, x402 authorizations, chain deposits, chat holds); prints a JSON report and
exits 1 on any mismatch or stuck state (app/services/billing/money_check.py)."""
from __future__ import annotations

import json
import sys

import click
from flask.cli import AppGroup

from app.services.billing import money_check

money_cli = AppGroup("money", help="Money reconciliation.")


@money_cli.command("reconcile")
def reconcile():
    """Compare the ledger with every external book; exit 1 on any problem."""
    report = money_check.reconcile()
    click.echo(json.dumps(report, indent=2, default=str))
    if not report["ok"]:
        sys.exit(1)
