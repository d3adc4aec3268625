"""Flask CLI: one group per area, registered in ``register_cli``."""
from __future__ import annotations

from flask import Flask


def register_cli(app: Flask) -> None:
    from app.cli.accounts import accounts_cli
    from app.cli.alerts import alerts_cli
    from app.cli.gateway import calls_cli, catalog_cli, receipts_cli
    from app.cli.jobs import scheduler_cmd, worker_cmd
    from app.cli.ledger import ledger_cli
    from app.cli.payments import payments_cli
    from app.cli.outbox import outbox_cli

    for command in (accounts_cli, ledger_cli, outbox_cli, worker_cmd, scheduler_cmd, alerts_cli):
        app.cli.add_command(command)
    app.cli.add_command(payments_cli)
    for command in (catalog_cli, calls_cli, receipts_cli):
        app.cli.add_command(command)
