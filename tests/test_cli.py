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


def test_outbox_status_tells_what_is_stuck_and_why(app):
    """``flask outbox status`` printed only counts by channel and status: an operator told
    "webhooks are not arriving" could not see how long the oldest message has waited, nor
    which ones fail, to where, after how many attempts, with what error."""
    from datetime import timedelta

    from sqlalchemy import update

    from app.models import OutboxMessage
    from app.models.base import utcnow
    from app.services.platform import outbox

    with app.app_context():
        stuck = outbox.add_webhook("https://hooks.example.com/services/T0/B0/SECRETPATH", "alert.fired", {},
                                   source="alert_event:1", enqueue=False)
        gone = outbox.add_email("ops@example.com", "s", "t", enqueue=False)
        db.session.flush()
        long_ago = utcnow() - timedelta(hours=3)
        db.session.execute(update(OutboxMessage).where(OutboxMessage.id == stuck.id).values(
            attempts=3, last_error="ConnectionError: Max retries exceeded with url: /services/T0/B0/SECRETPATH",
            created_at=long_ago))
        db.session.execute(update(OutboxMessage).where(OutboxMessage.id == gone.id).values(
            status="failed", attempts=8, last_error="SMTP 550 mailbox unavailable"))
        db.session.commit()
        stuck_id, gone_id = stuck.id, gone.id
    res = _run(app, "outbox", "status")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["counts"]["webhook"]["pending"] >= 1 and report["counts"]["email"]["failed"] >= 1
    assert report["oldest_pending"]["age_seconds"] >= 3 * 3600 - 60
    failing = {m["id"]: m for m in report["failing"]}
    assert failing[stuck_id] | {"next_attempt_at": None} == {
        "id": stuck_id, "channel": "webhook", "status": "pending", "attempts": 3, "max_attempts": 8,
        "last_error": "ConnectionError: Max retries exceeded with url: /...",
        "destination": "https://hooks.example.com/...", "source": "alert_event:1",
        "created_at": failing[stuck_id]["created_at"], "next_attempt_at": None}
    assert failing[gone_id]["status"] == "failed" and failing[gone_id]["last_error"].startswith("SMTP 550")
    assert failing[gone_id]["destination"] == "ops@example.com"
    assert "SECRETPATH" not in res.output  # a chat/webhook URL is a credential: its host only, in the error too
    with app.app_context():  # leave nothing for the other tests' sweeps
        db.session.execute(update(OutboxMessage).where(OutboxMessage.id.in_((stuck_id, gone_id)))
                           .values(status="cancelled"))
        db.session.commit()


def test_negative_ages_and_month_counts_are_refused(app):
    """``--older-than -100`` (a chat hold, an x402 authorization) or ``--months -1`` was taken
    as given: ``chat release-stale-holds --older-than -100`` released every hold, those of
    requests still streaming included; bad input now changes nothing and says why."""
    for args in (("chat", "release-stale-holds", "--older-than", "-100"),
                 ("money", "resolve-x402", "--older-than", "-5"),
                 ("partitions", "ensure", "--months", "-1"),
                 ("partitions", "prune", "--months", "-1")):
        res = _run(app, *args)
        assert res.exit_code == 2 and "Invalid value" in res.output and "-" in res.output, (args, res.output)
