"""Screenshots of every console page at 1280 and 390 px (issue 40 item 7): `make screenshots`
writes them to docs/console/ (``CONSOLE_SCREENSHOTS=docs``); a plain test run writes them to a
temporary folder (the tree stays clean) and checks that no page scrolls sideways at 390 px.

The pages are the navigation's (a page added to it gets its screenshots) and the ones reached
from it; the account has usage, calls, chat completions, a key, an alert and an agent, and the
catalog is the demo one (``flask catalog load``) with the demo LLM's chat models."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

from tests.e2e.test_console_done import chat_server  # noqa: F401
from tests.e2e.test_console_issue40 import NARROW_CHECK, _chat, signed_in
from tests.support.apps import ROOT, app_env

SHOTS = (ROOT / "docs" / "console" if os.environ.get("CONSOLE_SCREENSHOTS") == "docs"
         else Path(tempfile.gettempdir()) / "gateway-console-shots")
WIDTHS = (1280, 390)


def _seed(app, account_id: str) -> str:
    from app.extensions import db
    from app.ids import new_id
    from app.models import ModuleCall
    from app.models.base import utcnow
    from app.services.agents import identity
    from app.services.billing import alerts
    from tests import usage_seed
    from tests.agentkit import Keypair

    subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "catalog", "load"], cwd=ROOT,
                   env=app_env(app.config), check=True, capture_output=True)
    with app.app_context():
        now = utcnow()
        for back, calls in ((1, 12), (3, 30), (6, 7), (10, 22), (17, 15), (25, 4)):
            usage_seed.record(account_id, "text", spend_micros=calls * 10_000, calls=calls, at=now - timedelta(days=back))
        call_id = None
        for i, (action, price) in enumerate((("word_count", 10_000), ("summary", 20_000))):
            call_id = new_id("call")
            db.session.add(ModuleCall(id=call_id, account_id=account_id, module_id=1, module_slug="text",
                                      action=action, mode="live", status="succeeded", price_micros=price,
                                      charged=True, ok=True, created_at=now - timedelta(minutes=9 - i),
                                      deadline_at=now, finished_at=now))
        _chat(account_id, 70, model="demo-mini", cost=123, tokens=(1200, 340))
        _chat(account_id, 71, model="demo-large", cost=48_211, tokens=(5400, 900), ago=timedelta(minutes=2))
        alerts.create_alert(account_id, name="daily spend", metric="spend_cents", op=">", threshold=500,
                            window="day", channel="email", target="me@example.com", mode="live")
        identity.register(account_id, name="research agent", pubkey=Keypair().pubkey, webhook=None)
        db.session.commit()
        db.session.remove()
    return call_id


def test_screenshots_of_every_page(app, chat_server, make_account):  # noqa: F811
    base = chat_server[0]
    acct = make_account()
    call_id = _seed(app, acct.id)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = signed_in(app, chat_server, acct.id)
    page.goto(base + "/keys")
    page.fill("#f-name", "laptop")
    page.fill("#f-spend_limit", "5")
    page.click("text=Create key")
    page.goto(base + "/dashboard")
    nav = page.eval_on_selector_all("header nav a", "as => as.map(a => a.getAttribute('href'))")
    pages = {"landing": "/", **{p.strip("/"): p for p in nav}, "call": f"/usage/calls/{call_id}",
             "not-found": "/no-such-page"}
    wide = []
    for name, path in pages.items():
        page.goto(base + path)
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 860})
            page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
            if width == 390 and page.evaluate(NARROW_CHECK):
                wide.append(name)
    page.goto(base + "/dashboard")
    page.click("text=Sign out")
    page.wait_for_selector("text=You are signed out")
    for name, path in (("signed-out", None), ("login", "/login")):
        if path:
            page.goto(base + path)
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 860})
            page.screenshot(path=str(SHOTS / f"{name}-{width}.png"), full_page=True)
    page.context.close()
    assert wide == []
    assert len(list(SHOTS.glob("*-390.png"))) >= len(pages) + 2
