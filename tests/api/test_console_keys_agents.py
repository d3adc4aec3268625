"""Console: keys with a spend limit and an expiry, rotation, the CSV export link and agent
funding (the issue-16 features as a person uses them in the browser's pages)."""
from __future__ import annotations

import csv
import io
import re

import pytest

from sqlalchemy import select

from app.extensions import db
from app.models import Account, ApiKey
from tests.agentkit import Keypair, register
from tests.api.test_console_security import _csrf, signed_in  # noqa: F401 - fixture
from tests.support.stacked import split_cells
from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401 - fixtures


def _key_row(app, key_id):
    with app.app_context():
        row = db.session.get(ApiKey, key_id)
        db.session.expunge(row)
        db.session.remove()
    return row


def test_create_key_with_limit_and_expiry_then_rotate(app, signed_in):
    client, acct = signed_in()
    page = client.get("/keys").get_data(as_text=True)
    r = client.post("/keys", data={"name": "limited", "scopes": ["call:write", "call:read"],
                                   "spend_limit": "2.50", "spend_limit_period": "day",
                                   "expires_in_days": "30", "csrf": _csrf(page)})
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and "only time it is shown" in html
    secret = re.search(r'id="secret">(svc_live_\w+)<', html).group(1)
    with app.app_context():
        row = db.session.execute(select(ApiKey).where(ApiKey.name == "limited")).scalar_one()
        key_id, limit, period, expires = row.id, row.spend_limit_micros, row.spend_limit_period, row.expires_at
        db.session.remove()
    assert (limit, period) == (2_500_000, "day") and expires is not None
    listing = client.get("/keys").get_data(as_text=True)
    assert "of $2.50 per day" in listing and secret not in listing  # shown once
    r = client.post(f"/keys/{key_id}/rotate", data={"csrf": _csrf(listing)})
    html = r.get_data(as_text=True)
    new_secret = re.search(r'id="secret">(svc_live_\w+)<', html).group(1)
    assert r.status_code == 200 and "rotated" in html and new_secret != secret
    assert _key_row(app, key_id).rotated_to is not None


def test_rotation_notice_gives_the_old_keys_own_end(app, signed_in):
    """Rotating never extends a key: one due to expire within the day stops then, not 24 hours
    later. The notice said "keeps working for 24 hours" whatever the old key's expiry; it
    gives the old key's end, as its row does."""
    from datetime import timedelta

    from app.models.base import utcnow

    client, acct = signed_in()
    page = client.get("/keys").get_data(as_text=True)
    client.post("/keys", data={"name": "soon", "scopes": ["call:write"], "csrf": _csrf(page)})
    ends = (utcnow() + timedelta(hours=2)).replace(second=0, microsecond=0)
    with app.app_context():
        row = db.session.execute(select(ApiKey).where(ApiKey.name == "soon")).scalar_one()
        row.expires_at, key_id = ends, row.id
        db.session.commit()
        db.session.remove()
    html = client.post(f"/keys/{key_id}/rotate", data={"csrf": _csrf(page)}).get_data(as_text=True)
    notice = re.search(r'<section class="card notice" id="new-key".*?</section>', html, re.S).group(0)
    assert "24 hours" not in notice
    assert f"until {ends:%Y-%m-%d %H:%M} UTC" in notice
    assert _key_row(app, key_id).expires_at.replace(tzinfo=None) == ends.replace(tzinfo=None)


def test_rotating_a_retiring_key_says_why_on_the_keys_page(app, signed_in):
    """The keys page offers Rotate on a retiring key too (it rotates again once its successor
    is revoked); while the successor works the service refuses (409 ``key_already_rotated``)
    and the page says so and what to do, minting nothing. It answered "Page not found"."""
    client, acct = signed_in()
    page = client.get("/keys").get_data(as_text=True)
    client.post("/keys", data={"name": "twice", "scopes": ["call:write"], "csrf": _csrf(page)})
    with app.app_context():
        key_id = db.session.execute(select(ApiKey.id).where(ApiKey.name == "twice")).scalar_one()
        db.session.remove()
    assert client.post(f"/keys/{key_id}/rotate", data={"csrf": _csrf(page)}).status_code == 200
    r = client.post(f"/keys/{key_id}/rotate", data={"csrf": _csrf(page)})
    html = r.get_data(as_text=True)
    assert r.status_code == 409 and "Page not found" not in html and 'id="secret"' not in html
    assert re.search(r'<p class="error" role="alert" id="rotate-error">[^<]*already rotated', html)
    with app.app_context():
        assert len(db.session.execute(select(ApiKey.id).where(ApiKey.name == "twice")).all()) == 2
        db.session.remove()


