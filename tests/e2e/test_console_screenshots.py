"""Screenshots of every console page at 1280 and 390 px (issue 40 item 7): `make screenshots`
writes them to docs/console/ (``CONSOLE_SCREENSHOTS=docs``); a plain test run writes them to a
temporary folder (the tree stays clean) and checks that no page scrolls sideways at 390 px.

The pages are the navigation's (a page added to it gets its screenshots) and the ones reached
from it: a call, "Page not found", signed out, sign-in; acting for an organisation (with a
member and a pending invitation) its list, members, audit log and billing; the invitation
page; billing in test mode with a saved card, auto top-up and a pending checkout, the sandbox
checkout, and the wallet's message to sign; the account has usage, calls, chat completions, a key, an alert and an agent, and the
catalog is the demo one (``flask catalog load``, its modules answered by the demo provider)
with the demo LLM's chat models; the calls and completions are made over HTTP with a key."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import requests

from demo import provider as demo
from tests.e2e.test_console_a11y import fill_billing
from tests.e2e.test_console_done import chat_server  # noqa: F401
from tests.e2e.test_console_issue40 import NARROW_CHECK, signed_in
from tests.e2e.test_console_orgs_billing import _invite_link
from tests.support.apps import ROOT, app_env

SHOTS = (ROOT / "docs" / "console" if os.environ.get("CONSOLE_SCREENSHOTS") == "docs"
         else Path(tempfile.gettempdir()) / "gateway-console-shots")
WIDTHS = (1280, 390)


@contextmanager
def serve(app_):
    """The demo provider (a WSGI app) on a free loopback port, in a thread."""
    server = make_server("127.0.0.1", 0, app_, server_class=demo._ThreadingServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


DemoProvider = demo.app


def _seed(app, account_id: str, provider_url: str) -> None:
    """The demo catalog (its modules forward to the demo provider at ``provider_url``), past
    days of usage for the charts, an alert and an agent."""
    from app.extensions import db
    from app.models.base import utcnow
    from app.services.agents import identity
    from app.services.billing import alerts
    from tests import usage_seed
    from tests.agentkit import Keypair

    subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "catalog", "load"], cwd=ROOT,
                   env={**app_env(app.config), "DEMO_PROVIDER_URL": provider_url}, check=True, capture_output=True)
    with app.app_context():
        now = utcnow()
        for back, calls in ((1, 12), (3, 30), (6, 7), (10, 22), (17, 15), (25, 4)):
            usage_seed.record(account_id, "text", spend_micros=calls * 10_000, calls=calls, at=now - timedelta(days=back))
        alerts.create_alert(account_id, name="daily spend", metric="spend_cents", op=">", threshold=500,
                            window="day", channel="email", target="me@example.com", mode="live")
        identity.register(account_id, name="research agent", pubkey=Keypair().pubkey, webhook=None)
        db.session.commit()
        db.session.remove()


def _calls(base: str, key: str) -> str:
    """Two module calls and two chat completions over HTTP, as a client makes them; the id of
    the first module call."""
    bearer = {"Authorization": f"Bearer {key}"}
    first = None
    for body in ({"action": "word_count", "text": "one two three"}, {"action": "uppercase", "text": "hi"}):
        r = requests.post(base + "/v1/module/text/call", headers=bearer, json=body, timeout=30)
        assert r.status_code == 200, r.text
        first = first or r.json()["call_id"]
    for model in ("demo-mini", "auto"):
        r = requests.post(base + "/v1/chat/completions", headers=bearer, timeout=30, json={
            "model": model, "messages": [{"role": "user", "content": "Summarise the week in three lines"}]})
        assert r.status_code == 200, r.text
    return first


def test_screenshots_of_every_page(app, chat_server, make_account):  # noqa: F811
    base = chat_server[0]
    acct = make_account()
    SHOTS.mkdir(parents=True, exist_ok=True)
    with serve(DemoProvider) as provider_url:
        _seed(app, acct.id, provider_url)
        page = signed_in(app, chat_server, acct.id)
        page.goto(base + "/keys")
        page.fill("#f-name", "laptop")
        page.fill("#f-spend_limit", "5")
        page.click("text=Create key")
        call_id = _calls(base, page.inner_text("#secret").strip())
    page.goto(base + "/dashboard")
    nav = page.eval_on_selector_all("header nav a", "as => as.map(a => a.getAttribute('href'))")
    pages = {"landing": "/", **{p.strip("/"): p for p in nav}, "call": f"/usage/calls/{call_id}",
             "not-found": "/no-such-page"}
    wide = []

    def shoot(pg, name: str, path: str | None = None) -> None:
        """``path`` (or the page as it is) at both widths; a page scrolling sideways is noted."""
        if path:
            pg.goto(base + path)
        for width in WIDTHS:
            pg.set_viewport_size({"width": width, "height": 860})
            pg.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
            if width == 390 and pg.evaluate(NARROW_CHECK):
                wide.append(name)
        pg.set_viewport_size({"width": WIDTHS[0], "height": 860})

    for name, path in pages.items():
        shoot(page, name, path)
    shots = len(pages)
    # the pages reached from Organisations, acting for one (with a member and a pending invitation)
    page.goto(base + "/orgs")
    page.fill("#f-name", "Research team")
    page.click("text=Create organisation")
    page.wait_for_url(base + "/org/members")
    for email, role in (("dana@example.com", "developer"), ("lee@example.com", "billing")):
        page.fill("#f-email", email)
        page.select_option("#f-role", role)
        page.click("text=Send invitation")
        page.wait_for_selector(f"text=Invitation sent to {email}")
    invited = page.context.browser.new_context(viewport={"width": WIDTHS[0], "height": 860}).new_page()
    invited.goto(_invite_link(app, "dana@example.com"))
    invited.click("button[type=submit]")
    invited.wait_for_url(base + "/dashboard")
    invited.context.close()
    for name, path in (("orgs-chosen", "/orgs"), ("org-members", "/org/members"), ("org-audit", "/org/audit"),
                       ("org-billing", "/billing")):
        shoot(page, name, path)
    lee = page.context.browser.new_context(viewport={"width": WIDTHS[0], "height": 860}).new_page()
    lee.goto(_invite_link(app, "lee@example.com"))
    shoot(lee, "invite")
    lee.context.close()
    page.context.close()
    # billing in test mode with its sections: a saved card, auto top-up, a pending checkout
    page = signed_in(app, chat_server, acct.id, mode="test")
    page.goto(base + "/billing")
    fill_billing(page, "5")
    shoot(page, "checkout")
    shoot(page, "billing-test", "/billing")
    page.context.close()
    # connecting a wallet: the message to sign
    page = signed_in(app, chat_server, acct.id)
    page.goto(base + "/billing")
    page.fill("#f-address", "0x" + "5c" * 20)
    page.click("text=Get the message to sign")
    page.wait_for_selector("#sign-message")
    shoot(page, "billing-wallet")
    shots += 8
    page.goto(base + "/dashboard")
    page.click("text=Sign out")
    page.wait_for_selector("text=You are signed out")
    shoot(page, "signed-out")
    shoot(page, "login", "/login")
    page.context.close()
    assert wide == []
    assert len(list(SHOTS.glob("*-390.png"))) >= shots + 2
