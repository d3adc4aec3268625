"""Issue 42 item 7: mail cannot be aimed at outsiders. Every mail someone other than the
recipient can trigger (sign-up, console sign-in for an unknown or known address, alert
target and newsletter confirmations) counts against a per-recipient limit on the
canonical mailbox (``+tags`` and Gmail dots folded); past it the mail is dropped and the
request answered as usual."""
from __future__ import annotations

from sqlalchemy import func, select

from app.extensions import db
from app.models import OutboxMessage
from tests.api.test_console_security import _csrf


def _mails(app, like: str) -> int:
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(OutboxMessage).where(
            OutboxMessage.channel == "email", OutboxMessage.destination.ilike(like))).scalar_one()
        db.session.remove()
        return n


def test_console_signin_for_an_unknown_address(app, monkeypatch):
    monkeypatch.setitem(app.config, "PUBLIC_PAGE_RATE_LIMIT", "1000/minute")  # not the per-IP limit
    client = app.test_client()
    for i in range(12):
        page = client.get("/login").get_data(as_text=True)
        r = client.post("/login", data={"email": "victim@example.com", "csrf": _csrf(page)},
                        environ_base={"REMOTE_ADDR": f"10.9.0.{i}"})
        assert r.status_code == 200 and "Check your inbox" in r.get_data(as_text=True)
    assert _mails(app, "victim@example.com") == 3  # SIGNUP_EMAIL_RATE_LIMIT 3/hour


def test_console_signin_for_an_account(app, make_account, monkeypatch):
    from app.services.accounts import console

    monkeypatch.setattr(console, "RESEND_AFTER", console.RESEND_AFTER * 0)
    acct = make_account(email="owner@example.com")
    with app.app_context():
        for _ in range(8):
            console.request_link("owner@example.com")
        db.session.remove()
    assert acct and _mails(app, "owner@example.com") == 5  # CONSOLE_SIGNIN_EMAIL_RATE_LIMIT 5/hour


def test_alert_target_confirmations(app, client, make_account):
    account = make_account(plan="pro")
    for i in range(10):
        r = client.post("/api/alerts", json={"name": f"a{i}", "metric": "calls", "op": ">", "threshold": 1,
                                             "window": "day", "channel": "email",
                                             "target": f"boss+{i}@example.com"}, headers=account.headers)
        assert r.status_code == 201, r.get_json()
        assert client.delete(f"/api/alerts/{r.get_json()['id']}", headers=account.headers).status_code == 200
    assert _mails(app, "boss%@example.com") == 3  # ALERT_CONFIRM_EMAIL_RATE_LIMIT 3/hour


def test_signup_plus_tags_are_one_mailbox(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "SIGNUP_RATE_LIMIT", "1000/minute")
    codes = [client.post("/api/signup", json={"email": f"farm+{i}@example.com"}).status_code for i in range(5)]
    assert codes == [202, 202, 202, 429, 429]
    assert _mails(app, "farm%@example.com") == 3


def test_newsletter_plus_tags_are_one_mailbox(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "SUBSCRIBE_RATE_LIMIT", "1000/minute")
    for i in range(8):
        client.post("/api/email/subscribe", json={"email": f"f.a.r.m+{i}@gmail.com"})
    assert _mails(app, "%@gmail.com") == 5  # SUBSCRIBE_EMAIL_RATE_LIMIT 5/hour


def test_newsletter_confirmations_to_one_inbox_are_capped_per_day(app, client, monkeypatch):
    """Someone subscribing a stranger's address hour after hour (from many IPs) makes us
    send that inbox at most 10 confirmation mails a day (SUBSCRIBE_EMAIL_RATE_LIMIT
    5/hour;10/day), as console sign-in and alert-target mails are capped per day; before,
    5 every hour: 120 a day, every day."""
    import time
    from types import SimpleNamespace

    from app.services.platform import ratecount

    monkeypatch.setitem(app.config, "SUBSCRIBE_RATE_LIMIT", "1000/minute")
    clock = [(time.time() // 86400 + 1) * 86400 + 3600]  # tomorrow, 01:00 UTC: six hours of one day
    monkeypatch.setattr(ratecount, "time", SimpleNamespace(time=lambda: clock[0]))
    for hour in range(6):
        for i in range(5):
            client.post("/api/email/subscribe", json={"email": "stranger@example.com",
                                                      "list": ("launch", "product", "weekly")[i % 3]},
                        environ_base={"REMOTE_ADDR": f"10.7.{hour}.{i}"})
        clock[0] += 3600
    assert _mails(app, "stranger@example.com") == 10


def test_signup_mails_to_one_inbox_are_capped_per_day(app, client, monkeypatch):
    """Signing a stranger's address up hour after hour (from many IPs) makes us send that
    inbox at most 10 sign-up mails a day (SIGNUP_EMAIL_RATE_LIMIT 3/hour;10/day), as every
    other mail someone else can trigger is capped per day; until 2026-11-29 3 every hour, 72 a
    day, every day."""
    import time
    from types import SimpleNamespace

    from app.services.platform import ratecount

    monkeypatch.setitem(app.config, "SIGNUP_RATE_LIMIT", "1000/minute")
    clock = [(time.time() // 86400 + 1) * 86400 + 3600]  # tomorrow, 01:00 UTC: six hours of one day
    monkeypatch.setattr(ratecount, "time", SimpleNamespace(time=lambda: clock[0]))
    for hour in range(6):
        for i in range(3):
            client.post("/api/signup", json={"email": "signed.up.stranger@example.com"},
                        environ_base={"REMOTE_ADDR": f"10.8.{hour}.{i}"})
        clock[0] += 3600
    assert _mails(app, "signed.up.stranger@example.com") == 10
