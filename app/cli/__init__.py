"""Flask CLI: one group per area, registered in ``register_cli``.

One line per command (``module:attribute``), so areas added in parallel merge cleanly.
"""
from __future__ import annotations

from importlib import import_module

from flask import Flask

COMMANDS = [
    "app.cli.accounts:accounts_cli",
    "app.cli.ledger:ledger_cli",
    "app.cli.outbox:outbox_cli",
    "app.cli.jobs:worker_cmd",
    "app.cli.jobs:scheduler_cmd",
    "app.cli.alerts:alerts_cli",
    "app.cli.gateway:catalog_cli",
    "app.cli.gateway:calls_cli",
    "app.cli.gateway:receipts_cli",
    "app.cli.chat:chat_cli",
    "app.cli.payments:payments_cli",
    "app.cli.newsletter:newsletter_cli",
    "app.cli.modules:modules_cli",
    "app.cli.modules:settle_cmd",
]


def register_cli(app: Flask) -> None:
    for spec in COMMANDS:
        module, _, attr = spec.partition(":")
        app.cli.add_command(getattr(import_module(module), attr))
