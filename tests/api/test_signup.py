"""Self-serve sign-up: verification over real SMTP, account with the promo grant and a
first key shown once, single-use expiring tokens, no enumeration, limits."""
from __future__ import annotations

import re

from sqlalchemy import func, select

from app.extensions import db
from app.models import Account, ApiKey, SingleUseToken
from tests.publichelpers import link_in, mailed_tokens, path_of, smtp, strip_volatile, text_of, token_in
from tests.support.rows import expire

KEY_RE = re.compile(rb'<code id="api-key">(svc_live_[A-Za-z0-9]+)</code>')


def _accounts(app):
    with app.app_context():
        n = db.session.execute(select(func.count()).select_from(Account)).scalar_one()
        db.session.remove()
    return n


def test_signup_page_flow_creates_account_with_promo_and_key(app, client, ledger_clean):
    with smtp(app) as sink:
        r = client.post("/api/signup", json={"email": "New.User@Example.com"})
        assert r.status_code == 202 and r.get_json()["status"] == "pending"
        mail = sink.messages[0]
        assert mail["To"] == "new.user@example.com" and "10.00 USD" in text_of(mail)
        link = link_in(mail)
        token = token_in(mail)
    with app.app_context():
        stored = db.session.execute(select(SingleUseToken.token_hash)).scalar_one()
        db.session.remove()
    assert token not in stored and len(stored) == 64
    page = client.get(path_of(link))
    assert page.status_code == 200 and b"new.user@example.com" in page.data and b'method="post"' in page.data
    assert _accounts(app) == 0  # opening the link creates nothing
    done = client.post("/signup/confirm", data={"token": token})
    assert done.status_code == 200 and done.headers["Cache-Control"] == "no-store"
    key = KEY_RE.search(done.data).group(1).decode()
    acct = client.get("/api/account", headers={"Authorization": f"Bearer {key}"}).get_json()
    assert acct["email"] == "new.user@example.com" and acct["balance_cents"] == 1000
    # the key is shown once: the link is used up
    again = client.post("/signup/confirm", data={"token": token})
    assert again.status_code == 404 and b"svc_live_" not in again.data
    # a second press (double click, reload) is told the account exists and where to get a key,
    # not to sign up again (which would only mail "you already have an account")
    assert b"already created your account" in again.data and b'href="/login"' in again.data
    assert b"Sign up again" not in again.data
    assert b"Sign up again" in client.post("/signup/confirm", data={"token": "nope"}).data
    assert client.get(path_of(link)).status_code == 404
    with app.app_context():
        keys = db.session.execute(select(ApiKey)).scalars().all()
        assert len(keys) == 1 and key not in str([k.key_hash for k in keys])
        db.session.remove()
    ledger_clean()


def test_json_confirm_and_reuse(app, client, ledger_clean):
    token, = mailed_tokens(app, client, "/api/signup", "api@example.com")
    r = client.post("/api/signup/confirm", json={"token": token})
    assert r.status_code == 201
    j = r.get_json()
    assert j["account"]["balance_cents"] == 1000 and j["key"]["key"].startswith("svc_live_")
    assert set(j["key"]["scopes"]) >= {"keys:write", "call:write", "analytics:read"}
    reuse = client.post("/api/signup/confirm", json={"token": token})
    assert reuse.status_code == 404 and reuse.get_json()["error"] == "invalid_token"
    bogus = client.post("/api/signup/confirm", json={"token": "nope"})
    assert bogus.status_code == 404 and bogus.get_json()["error"] == "invalid_token"
    ledger_clean()


def test_expired_token(app, client):
    token, = mailed_tokens(app, client, "/api/signup", "slow@example.com")
    expire(app, SingleUseToken)
    assert client.get("/signup/confirm?token=" + token).status_code == 404
    r = client.post("/signup/confirm", data={"token": token})
    assert r.status_code == 404 and _accounts(app) == 0


def test_no_enumeration_and_existing_account_notice(app, client, make_account):
    make_account(email="taken@example.com")
    with smtp(app) as sink:
        fresh = client.post("/api/signup", json={"email": "fresh@example.com"})
        taken = client.post("/api/signup", json={"email": "taken@example.com"})
    assert strip_volatile(fresh) == strip_volatile(taken)
    by_to = {m["To"]: m for m in sink.messages}
    assert "already has an account" in text_of(by_to["taken@example.com"])
    # a way back in that works: the console sign-in, not a reply to the no-reply sender
    assert "/login" in text_of(by_to["taken@example.com"]) and "reply to" not in text_of(by_to["taken@example.com"])
    assert "token=" not in text_of(by_to["taken@example.com"])


def test_second_link_after_account_exists(app, client):
    t1, t2 = mailed_tokens(app, client, "/api/signup", "dup@example.com", times=2)
    assert client.post("/signup/confirm", data={"token": t2}).status_code == 200
    r = client.post("/signup/confirm", data={"token": t1})
    assert r.status_code == 409 and b"svc_live_" not in r.data
    assert _accounts(app) == 1
    assert client.post("/api/signup/confirm", json={"token": t1}).get_json()["error"] == "invalid_token"


def test_confirm_page_escapes_and_ignores_tracking_params(app, client):
    r = client.get('/signup/confirm?token=<script>alert(1)</script>&utm_source=mail')
    assert r.status_code == 404 and b"<script>" not in r.data
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]


def test_signup_rate_limits(app, client, monkeypatch):
    monkeypatch.setitem(app.config, "SIGNUP_EMAIL_RATE_LIMIT", "2/hour")
    monkeypatch.setitem(app.config, "SIGNUP_RATE_LIMIT", "4/minute")
    codes = [client.post("/api/signup", json={"email": "Target@example.com"},
                         environ_base={"REMOTE_ADDR": f"10.2.0.{i}"}).status_code for i in range(3)]
    assert codes == [202, 202, 429]
    codes = [client.post("/api/signup", json={"email": f"x{i}@example.com"},
                         environ_base={"REMOTE_ADDR": "10.2.1.1"}).status_code for i in range(5)]
    assert codes == [202, 202, 202, 202, 429]
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(SingleUseToken)).scalar_one() == 6
        db.session.remove()


def test_signup_validation(client):
    for body in ({}, {"email": "no"}, {"email": "a@example.com", "promo": 5000}):
        r = client.post("/api/signup", json=body)
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"


def test_concurrent_redemption_creates_one_account(app, ledger_clean):
    from concurrent.futures import ThreadPoolExecutor

    with smtp(app) as sink:
        app.test_client().post("/api/signup", json={"email": "race@example.com"})
        token = token_in(sink.messages[0])

    def redeem(_):
        return app.test_client().post("/api/signup/confirm", json={"token": token}).status_code

    with ThreadPoolExecutor(6) as pool:
        codes = sorted(pool.map(redeem, range(6)))
    assert codes == [201] + [404] * 5
    assert _accounts(app) == 1
    ledger_clean()
