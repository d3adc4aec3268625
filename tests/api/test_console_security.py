"""Console security (issue 19): signed-out visitors are sent to /login, forms without the
CSRF token are refused, one account cannot read or act on another's pages or ids,
sign-in links are single use and expire, sessions end at sign-out, idle and absolute
timeouts; plus the console's headers and cookie flags."""
from __future__ import annotations

from pathlib import Path

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from app.extensions import db
from app.models import ApiKey
from app.models.base import utcnow
from app.models.tokens import SingleUseToken
from app.services.platform import tokens

_LINK = re.compile(r"/login/confirm\?token=([A-Za-z0-9_\-]+)")


def _mails(app, to: str) -> list[dict]:
    """The mails delivered to ``to``, oldest first, read from the ``.eml`` files the embedded
    default writes (the outbox row itself no longer holds a capability link once delivered)."""
    from email import message_from_bytes
    from email.policy import default

    folder = Path(app.config["MAIL_OUTBOX_DIR"])
    out = []
    for path in sorted(folder.glob("*.eml"), key=lambda p: p.stat().st_mtime_ns):
        msg = message_from_bytes(path.read_bytes(), policy=default)
        if msg["To"] == to:
            out.append({"text": msg.get_body(("plain",)).get_content(), "subject": msg["Subject"]})
    return out


def _csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)


def _request_link(app, client, email: str) -> str:
    page = client.get("/login").get_data(as_text=True)
    r = client.post("/login", data={"email": email, "csrf": _csrf(page)})
    assert r.status_code == 200 and "Check your inbox" in r.get_data(as_text=True)
    return _LINK.search(_mails(app, email)[-1]["text"]).group(1)


def _sign_in(app, client, email: str):
    token = _request_link(app, client, email)
    page = client.get("/login/confirm?token=" + token)
    assert page.status_code == 200
    r = client.post("/login/confirm", data={"token": token, "csrf": _csrf(page.get_data(as_text=True))})
    assert r.status_code == 303 and r.headers["Location"].endswith("/dashboard")
    return token


@pytest.fixture
def signed_in(app, make_account):
    """(client, account handle) of a signed-in console session."""
    def make():
        acct = make_account()
        with app.app_context():
            from app.models import Account
            email = db.session.get(Account, acct.id).email
            db.session.remove()
        client = app.test_client()
        _sign_in(app, client, email)
        acct.email = email
        return client, acct
    return make


PROTECTED_GET = ["/dashboard", "/keys", "/usage", "/usage?days=7", "/usage/calls/call_x", "/usage/export.csv",
                 "/billing", "/billing/invoices/inv_x.pdf", "/alerts", "/agents", "/activity",
                 "/activity/export.csv", "/models"]
# organisations and billing in the browser (issue 40 items 4 and 5)
PROTECTED_GET += ["/orgs", "/org/members", "/org/audit", "/org/audit.csv", "/billing/checkouts/x/resume"]
PROTECTED_POST = ["/logout", "/mode", "/keys", "/keys/key_x/revoke", "/keys/key_x/rotate", "/usage/calls/call_x/verify",
                  "/billing/topup", "/alerts", "/alerts/alrt_x/delete", "/agents", "/agents/agt_x/fund",
                  "/agents/agt_x/disable", "/agents/review/x"]
PROTECTED_POST += ["/orgs", "/orgs/switch", "/org/invites", "/org/invites/x/revoke", "/org/members/x",
                   "/org/members/x/remove", "/billing/card", "/billing/methods/x/default",
                   "/billing/methods/x/remove", "/billing/pay", "/billing/checkouts/x/cancel",
                   "/billing/wallet/message", "/billing/wallet/connect", "/billing/auto-topup",
                   "/billing/auto-topup/delete"]


