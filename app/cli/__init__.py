"""Flask CLI: one group per area, registered in ``register_cli``.

One line per command (``module:attribute``), so areas added in parallel merge cleanly.
"""
from __future__ import annotations

import functools
from importlib import import_module

import click
from flask import Flask

from app.errors import DomainError

COMMANDS = [
    "app.cli.accounts:accounts_cli",
    "app.cli.ledger:ledger_cli",
    "app.cli.partitions:partitions_cli",
    "app.cli.money:money_cli",
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


def _domain_errors_as_usage_errors(command: click.Command) -> None:
    """Every command (and sub-command) reports a service's DomainError as
    ``Error: <code>: <message>`` with exit status 1, instead of a traceback."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _domain_errors_as_usage_errors(sub)
    if command.callback is None or getattr(command.callback, "_domain_errors_wrapped", False):
        return
    callback = command.callback

    @functools.wraps(callback)
    def wrapped(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except DomainError as err:
            raise click.ClickException(f"{err.code}: {err.message}") from None

    wrapped._domain_errors_wrapped = True
    command.callback = wrapped


def register_cli(app: Flask) -> None:
    for spec in COMMANDS:
        module, _, attr = spec.partition(":")
        command = getattr(import_module(module), attr)
        _domain_errors_as_usage_errors(command)
        app.cli.add_command(command)
