"""``flask newsletter …``: list counts and list e-mails (each with one-click unsubscribe)."""
from __future__ import annotations

import json

import click
from flask.cli import AppGroup
from sqlalchemy import func, select

from app.extensions import db
from app.models import Subscription
from app.services.public import newsletter

newsletter_cli = AppGroup("newsletter", help="Newsletter lists.")


@newsletter_cli.command("status")
def status():
    """Subscriptions by list and status."""
    rows = db.session.execute(select(Subscription.list, Subscription.status, func.count())
                              .group_by(Subscription.list, Subscription.status)).all()
    click.echo(json.dumps({f"{lst}:{st}": n for lst, st, n in rows}, sort_keys=True))


@newsletter_cli.command("send")
@click.option("--list", "list_name", required=True, type=click.Choice(newsletter.LISTS),
              help="The list whose confirmed subscribers get the e-mail.")
@click.option("--subject", required=True, help="The e-mail's subject line.")
@click.option("--text-file", required=True, type=click.File("r", encoding="utf-8"),
              help="UTF-8 plain-text body ('-' for stdin).")
def send(list_name: str, subject: str, text_file):
    """Queue a plain-text e-mail to every confirmed subscriber of a list (outbox)."""
    click.echo(json.dumps({"queued": newsletter.send_to_list(list_name, subject, text_file.read())}))