def test_bad_limit_is_shown_next_to_the_field_and_creates_nothing(app, signed_in):
    client, acct = signed_in()
    page = client.get("/keys").get_data(as_text=True)
    for bad in ("-5", "2.505", "five", "1e3"):
        r = client.post("/keys", data={"name": "bad", "scopes": ["call:read"], "spend_limit": bad,
                                       "csrf": _csrf(page)})
        assert r.status_code == 400 and 'id="e-spend_limit"' in r.get_data(as_text=True), bad
    with app.app_context():
        assert db.session.execute(select(ApiKey).where(ApiKey.name == "bad")).first() is None
        db.session.remove()


def test_usage_page_links_a_csv_export(app, client, signed_in, mod):
    browser, acct = signed_in()
    assert call(client, acct, {"action": "ok"}).status_code == 200
    html = browser.get("/usage").get_data(as_text=True)
    link = re.search(r'id="export" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    r = browser.get(link)
    assert r.status_code == 200 and r.mimetype == "text/csv"
    rows = list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))
    assert r.get_data(as_text=True).startswith("call_id,")
    assert [(row["module"], row["action"]) for row in rows] == [("svc", "ok")]


def test_fund_an_agent_once_per_form(app, client, signed_in):
    browser, acct = signed_in()
    agent = register(client, acct, Keypair(), name="funded").get_json()
    page = browser.get("/agents").get_data(as_text=True)
    key = re.search(r'name="fund_key" value="([^"]+)"', page).group(1)
    for _ in range(2):  # a double submit of the same form moves money once
        r = browser.post(f"/agents/{agent['id']}/fund",
                         data={"amount": "2.00", "fund_key": key, "csrf": _csrf(page)})
        assert r.status_code == 303
    with app.app_context():
        owner = db.session.get(Account, acct.id)
        agent_acct = db.session.execute(select(Account).where(Account.agent_id == agent["id"])).scalar_one()
        assert (owner.balance_micros, agent_acct.balance_micros) == (8_000_000, 2_000_000)
        db.session.remove()
    r = browser.post("/agents/agt_doesnotexist0000/fund",
                     data={"amount": "1", "fund_key": key + "x", "csrf": _csrf(page)})
    assert r.status_code == 404


def _balances(app, owner_id, agent_id):
    with app.app_context():
        owner = db.session.get(Account, owner_id)
        agent_acct = db.session.execute(select(Account).where(Account.agent_id == agent_id)).scalar_one()
        out = (owner.balance_micros, agent_acct.balance_micros)
        db.session.remove()
    return out


def test_fund_an_agent_in_dollars_exactly(app, client, signed_in):
    """The Fund field is in dollars, as every other money field of the console (it was in
    cents: "5" moved five cents); read exactly ("0.29" is 29 cents, where a float makes 28)."""
    browser, acct = signed_in()
    agent = register(client, acct, Keypair(), name="dollars").get_json()
    page = browser.get("/agents").get_data(as_text=True)
    field = re.search(r'<input id="fund-1" name="amount"[^>]*>', page).group(0)
    assert 'placeholder="USD"' in field and 'inputmode="decimal"' in field
    assert re.search(r'<label for="fund-1" class="sr">Amount \(USD\) for dollars</label>', page)
    for n, amount in enumerate(("0.29", "$1.5", "5")):
        r = browser.post(f"/agents/{agent['id']}/fund",
                         data={"amount": amount, "fund_key": f"k-{n}", "csrf": _csrf(page)})
        assert r.status_code == 303, amount
    assert _balances(app, acct.id, agent["id"]) == (10_000_000 - 6_790_000, 6_790_000)
    # at 390 px the row's cells stay one piece beside their label (Disable fell under "Fund")
    page = browser.get("/agents").get_data(as_text=True)
    assert split_cells(page) == [] and 'data-label="Fund or disable"' in page


