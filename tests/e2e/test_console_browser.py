"""The console in a real browser (issue 19): Playwright driving Debian's Chromium against
a real gunicorn. A user signs in by the e-mailed link (the .eml the embedded default
writes), sees the balance and a chart, creates a key and sees it once (not after a
reload), uses it over HTTP, tops up through the sandbox checkout and sees the new
balance, creates an alert, visits every page and signs out. Screenshots of each page
(desktop and 375 px wide) are written to a temporary folder.

Chromium missing fails the test (never a skip): ``deploy/system-packages.sh`` installs it.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import timedelta
from email import message_from_bytes
from email.policy import default
from pathlib import Path

import requests

from tests.support.apps import app_env, gunicorn
from tests.support.procs import free_port

CHROMIUM = "/usr/bin/chromium"
# Screenshots of the flow go to a temporary folder (the committed ones of every page are
# `make screenshots`'s: tests/e2e/test_console_screenshots.py).
SHOTS = Path(tempfile.gettempdir()) / "gateway-console-flow-shots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def _signin_link(outbox: Path, email: str) -> str:
    for path in sorted(outbox.glob("*.eml"), key=lambda p: p.stat().st_mtime, reverse=True):
        msg = message_from_bytes(path.read_bytes(), policy=default)
        if msg["To"] == email and "sign-in" in msg["Subject"]:
            body = msg.get_body(preferencelist=("plain",)).get_content()
            return re.search(r"https?://\S+/login/confirm\?token=\S+", body).group(0)
    raise AssertionError(f"no sign-in mail for {email} in {outbox}")


def _seed_usage(app, account_id: str) -> None:
    """Some past days of usage, so the charts have bars (as the call path records them)."""
    from app.extensions import db
    from app.models.base import utcnow
    from tests import usage_seed

    with app.app_context():
        now = utcnow()
        for back, calls in ((1, 12), (3, 30), (6, 7), (10, 22), (17, 15), (25, 4)):
            usage_seed.record(account_id, "echo", spend_micros=calls * 10_000, calls=calls,
                         at=now - timedelta(days=back))
        db.session.commit()
        db.session.remove()


def test_console_in_chromium(app, make_account):
    assert os.path.exists(CHROMIUM), "Debian chromium is required (deploy/system-packages.sh installs it)"
    from playwright.sync_api import sync_playwright

    from app.extensions import db
    from app.models import Account

    acct = make_account()
    with app.app_context():
        email = db.session.get(Account, acct.id).email
        db.session.remove()
    _seed_usage(app, acct.id)
    outbox = Path(app.config["MAIL_OUTBOX_DIR"])
    port = free_port()
    env = app_env(app.config)
    env.update({"JOBS_INLINE": "1", "BASE_URL": f"http://127.0.0.1:{port}", "SMTP_URL": ""})
    SHOTS.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="gw-console-chromium-")
    try:
        with gunicorn(env, workers=1, port=port) as base, sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                            args=ARGS, viewport={"width": 1280, "height": 860})
            try:
                page = browser.new_page()

                def shot(name: str) -> None:
                    page.set_viewport_size({"width": 1280, "height": 860})
                    page.screenshot(path=str(SHOTS / f"{name}-desktop.png"), full_page=True)
                    page.set_viewport_size({"width": 375, "height": 740})
                    page.screenshot(path=str(SHOTS / f"{name}-375.png"), full_page=True)
                    width = page.evaluate("document.documentElement.scrollWidth")
                    assert width <= 375, f"{name}: page wider than 375 px ({width})"
                    page.set_viewport_size({"width": 1280, "height": 860})

                page.goto(base + "/")
                assert "Pay-per-call APIs" in page.inner_text("h1")
                shot("landing")
                page.click("text=Sign in or sign up")
                page.fill("#f-email", email)
                shot("login")
                page.keyboard.press("Enter")  # keyboard only
                page.wait_for_selector("text=Check your inbox")
                link = _signin_link(outbox, email)
                page.goto(link)
                shot("signin-button")
                page.click("button[type=submit]")
                page.wait_for_url(base + "/dashboard")
                assert page.inner_text("#balance") == "$10.00"
                assert page.locator("svg.spend rect.bar").count() == 30
                shot("dashboard")

                page.click("nav >> text=Keys")
                page.fill("#f-name", "browser key")
                page.click("text=Create key")
                secret = page.inner_text("#secret").strip()
                assert secret.startswith("svc_live_")
                shot("keys-created")
                page.goto(base + "/keys")  # reload: the secret is never shown again
                assert secret not in page.content() and page.locator("#secret").count() == 0
                assert page.locator("text=browser key").count() == 1
                shot("keys")
                # At 375 px the key table stacks into labelled rows: nothing scrolls sideways.
                page.set_viewport_size({"width": 375, "height": 740})
                assert page.evaluate("""() => [...document.querySelectorAll('.table-wrap')]
                    .every(w => w.scrollWidth <= w.clientWidth + 1)"""), "keys table scrolls at 375 px"
                page.set_viewport_size({"width": 1280, "height": 860})
                r = requests.get(base + "/api/account", headers={"Authorization": f"Bearer {secret}"}, timeout=10)
                assert r.status_code == 200 and r.json()["id"] == acct.id

                page.click("nav >> text=Billing")
                page.fill("#f-amount", "oops")
                page.click("text=Continue to checkout")
                assert "Enter an amount" in page.inner_text("#e-amount")
                page.fill("#f-amount", "25")
                page.click("text=Continue to checkout")
                page.wait_for_url(re.compile(r".*/pay/sandbox/checkout/.*"))
                page.click("button[value=pay]")
                page.wait_for_url(re.compile(r".*/billing\?checkout=success.*"))
                assert page.inner_text("#balance") == "$35.00"
                shot("billing")

                page.click("nav >> text=Alerts")
                page.fill("#f-name", "daily spend")
                page.fill("#f-threshold", "5")  # dollars: a $5.00 spend rule
                page.click("text=Create rule")
                page.wait_for_url(base + "/alerts")
                assert page.locator("td >> text=daily spend").count() == 1
                shot("alerts")

                page.click("nav >> text=Usage")
                page.click("text=7 days")
                page.wait_for_url(base + "/usage?days=7")  # the click navigates: count on the new page
                assert page.locator("svg.calls rect.bar").count() == 7
                shot("usage")
                page.click("nav >> text=Agents")
                page.fill("#f-name", "bad")
                page.fill("#f-pubkey", "not-a-key")
                page.click("button:has-text('Register')")
                assert "ed25519" in page.inner_text("#e-pubkey")
                shot("agents")

                page.click("text=Sign out")
                page.wait_for_selector("text=You are signed out")
                page.goto(base + "/dashboard")
                assert page.url.startswith(base + "/login")
            finally:
                browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