def test_every_console_route_needs_a_session(app, client):
    console_rules = {r.rule for r in app.url_map.iter_rules() if r.endpoint.startswith("console.")}
    covered = {re.sub(r"\?.*", "", p) for p in PROTECTED_GET + PROTECTED_POST}
    normalized = {re.sub(r"<[^>]+>", "x", rule).replace("call_x", "x").replace("key_x", "x") for rule in console_rules}
    assert normalized - {re.sub(r"(call|key|alrt|agt|inv)_x", "x", p) for p in covered} == \
        {"/", "/login", "/login/confirm", "/invites/x", "/console/static/x", "/favicon.ico"}
    for path in PROTECTED_GET:
        r = client.get(path)
        assert r.status_code == 303 and "/login" in r.headers["Location"], path
    page = client.get("/login").get_data(as_text=True)
    for path in PROTECTED_POST:  # with a valid (pre-session) CSRF token: still no session
        r = client.post(path, data={"csrf": _csrf(page)})
        assert r.status_code == 303 and r.headers["Location"].endswith("/login"), path


def test_the_browser_finds_an_icon_and_logs_no_404(client):
    """Every browser asks for /favicon.ico on a site's first page; a 404 there is an error in
    the browser's console on every first visit. The pages name the icon, and the old path
    answers it too, signed out."""
    page = client.get("/").get_data(as_text=True)
    href = re.search(r'<link rel="icon" href="([^"]+)"', page).group(1)
    for path in (href, "/favicon.ico"):
        r = client.get(path)
        assert r.status_code == 200, path
        assert r.mimetype == "image/svg+xml" and r.get_data(as_text=True).lstrip().startswith("<svg"), path


def test_sign_in_link_is_single_use_and_the_get_uses_nothing(app, client, account):
    with app.app_context():
        from app.models import Account
        email = db.session.get(Account, account.id).email
    token = _request_link(app, client, email)
    for _ in range(2):  # a mail scanner's prefetch changes nothing
        assert client.get("/login/confirm?token=" + token).status_code == 200
    page = client.get("/login/confirm?token=" + token).get_data(as_text=True)
    assert client.post("/login/confirm", data={"token": token, "csrf": _csrf(page)}).status_code == 303
    other = app.test_client()
    page = other.get("/login").get_data(as_text=True)
    r = other.post("/login/confirm", data={"token": token, "csrf": _csrf(page)})
    assert r.status_code == 404 and "already used" in r.get_data(as_text=True)
    assert other.get("/login/confirm?token=" + token).status_code == 404
    assert other.get("/dashboard").status_code == 303


def test_expired_sign_in_link_is_refused(app, client, account):
    with app.app_context():
        from app.models import Account
        email = db.session.get(Account, account.id).email
    token = _request_link(app, client, email)
    with app.app_context():
        db.session.execute(update(SingleUseToken).where(SingleUseToken.purpose == tokens.CONSOLE_SIGNIN)
                           .values(expires_at=utcnow() - timedelta(seconds=1)))
        db.session.commit()
    page = client.get("/login").get_data(as_text=True)
    assert client.get("/login/confirm?token=" + token).status_code == 404
    assert client.post("/login/confirm", data={"token": token, "csrf": _csrf(page)}).status_code == 404
    assert client.get("/dashboard").status_code == 303


def test_unknown_address_same_answer_and_a_sign_up_link(app, client, account):
    page = client.get("/login").get_data(as_text=True)
    r = client.post("/login", data={"email": "nobody-here@example.com", "csrf": _csrf(page)})
    assert r.status_code == 200 and "Check your inbox" in r.get_data(as_text=True)
    mails = _mails(app, "nobody-here@example.com")
    assert len(mails) == 1 and "/signup/confirm?token=" in mails[0]["text"]
    assert "/login/confirm" not in mails[0]["text"]


def test_login_form_errors_next_to_the_field(client):
    page = client.get("/login").get_data(as_text=True)
    r = client.post("/login", data={"email": "not an address", "csrf": _csrf(page)})
    html = r.get_data(as_text=True)
    assert r.status_code == 400 and 'id="e-email"' in html and 'aria-invalid="true"' in html