@pytest.mark.parametrize("amount", ["0", "0.00", "-1", "2.505", "1e2", "0x10", "nan", "100000.01", " ", "1,000"])
def test_a_refused_funding_amount_says_dollars_and_moves_nothing(app, client, signed_in, amount):
    """Zero, negative, more than 2 decimals, exponents, past the transfer maximum: a 400
    naming the rule in dollars, and nothing moves."""
    browser, acct = signed_in()
    agent = register(client, acct, Keypair(), name="refused").get_json()
    page = browser.get("/agents").get_data(as_text=True)
    r = browser.post(f"/agents/{agent['id']}/fund", data={"amount": amount, "fund_key": "k", "csrf": _csrf(page)})
    assert r.status_code == 400
    text = r.get_data(as_text=True)
    assert "Fund “refused”: Enter an amount in dollars, more than 0 and at most 100,000, with at most 2 decimals" \
        in text
    assert _balances(app, acct.id, agent["id"]) == (10_000_000, 0)


def test_key_page_shows_the_key_controls(app, signed_in):
    client, acct = signed_in()
    from app.services.accounts import keys

    with app.app_context():
        row, _ = keys.mint(acct.id, "controlled", ["call:write"])
        keys.update_key(acct.id, row.id, {"allowed_models": ["m-big", "gpt-4o"], "allowed_modules": [],
                                          "rpm_limit": 30, "tpm_limit": 9000}, "live")
        db.session.remove()
    page = client.get("/keys").get_data(as_text=True)
    assert "Models: gpt-4o, m-big" in page and "Modules: none" in page
    assert "30 requests/min" in page and "9000 tokens/min" in page


def test_a_retiring_key_shows_the_rates_it_is_held_to(app, signed_in):
    """A retiring key counts under its successor's rpm/tpm: the page shows those, as the API
    does (docs/decisions.md "A retiring key's rates are its successor's")."""
    client, acct = signed_in()
    from app.services.accounts import keys

    with app.app_context():
        row, _ = keys.mint(acct.id, "old-one", ["call:write"])
        new, _ = keys.rotate_key(acct.id, row.id, 3600, creator_scopes=frozenset(["call:write"]), mode="live")
        keys.update_key(acct.id, new.id, {"rpm_limit": 7}, "live")
        db.session.remove()
    page = client.get("/keys").get_data(as_text=True)
    assert page.count("7 requests/min") == 2, page


def test_revoking_a_key_asks_first(app, signed_in):
    """Revoke is one click that stops every integration using the key and cannot be undone:
    its form asks for confirmation first (console.js: ``form[data-confirm]``; without script
    it still works, as every form)."""
    client, acct = signed_in()
    page = client.get("/keys").get_data(as_text=True)
    form = re.search(r'<form[^>]*action="/keys/[^"]+/revoke"[^>]*>', page).group(0)
    question = re.search(r'data-confirm="([^"]+)"', form).group(1)
    assert "Revoke" in question and "cannot be undone" in question
    script = client.get("/console/static/console.js").get_data(as_text=True)
    assert "form[data-confirm]" in script and "window.confirm" in script


def test_disable_an_agent_from_the_agents_page(app, client, signed_in):
    """The console's agents page disables an agent after asking (``agents.disable``): its
    balance comes back, the row shows it disabled with no fund form; another id is 404."""
    browser, acct = signed_in()
    agent = register(client, acct, Keypair(), name="retired").get_json()
    client.post(f"/api/agent/{agent['id']}/fund", json={"amount_cents": 250}, headers=acct.headers)
    page = browser.get("/agents").get_data(as_text=True)
    form = re.search(rf'<form[^>]*action="/agents/{agent["id"]}/disable"[^>]*>', page).group(0)
    assert "cannot be undone" in re.search(r'data-confirm="([^"]+)"', form).group(1)
    r = browser.post(f"/agents/{agent['id']}/disable", data={"csrf": _csrf(page)})
    assert r.status_code == 303
    with app.app_context():
        assert db.session.get(Account, acct.id).balance_micros == 10_000_000
        db.session.remove()
    page = browser.get("/agents").get_data(as_text=True)
    assert 'class="pill disabled"' in page and f"/agents/{agent['id']}/fund" not in page
    assert browser.post("/agents/agt_doesnotexist0000/disable", data={"csrf": _csrf(page)}).status_code == 404


