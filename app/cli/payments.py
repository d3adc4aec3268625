"""``flask payments …``: sandbox ACH settlement, refunds and disputes, the USDC deposit watcher."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

payments_cli = AppGroup("payments", help="Payments: sandbox settlement/refunds/disputes, USDC watcher.")


def _echo(obj) -> None:
    if isinstance(obj, dict) and "payment" in obj:  # a Payment: shown as the API shows it
        from app.blueprints.payments.schemas import PaymentSchema

        obj = {**obj, "payment": PaymentSchema().dump(obj["payment"])}
    click.echo(json.dumps(obj, default=str))


@payments_cli.command("sandbox-settle")
@click.argument("payment_id")
@click.option("--fail", is_flag=True, help="Return the debit instead of settling it.")
def sandbox_settle(payment_id, fail):
    """Settle (or, with --fail, fail) a pending sandbox ACH payment: delivers the signed
    event through the webhook code, which credits the account once."""
    from app.services.billing import sandbox_checkout

    _echo(sandbox_checkout.sandbox_settle(payment_id, fail=fail))


@payments_cli.command("sandbox-refund")
@click.argument("payment_id")
@click.option("--cents", type=int, default=None, help="Refund this much more (default: everything).")
def sandbox_refund(payment_id, cents):
    """Refund a succeeded sandbox payment via a signed `charge.refunded` event."""
    from app.services.billing import sandbox_checkout

    _echo(sandbox_checkout.sandbox_refund(payment_id, cents))


@payments_cli.command("sandbox-dispute")
@click.argument("payment_id")
@click.option("--won", "outcome", flag_value="won", default=None, help="Close the dispute as won: funds reinstated.")
@click.option("--lost", "outcome", flag_value="lost", help="Close the dispute as lost.")
@click.option("--cents", type=int, default=None, help="Dispute this much (default: the whole payment).")
def sandbox_dispute(payment_id, outcome, cents):
    """Open a chargeback on a succeeded sandbox payment (signed `charge.dispute.created` and
    `funds_withdrawn` events: the credit is taken back), or close the open one with
    --won (`funds_reinstated`: given back) or --lost."""
    from app.services.billing import sandbox_checkout

    _echo(sandbox_checkout.sandbox_dispute(payment_id, outcome, cents))


@payments_cli.command("watch-usdc")
@click.option("--chain", default=None, help="Scan only this chain (default: chains with connected wallets).")
def watch_usdc(chain):
    """Scan once for confirmed USDC deposits and credit them (the scheduler runs this every 30 s)."""
    from app.services.billing import wallets
    from app.tasks.chain_watch import watch_usdc_deposits

    _echo(wallets.scan_chain(chain) if chain else watch_usdc_deposits())


@payments_cli.command("invoice-usage")
@click.option("--month", required=True, help="YYYY-MM: a month that is over.")
def invoice_usage(month):
    """Issue MONTH's usage invoices now (each account with live spend, once; the
    `invoices-usage` job does it for last month on its own)."""
    from app.services.billing import invoices
    from app.services.money.settlement import month_bounds
    from app.models.base import utcnow

    end = month_bounds(month)[1]
    if end > utcnow():
        raise click.UsageError(f"{month} is not over yet.")
    if invoices.calls_open_before(end):
        raise click.UsageError(f"calls of {month} are still pending (a refund would change its usage); "
                               "try again once the sweep has finished them.")
    from app.services.platform.uow import end_reads

    accounts = invoices.usage_accounts(month)
    end_reads()
    issued = [inv.number for account_id in accounts if (inv := invoices.issue_usage(account_id, month)) is not None]
    _echo({"month": month, "issued": issued})


@payments_cli.command("invoice-missing")
def invoice_missing():
    """Invoice the credited payments of the last 35 days that have none (what the
    `invoices-payments` job does every minute)."""
    from app.services.billing import invoices

    _echo({"issued": invoices.issue_missing()})
