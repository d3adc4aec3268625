"""Operator CLI: accounts, credits, plans, admin, ledger check."""
from __future__ import annotations

import json

from sqlalchemy import text

from app.extensions import db


def _run(app, *args):
    return app.test_cli_runner().invoke(args=list(args))


def test_accounts_create_prints_account_and_key(app, client):
    r = _run(app, "accounts", "create", "--email", "Ops@Example.com", "--plan", "pro")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert set(out) == {"account_id", "key"} and out["key"].startswith("svc_live_")
    acct = client.get("/api/account", headers={"Authorization": f"Bearer {out['key']}"}).get_json()
    assert acct["email"] == "ops@example.com" and acct["plan"] == "pro" and acct["balance_cents"] == 1000
    # e-mails are unique case-insensitively
    r = _run(app, "accounts", "create", "--email", "OPS@example.COM")
    assert r.exit_code != 0 and "conflict" in r.output
    r = _run(app, "accounts", "create", "--email", "not-an-email")
    assert r.exit_code != 0 and "invalid_request" in r.output


def test_grant_plan_admin_and_ledger_check(app, client, account):
    assert _run(app, "accounts", "grant-credits", account.id, "--cents", "250").exit_code == 0
    assert client.get("/api/account", headers=account.headers).get_json()["balance_cents"] == 1250
    assert _run(app, "accounts", "set-plan", account.id, "scale").exit_code == 0
    assert _run(app, "accounts", "set-plan", account.id, "gold").exit_code != 0
    r = _run(app, "accounts", "grant-admin", account.id)
    assert r.exit_code == 0 and json.loads(r.output)["is_admin"] is True
    r = _run(app, "ledger", "check")
    assert r.exit_code == 0 and json.loads(r.output)["ok"] is True
    with app.app_context():
        db.session.execute(text("UPDATE accounts SET balance_micros = 1 WHERE id = :i"), {"i": account.id})
        db.session.commit()
    r = _run(app, "ledger", "check")
    assert r.exit_code == 1 and json.loads(r.output)["ok"] is False


def test_every_operator_option_says_what_it_does(app):
    # `flask <group> <command> --help` is the operator's reference: `accounts create --email`,
    # `accounts create-key --name`, `accounts grant-credits --cents/--memo` and `newsletter
    # send`'s options printed a bare "--cents INTEGER [required]"
    import click

    third_party = {"db", "openapi", "routes", "run", "shell"}
    silent = []

    def walk(command, path):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, path + [name])
            return
        silent.extend(f"flask {' '.join(path)} {param.opts[-1]}" for param in command.params
                      if isinstance(param, click.Option) and not param.help)

    for name, command in app.cli.commands.items():
        if name not in third_party:
            walk(command, [name])
    assert not silent, f"options without help text: {silent}"


def test_outbox_redeliver_of_an_unknown_or_unfailed_message_says_so(app):
    # a mistyped MESSAGE_ID printed {"rearmed": 0} and exited 0, as if it had worked
    from app.models import OutboxMessage
    from app.services.platform import outbox

    unknown = _run(app, "outbox", "redeliver", "msg_nosuch")
    assert unknown.exit_code == 1 and "no outbox message msg_nosuch" in unknown.output
    with app.app_context():
        msg = outbox.add_email("to@example.com", "s", "t")
        db.session.commit()
        msg_id, msg_status = msg.id, db.session.get(OutboxMessage, msg.id).status
    pending = _run(app, "outbox", "redeliver", msg_id)
    assert pending.exit_code == 1 and f"is {msg_status}, not failed" in pending.output