def test_post_without_csrf_token_is_refused_and_changes_nothing(app, signed_in):
    client, acct = signed_in()
    with app.app_context():
        before = db.session.execute(select(ApiKey).where(ApiKey.account_id == acct.id)).scalars().all()
        db.session.remove()
    for data in ({"name": "x", "scopes": "modules:call"}, {"name": "x", "scopes": "modules:call", "csrf": "0" * 64}):
        r = client.post("/keys", data=data)
        assert r.status_code == 403 and "CSRF" in r.get_data(as_text=True)
    assert client.post("/logout").status_code == 403
    assert client.get("/dashboard").status_code == 200  # still signed in
    with app.app_context():
        after = db.session.execute(select(ApiKey).where(ApiKey.account_id == acct.id)).scalars().all()
    assert len(after) == len(before)


def _seed_call(app, account_id: str) -> str:
    """A finished call row of ``account_id`` (as the call path writes it)."""
    from app.ids import new_id
    from app.models.calls import ModuleCall

    with app.app_context():
        call_id = new_id("call")
        call = ModuleCall(id=call_id, account_id=account_id, module_id=1, module_slug="echo",
                          action="run", mode="live", status="succeeded", price_micros=10_000, charged=True,
                          ok=True, created_at=utcnow(), deadline_at=utcnow(), finished_at=utcnow())
        db.session.add(call)
        db.session.commit()
        db.session.remove()
    return call_id


def test_one_account_cannot_read_or_act_on_anothers_ids(app, signed_in, make_account):
    client_a, a = signed_in()
    client_b, b = signed_in()
    html = client_b.get("/keys").get_data(as_text=True)
    with app.app_context():
        key_a = db.session.execute(select(ApiKey).where(ApiKey.account_id == a.id)).scalars().first()
        key_a_id, key_a_prefix = key_a.id, key_a.prefix
        db.session.remove()
    assert key_a_prefix not in html
    r = client_b.post(f"/keys/{key_a_id}/revoke", data={"csrf": _csrf(html)})
    assert r.status_code == 404
    with app.app_context():
        assert db.session.get(ApiKey, key_a_id).revoked_at is None
        db.session.remove()
    # a call of A (made over the API) is not B's to read
    call_id = _seed_call(app, a.id)
    assert client_a.get(f"/usage/calls/{call_id}").status_code == 200
    assert client_b.get(f"/usage/calls/{call_id}").status_code == 404
    assert client_b.post(f"/usage/calls/{call_id}/verify",
                         data={"csrf": _csrf(html), "response": "{}"}).status_code == 404


def test_verify_page_says_not_valid_for_a_pasted_response_of_the_wrong_shape(app, signed_in):
    client, acct = signed_in()
    call_id = _seed_call(app, acct.id)
    html = client.get(f"/usage/calls/{call_id}").get_data(as_text=True)
    for pasted in ({"call_id": call_id, "receipt": "x"}, {"call_id": call_id, "receipt": {"v": 2}}):
        r = client.post(f"/usage/calls/{call_id}/verify", data={"csrf": _csrf(html), "response": json.dumps(pasted)})
        assert r.status_code == 200 and "Not valid" in r.get_data(as_text=True), pasted


def test_sign_out_ends_the_session_server_side(app, signed_in):
    client, _acct = signed_in()
    cookie = client.get_cookie("gw_console").value
    html = client.get("/dashboard").get_data(as_text=True)
    r = client.post("/logout", data={"csrf": _csrf(html)})
    assert r.status_code == 200 and "Signed out" in r.get_data(as_text=True)
    assert client.get("/dashboard").status_code == 303
    replay = app.test_client()
    replay.set_cookie("gw_console", cookie)  # the old cookie, kept by an attacker
    assert replay.get("/dashboard").status_code == 303


def test_absolute_and_idle_timeouts(app, signed_in, monkeypatch):
    client, _acct = signed_in()
    assert client.get("/dashboard").status_code == 200
    with app.app_context():
        db.session.execute(update(SingleUseToken).where(SingleUseToken.purpose == tokens.CONSOLE_SESSION)
                           .values(expires_at=utcnow() - timedelta(seconds=1)))
        db.session.commit()
    assert client.get("/dashboard").status_code == 303  # absolute timeout (server side)
    client, _acct = signed_in()
    from app.services.accounts import console
    monkeypatch.setattr(console, "idle_seconds", lambda: -1)  # any age is past the idle limit
    assert client.get("/dashboard").status_code == 303


