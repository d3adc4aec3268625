"""``flask modules …`` (review of agent-built modules) and ``flask settle`` (monthly
settlement of agent earnings)."""
from __future__ import annotations

import getpass
import json
import sys

import click
from flask.cli import AppGroup, with_appcontext

from app.services.agents import builds
from app.services.money import settlement

modules_cli = AppGroup("modules", help="Review agent-built module submissions.")


def _reviewer() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # noqa: BLE001 - no login name in some containers
        return "cli"


def _review(sub) -> dict:
    """A submission as the review API shows it (``ReviewBuildSchema``)."""
    from app.blueprints.builds.schemas import ReviewBuildSchema

    return ReviewBuildSchema().dump(sub)


def _echo(obj) -> None:
    click.echo(json.dumps(obj, default=str))


@modules_cli.command("pending")
def pending():
    """List submissions waiting for review (JSON lines: slug, agent, price, actions, webhook)."""
    for sub in builds.pending():
        _echo(_review(sub))


@modules_cli.command("approve")
@click.argument("slug")
@click.option("--notes", default=None, help="Notes shown to the agent.")
def approve(slug, notes):
    """Approve the pending submission for SLUG (listed and callable at once)."""
    _echo(_review(builds.approve(slug, reviewer=_reviewer(), notes=notes)))


@modules_cli.command("reject")
@click.argument("slug")
@click.option("--reason", required=True, help="Why; shown to the agent as review_notes.")
def reject(slug, reason):
    """Reject the pending submission for SLUG."""
    _echo(_review(builds.reject(slug, reviewer=_reviewer(), reason=reason)))


@click.command("settle")
@click.option("--month", default=None, help="YYYY-MM (default: the previous month, UTC).")
@with_appcontext
def settle_cmd(month):
    """Settle module owners' earnings (agents and owner accounts) for MONTH: into their
    balances, or owed to their payout destination (idempotent; exits 1 if any owner failed
    — run again to retry those)."""
    month = month or settlement.previous_month()
    try:
        _echo(settlement.settle_month(month))
    except settlement.SettlementIncomplete as err:
        _echo(err.extra.get("summary"))
        click.echo(f"error: {err.message}", err=True)
        sys.exit(1)


@modules_cli.command("set-owner")
@click.argument("slug")
@click.argument("account_id")
def set_owner(slug, account_id):
    """Make ACCOUNT_ID (an account or organisation) the owner of catalog module SLUG: it
    earns the owner's 30 % share of the module's calls from now on."""
    from app.services.gateway import catalog

    _echo(catalog.set_owner_account(slug, account_id))
