"""``flask accounts …``: operator commands for accounts and keys."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from app.scopes import ADMIN_SCOPE, ALL_SCOPES, KNOWN_SCOPES
from app.services.accounts import accounts
from app.services.accounts import keys

accounts_cli = AppGroup("accounts", help="Create accounts, grant credits, set plans and admins.")


def _resolve(account: str) -> str:
    if "@" in account:
        acct = accounts.find_by_email(account)
        if acct is None:
            raise click.ClickException(f"no account with e-mail {account}")
        return acct.id
    return accounts.get_account(account).id


@accounts_cli.command("create")
@click.option("--email", required=True, help="The account's e-mail (unique); sign-in links go there.")
@click.option("--plan", default=None, help="starter | pro | scale | enterprise")
@click.option("--admin", is_flag=True, help="Flag the account as admin.")
@click.option("--test-key", is_flag=True, help="Also mint a svc_test_ sandbox key.")
def create(email, plan, admin, test_key):
    """Create an account (with the 1,000-cent promotional grant) and a full-scope
    svc_live_ key (with scope admin for --admin); prints {"account_id": ..., "key": ...}."""
    acct = accounts.create_account(email, plan=plan, admin=admin)
    _, secret = keys.mint(acct.id, "default", ALL_SCOPES + ((ADMIN_SCOPE,) if admin else ()))
    out = {"account_id": acct.id, "key": secret}
    if test_key:
        out["test_key"] = keys.mint(acct.id, "sandbox", ALL_SCOPES, mode="test")[1]
    click.echo(json.dumps(out))


@accounts_cli.command("create-key")
@click.argument("account")
@click.option("--name", default="cli", show_default=True, help="Label shown in the key list.")
@click.option("--test", "test_mode", is_flag=True, help="Mint a svc_test_ sandbox key.")
@click.option("--scope", "scopes", multiple=True, help="Repeatable; default: all scopes.")
def create_key(account, name, test_mode, scopes):
    """Mint a key for ACCOUNT (id or e-mail); prints {"id": ..., "key": ...}."""
    bad = set(scopes) - set(KNOWN_SCOPES)
    if bad:
        raise click.ClickException(f"unknown scopes: {', '.join(sorted(bad))}")
    row, secret = keys.mint(_resolve(account), name, scopes or ALL_SCOPES,
                            mode="test" if test_mode else "live")
    click.echo(json.dumps({"id": row.id, "key": secret}))


@accounts_cli.command("grant-credits")
@click.argument("account")
@click.option("--cents", type=int, required=True, help="Amount in cents; negative to correct a balance down.")
@click.option("--memo", default=None, help="Why: kept on the ledger transaction (e.g. \"usdc <tx>\").")
def grant_credits(account, cents, memo):
    """Credit (or, negative, correct) ACCOUNT's balance through the ledger."""
    balance = accounts.grant_credits(_resolve(account), cents, memo)
    click.echo(json.dumps({"balance_cents": balance // 10_000}))


@accounts_cli.command("set-plan")
@click.argument("account")
@click.argument("plan")
def set_plan(account, plan):
    """Set ACCOUNT's plan."""
    acct = accounts.set_plan(_resolve(account), plan)
    click.echo(json.dumps({"account_id": acct.id, "plan": acct.plan}))


@accounts_cli.command("grant-admin")
@click.argument("account")
@click.option("--revoke", is_flag=True, help="Remove the admin flag instead.")
def grant_admin(account, revoke):
    """Flag ACCOUNT as admin (or remove the flag)."""
    acct = accounts.set_admin(_resolve(account), not revoke)
    click.echo(json.dumps({"account_id": acct.id, "is_admin": acct.is_admin}))