def test_every_page_with_a_confirmation_loads_the_script_that_asks(app, client, signed_in):
    """A ``form[data-confirm]`` asks only if the page loads console.js: the agents page carried
    Disable's question without the script, so Disable went through at the first click."""
    browser, acct = signed_in()
    register(client, acct, Keypair(), name="asks")
    for path in ("/keys", "/agents"):
        page = browser.get(path).get_data(as_text=True)
        assert "data-confirm=" in page, path
        assert re.search(r'<script src="/console/static/console\.js[^"]*" defer>', page), path


def test_a_refused_funding_keeps_the_amount_typed_in_its_row(app, client, signed_in):
    """A malformed amount in an agent's Fund form answers the page with that row's field as
    typed, marked invalid and tied to the message (it came back empty, the message under the
    table naming no agent); another agent's field stays empty."""
    browser, acct = signed_in()
    first = register(client, acct, Keypair(), name="first").get_json()
    register(client, acct, Keypair(), name="second")
    page = browser.get("/agents").get_data(as_text=True)
    r = browser.post(f"/agents/{first['id']}/fund", data={"csrf": _csrf(page), "amount": "2.5O"})
    assert r.status_code == 400
    page = r.get_data(as_text=True)
    fields = re.findall(r'<input id="fund-\d+" name="amount"[^>]*>', page)
    assert len(fields) == 2
    typed = [f for f in fields if 'value="2.5O"' in f]
    assert len(typed) == 1 and 'aria-invalid="true"' in typed[0] and 'aria-describedby="e-fund"' in typed[0]
    assert re.search(r'<p class="error" id="e-fund" role="alert">[^<]*first', page)


def test_agents_page_writes_a_negative_accrual_as_an_amount(app, client, signed_in, monkeypatch):
    """After a late refund an agent's accrued earnings are negative until the next settlement
    repays the carry-over (docs/agents.md); the page wrote them "$-0.30". Amounts go through
    the console's one money filter: "-$0.30", and sub-cent shares keep their digits."""
    from app.services.agents import earnings

    browser, acct = signed_in()
    register(client, acct, Keypair(), name="refunded")
    real = earnings.agent_earnings

    def late_refund(agent, *args, **kwargs):
        return {**real(agent, *args, **kwargs), "accrued_micros": -300_000, "accrued_cents": -30,
                "settled_micros": 1_500, "settled_cents": 0}

    monkeypatch.setattr(earnings, "agent_earnings", late_refund)
    page = browser.get("/agents").get_data(as_text=True)
    assert "-$0.30 / $0.0015" in page and "$-" not in page


def test_agents_page_statement_says_what_repaid_a_carry_over(app, client, signed_in, monkeypatch):
    """A statement whose settlement repaid a carry-over (a refund after the previous month
    was settled) shows what reached the balance, and the repaid part apart (docs/agents.md)."""
    from datetime import datetime, timezone

    from app.services.agents import earnings

    browser, acct = signed_in()
    register(client, acct, Keypair(), name="repaid")
    real = earnings.agent_earnings

    def repaid(agent, *args, **kwargs):
        at = datetime(2026, 11, 1, 2, tzinfo=timezone.utc)
        return {**real(agent, *args, **kwargs), "settlements": [
            {"id": "stl_b", "month": "2026-10", "created_at": at, **earnings.statement_amounts(500_000, 300_000)},
            {"id": "stl_a", "month": "2026-09", "created_at": at, **earnings.statement_amounts(300_000, 0)}]}

    monkeypatch.setattr(earnings, "agent_earnings", repaid)
    page = browser.get("/agents").get_data(as_text=True)
    assert "2026-10: $0.20 <small" in page
    assert "($0.50 earned, $0.30 of it repaid a refund after settlement)" in page
    assert "2026-09: $0.30</span></td>" in page                     # nothing repaid: no note
