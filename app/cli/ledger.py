"""``flask ledger check``: verify the ledger invariants; exits 1 on any violation."""
from __future__ import annotations

import json
import sys

import click
from flask.cli import AppGroup

from app.services.money import ledger

ledger_cli = AppGroup("ledger", help="Ledger checks.")


@ledger_cli.command("check")
def check():
    """Entries sum to zero, cached balances equal their entries, nothing negative."""
    violations = ledger.check()
    click.echo(json.dumps({"ok": not violations, "violations": [v.as_dict() for v in violations]}))
    if violations:
        sys.exit(1)
