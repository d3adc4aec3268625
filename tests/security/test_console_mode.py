"""Issue 42 item 9: the console's admin review checks the mode as the API does (admin
routes take a live key of an admin account only): a console session switched to test
mode neither sees the review queue nor approves a build."""
from __future__ import annotations

from sqlalchemy import update

from app.extensions import db
from app.models import Account
from tests.agentkit import Keypair, register, session_headers
from tests.api.test_console_security import _csrf, signed_in  # noqa: F401 - fixture


def _pending_build(client, owner) -> str:
    kp = Keypair()
    register(client, owner, kp, webhook="http://127.0.0.1:9/a")
    r = client.post("/api/agent/build", json={"slug": "mode-bot", "price_cents": 2, "actions": ["go"],
                                              "webhook": "http://127.0.0.1:9/m", "description": "d"},
                    headers=session_headers(client, kp))
    assert r.status_code == 202
    return r.get_json()["slug"]


def _status(client, owner) -> str:
    return client.get("/api/agent/builds", headers=owner.headers).get_json()["builds"][0]["status"]


def test_test_mode_console_cannot_approve(app, client, signed_in):
    browser, acct = signed_in()
    with app.app_context():
        db.session.execute(update(Account).where(Account.id == acct.id).values(is_admin=True))
        db.session.commit()
        db.session.remove()
    slug = _pending_build(client, acct)
    page = browser.get("/agents").get_data(as_text=True)
    assert "Review queue" in page and slug in page  # live mode: the admin reviews
    browser.post("/mode", data={"mode": "test", "csrf": _csrf(page)})
    page = browser.get("/agents").get_data(as_text=True)
    assert "Review queue" not in page
    r = browser.post(f"/agents/review/{slug}", data={"decision": "approve", "csrf": _csrf(page)})
    assert r.status_code == 403 and _status(client, acct) == "pending_review"
    page = browser.get("/agents").get_data(as_text=True)
    browser.post("/mode", data={"mode": "live", "csrf": _csrf(page)})
    page = browser.get("/agents").get_data(as_text=True)
    r = browser.post(f"/agents/review/{slug}", data={"decision": "approve", "csrf": _csrf(page)})
    assert r.status_code == 303 and _status(client, acct) == "approved"
