"""``flask money reconcile``: the ledger against every external book (Stripe events and
payments, x402 authorizations, chain deposits, chat holds); prints a JSON report and
exits 1 on any mismatch or stuck state (app/services/billing/money_check.py).
``flask money resolve-x402`` runs the x402 reconciliation job (billing/x402/reconcile.py) at once."""
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


@money_cli.command("resolve-x402")
@click.option("--older-than", "older_than", type=click.IntRange(min=0), default=None,
              help="Seconds (default X402_RECONCILE_AFTER_SECONDS).")
def resolve_x402(older_than):
    """Run the x402 reconciliation job now: book settled-unbooked authorizations and
    resolve reserved ones older than --older-than (chain, else facilitator); prints counts."""
    from flask import current_app

    from app.services.billing import x402

    counts = x402.reconcile(older_than)
    click.echo(json.dumps(counts))
    if counts["pending"] and not current_app.config.get("X402_FACILITATOR_URL"):
        raise click.ClickException(
            f"{counts['pending']} x402 authorization(s) stay reserved: X402_FACILITATOR_URL is not set here, and "
            "only the facilitator (or the chain, RPC_URL_<CHAIN>) can resolve them. Set it to the facilitator "
            "the service uses (under `make run` a flask command finds it in instance/run-local.env while make "
            "run runs; in production load the service's environment first).")


@money_cli.command("payouts")
def run_payouts():
    """Run the payouts job now: open payouts for owners owed at least the minimum, send the
    due ones, retry failed ones and recover unbooked ones (billing/payouts.py)."""
    from app.services.billing import payouts

    click.echo(json.dumps(payouts.run(), default=str))
