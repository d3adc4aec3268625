"""Public endpoints across real processes: rate limits shared by two gunicorn workers
(Redis), every e-mail flow through a real RQ worker and SMTP server, and the
confirmation pages driven in Debian's headless chromium."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest
import requests

from tests.publichelpers import link_in, path_of, text_of, token_in
from tests.support.apps import app_env, flask_worker, gunicorn, smtp_server

needs_redis = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL")
CHROMIUM = "/usr/bin/chromium"


def _env(app, smtp_url, **extra):
    env = app_env(app.config)
    env.update({"SMTP_URL": smtp_url, "SALES_EMAIL": "sales@corp.example"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


@needs_redis
def test_rate_limits_shared_by_two_workers(app):
    with smtp_server() as (sink, url):
        env = _env(app, url, CONTACT_RATE_LIMIT="5/minute", CONTACT_EMAIL_RATE_LIMIT="100/hour",
                   TRACK_RATE_LIMIT="7/minute", JOBS_INLINE="1")
        with gunicorn(env, workers=2) as base:
            codes = []
            for i in range(12):  # a new connection each time: spread over both workers
                r = requests.post(base + "/api/contact", json={"email": f"p{i}@example.com", "message": "hi"},
                                  headers={"Connection": "close"}, timeout=10)
                codes.append(r.status_code)
            assert codes.count(202) == 5 and codes.count(429) == 7, codes
            assert codes[:5] == [202] * 5
            last = r.json()
            assert last["error"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
            track = [requests.post(base + "/api/track", json={"event": "x"}, headers={"Connection": "close"},
                                   timeout=10).status_code for _ in range(10)]
            assert track == [204] * 7 + [429] * 3
        assert len(sink.messages) == 5


def _wait_for_mail(sink, count, timeout=60.0):
    deadline = time.time() + timeout
    while len(sink.messages) < count and time.time() < deadline:
        time.sleep(0.05)
    assert len(sink.messages) >= count, [m["Subject"] for m in sink.messages]


@needs_redis
def test_all_mail_flows_through_rq_worker(app):
    with smtp_server() as (sink, url):
        env = _env(app, url, JOBS_INLINE="0")
        with gunicorn(env, workers=2) as base:
            s = requests.Session()
            assert s.post(base + "/api/signup", json={"email": "rq@example.com"}).status_code == 202
            assert s.post(base + "/api/email/subscribe", json={"email": "rq@example.com",
                                                                "list": "launch"}).status_code == 202
            c = s.post(base + "/api/contact", json={"email": "rq@example.com", "message": "Hello sales"})
            assert c.status_code == 202
            assert sink.messages == []  # queued in Redis: only a worker sends
            with flask_worker(env):
                _wait_for_mail(sink, 3)
                by_subject = {m["Subject"]: m for m in sink.messages}
                sales = by_subject["Contact form: rq@example.com"]
                assert sales["To"] == "sales@corp.example" and sales["Reply-To"] == "rq@example.com"
                signup_mail = next(m for m in sink.messages if "signup/confirm" in text_of(m))
                news_mail = next(m for m in sink.messages if "email/confirm" in text_of(m))
                assert news_mail["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
                r = s.post(base + "/api/signup/confirm", json={"token": token_in(signup_mail)})
                assert r.status_code == 201
                key = r.json()["key"]["key"]
                acct = s.get(base + "/api/account", headers={"Authorization": f"Bearer {key}"}).json()
                assert acct["balance_cents"] == 1000
                page = s.post(base + "/email/confirm", data={"token": token_in(news_mail)})
                assert page.status_code == 200 and "subscribed" in page.text
                _wait_for_mail(sink, 4)  # the welcome e-mail
            welcome = sink.messages[3]
            assert welcome["Subject"].startswith("You are subscribed")
            one_click = welcome["List-Unsubscribe"][1:-1]
            assert s.post(base + path_of(one_click), data="List-Unsubscribe=One-Click",
                          headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 200
            assert len(sink.messages) == 4


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian chromium not installed")
def test_confirmation_pages_in_headless_chromium(app):
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="gw-chromium-")
    try:
        with smtp_server() as (sink, url):
            env = _env(app, url, JOBS_INLINE="1")
            with gunicorn(env, workers=1) as base:
                env_base = base
                assert requests.post(base + "/api/signup", json={"email": "browser@example.com"}).status_code == 202
                assert requests.post(base + "/api/email/subscribe",
                                     json={"email": "browser@example.com"}).status_code == 202
                signup_link = next(link_in(m) for m in sink.messages if "signup/confirm" in text_of(m))
                news_link = next(link_in(m) for m in sink.messages if "email/confirm" in text_of(m))
                with sync_playwright() as pw:
                    browser = pw.chromium.launch_persistent_context(
                        profile, executable_path=CHROMIUM, headless=True,
                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                              "--disable-component-update", "--disable-sync", "--no-first-run"])
                    try:
                        page = browser.new_page()
                        page.goto(env_base + path_of(signup_link))
                        assert page.title() == "Create your account"
                        page.click("button[type=submit]")
                        page.wait_for_selector("#api-key")
                        assert page.title() == "Your account is ready"
                        key = page.inner_text("#api-key").strip()
                        # reload re-posts nothing useful: the key is never shown again
                        page.goto(env_base + path_of(signup_link))
                        assert page.title() == "Link not valid"
                        page.goto(env_base + path_of(news_link))
                        assert page.title() == "Confirm your subscription"
                        page.click("button[type=submit]")
                        page.wait_for_load_state()
                        assert page.title() == "You are subscribed"
                    finally:
                        browser.close()
                acct = requests.get(base + "/api/account", headers={"Authorization": f"Bearer {key}"}).json()
                assert acct["email"] == "browser@example.com" and acct["balance_cents"] == 1000
    finally:
        shutil.rmtree(profile, ignore_errors=True)
