"""Secrets at rest (finding 6): after the flows that e-mail a capability (sign-up link,
newsletter confirmation and unsubscribe links, alert-target confirmation, console sign-in
link) are delivered,
no token issued during them is found in a full dump of the database (``pg_dump``) nor in
the captured logs."""
from __future__ import annotations

import logging
import subprocess

import pytest
from sqlalchemy.engine import make_url

from app.extensions import db
from app.services.platform import tokens


def full_dump(app) -> str:
    from app.services.platform import embedded_pg

    with app.app_context():
        url = make_url(str(db.engine.url)).set(drivername="postgresql")
        db.session.remove()
    # the wheel's pg_dump (PostgreSQL 18): a system one older than the server refuses to dump
    return subprocess.run([embedded_pg.tool("pg_dump"), "--data-only", "-d",
                           url.render_as_string(hide_password=False)],
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture
def issued(monkeypatch):
    """Every single-use and unsubscribe token handed out while the test runs."""
    seen: list[str] = []
    real_issue, real_unsub = tokens.issue, tokens.unsubscribe_token

    def issue(*args, **kwargs):
        seen.append(real_issue(*args, **kwargs))
        return seen[-1]

    def unsub(email):
        seen.append(real_unsub(email))
        return seen[-1]

    monkeypatch.setattr(tokens, "issue", issue)
    monkeypatch.setattr(tokens, "unsubscribe_token", unsub)
    return seen


@pytest.mark.parametrize("flow", ["signup", "newsletter", "alert_target", "console_signin"])
def test_capability_tokens_not_at_rest_or_logged(app, client, make_account, caplog, issued, flow):
    caplog.set_level(logging.DEBUG)
    if flow == "signup":
        assert client.post("/api/signup", json={"email": "new-user@example.com"}).status_code == 202
    elif flow == "console_signin":  # issue 42 item 6: the link was kept in the delivered row
        from app.services.accounts import console

        acct = make_account()
        with app.app_context():
            from app.models import Account

            console.request_link(db.session.get(Account, acct.id).email)
            db.session.remove()
    elif flow == "newsletter":
        assert client.post("/api/email/subscribe", json={"email": "reader@example.com"}).status_code == 202
    else:
        acct = make_account()
        r = client.post("/api/alerts", json={"name": "n", "metric": "calls", "op": ">", "threshold": 1,
                                             "window": "day", "channel": "email", "target": "boss@example.com"},
                        headers=acct.headers)
        assert r.status_code == 201 and r.get_json()["status"] == "pending_verification"
    assert issued, "the flow issued no token"
    dump, logs = full_dump(app), caplog.text
    assert 'INSERT INTO "outbox"' in dump or "COPY public.outbox" in dump  # sanity: a real dump
    for token in issued:
        assert token not in dump, f"{flow}: token found in the database dump"
        assert token not in logs, f"{flow}: token found in the logs"