def test_console_headers_and_cookie_flags(app, signed_in):
    client, _acct = signed_in()
    r = client.get("/dashboard")
    csp = r.headers["Content-Security-Policy"]
    assert "unsafe-inline" not in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["Cache-Control"] == "no-store"
    cookie = next(h for h in r.headers.getlist("Set-Cookie") if h.startswith("gw_console="))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "<style" not in r.get_data(as_text=True) and "<script" not in r.get_data(as_text=True)
    assert client.get("/console/static/console.css").status_code == 200


def test_session_cookie_secure_in_production(app):
    from app.blueprints.console import web

    with app.test_request_context("/"):
        app.config["APP_ENV"] = "production"
        try:
            assert web._secure() is True
        finally:
            app.config["APP_ENV"] = "test"
        assert web._secure() is False


def test_daily_series_from_rollups_is_zero_filled_and_per_mode(app, account):
    from app.services.billing import usage
    from tests import usage_seed

    with app.app_context():
        now = utcnow()
        usage_seed.record(account.id, "echo", spend_micros=30_000, calls=3, at=now - timedelta(days=2))
        usage_seed.record(account.id, "chat:m", spend_micros=5_000, error=True, at=now - timedelta(days=2))
        usage_seed.record(account.id, "echo", spend_micros=70_000, calls=7, mode="test", at=now)
        usage_seed.record(account.id, "echo", spend_micros=1, at=now - timedelta(days=40))  # out of range
        db.session.commit()
        days = usage.daily_rows(account.id, 30, now=now)
        assert len(days) == 30 and days[-1]["date"] == now.date()
        assert days[-3] == {"date": (now - timedelta(days=2)).date(), "calls": 4, "errors": 1,
                            "spend_micros": 35_000}
        assert sum(d["calls"] for d in days) == 4
        assert usage.daily_rows(account.id, 7, mode="test", now=now)[-1]["calls"] == 7
        db.session.remove()


def test_models_page_states_the_tokens_each_auto_cost_is_for(app, signed_in):
    """Each row of "What model: auto picks" states the prompt and completion tokens its cost is
    for: only the first row did, and the long prompt's cost (priced with 1,000 tokens out)
    disagreed with the 500 out a reader carried down from it."""
    from app.services.gateway.pricelist import AUTO_CASES

    client, _acct = signed_in()
    html = client.get("/models").get_data(as_text=True)
    table = re.search(r'<table class="stack auto-table">.*?</table>', html, re.S).group(0)
    cells = re.findall(r'<td data-label="Request">(.*?)</td>', table, re.S)
    assert len(cells) == len(AUTO_CASES)
    for cell, (_what, _needs, prompt, completion) in zip(cells, AUTO_CASES):
        assert f"{prompt:,} tokens in, {completion:,} out" in cell, cell


def test_models_page_shows_the_1_hour_cache_write_price_billing_uses(app, signed_in, monkeypatch, tmp_path):
    """The price list showed one cache write price, the 5-minute cache's, while a write to
    Anthropic's 1-hour cache is billed at ``cache_write_1h_usd_per_mtok`` (default 2× input):
    an Anthropic offer's row shows the price billing uses; an OpenAI-compatible provider is
    never sent a cache mark, so it has none (—)."""
    from tests.chatfakes import configured, running_fakes

    client, _acct = signed_in()
    with running_fakes() as f, configured(app, monkeypatch, tmp_path, f):
        html = client.get("/models").get_data(as_text=True)
    table = re.search(r'<table class="stack models-table">.*?</table>', html, re.S).group(0)
    assert '<th scope="col" class="num">Cache write (1 h)</th>' in table
    rows = {re.search(r"<code>(.*?)</code>", r).group(1) + "@" + re.search(r'data-label="Provider">(.*?)<', r).group(1):
            re.search(r'data-label="Cache write \(1 h\)" class="num">(.*?)</td>', r).group(1)
            for r in re.findall(r"<tr>.*?</tr>", table.split("<tbody>")[1], re.S)}
    assert rows["m-claude@claude"] == "$8"  # not in the catalog: 2 × its $4 input, as price_micros bills
    assert "—" in rows["m-big@pricey"]
