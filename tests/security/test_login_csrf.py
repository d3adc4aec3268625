"""Issue 42 item 8: login CSRF. A sign-in link requested for the attacker's account and
opened in the victim's browser must say whose console it opens before anything happens,
and every console page shows which address is signed in."""
from __future__ import annotations

import re

from app.extensions import db
from app.models import Account
from tests.api.test_console_security import _request_link, signed_in  # noqa: F401 - fixture


def _email(app, account_id) -> str:
    with app.app_context():
        email = db.session.get(Account, account_id).email
        db.session.remove()
        return email


def test_the_link_page_names_the_account_it_signs_into(app, make_account, signed_in):
    attacker = make_account()
    attacker_email = _email(app, attacker.id)
    token = _request_link(app, app.test_client(), attacker_email)
    victim_browser, victim = signed_in()
    page = victim_browser.get("/login/confirm?token=" + token)
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert re.search(r'id="signin-address">' + re.escape(attacker_email) + "<", html)
    assert f"Sign in as {attacker_email}" in html
    assert f"You are signed in as <strong>{victim.email}</strong>" in html  # the switch is spelt out


def test_every_console_page_shows_the_signed_in_address(signed_in):
    browser, acct = signed_in()
    for path in ("/dashboard", "/keys", "/usage", "/billing", "/alerts", "/agents"):
        html = browser.get(path).get_data(as_text=True)
        assert re.search(r'id="signed-in-as"[^>]*>' + re.escape(acct.email) + "<", html), path
