"""Organisations and billing in the console (issue 40 items 4 and 5), through the Flask
test client: the switcher acts for the chosen payer, every role rule is the API's (a
developer sees no billing or invite controls and a forbidden POST is a 403 page naming the
role), the last owner stays, the audit log pages and downloads, and the billing forms (save
a card, pay with it once per form, cancel a checkout, auto top-up, connect a wallet) move
the payer's money through the services. The browser flows are
``tests/e2e/test_console_orgs_billing.py``."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest

from app.extensions import db
from tests.gateway_helpers import mod, provider, provider_server  # noqa: F401

pytestmark = pytest.mark.usefixtures("app")


def _csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)


class Console:
    """A test client signed in on the console as one account (a session minted as the
    console mints it; the e-mailed sign-in is ``test_console_security.py``'s)."""

    def __init__(self, app, account_id: str, mode: str = "live"):
        from app.blueprints.console import web
        from app.services.platform import tokens

        self.app, self.client = app, app.test_client()
        with app.app_context():
            token = tokens.issue(tokens.CONSOLE_SESSION, account_id, timedelta(hours=1))
            db.session.commit()
            self.client.set_cookie(web.COOKIE, web._serializer().dumps(token))
            db.session.remove()
        if mode == "test":
            self.client.set_cookie(web.MODE_COOKIE, "test")
        self.account_id = account_id

    def get(self, path: str, **kw):
        return self.client.get(path, **kw)

    def post(self, path: str, data: dict | None = None, page: str = "/dashboard"):
        html = self.get(page).get_data(as_text=True)
        return self.client.post(path, data={**(data or {}), "csrf": _csrf(html)})

    def create_org(self, name: str) -> str:
        r = self.post("/orgs", {"name": name})
        assert r.status_code == 303 and r.headers["Location"].endswith("/org/members")
        from app.blueprints.console import org_context

        return self.client.get_cookie(org_context.COOKIE).value


def _add_member(app, org_id: str, account_id: str, role: str) -> None:
    from app.services.orgs import orgs
    from app.services.orgs.audit import Actor
    from app.services.platform.uow import unit_of_work

    with app.app_context():
        with unit_of_work():
            orgs.add_member(org_id, account_id, role, Actor(account_id))
        db.session.remove()


def _acting_member(app, org_id: str, account_id: str, role: str) -> Console:
    """``account_id`` made a member with ``role``, signed in on the console acting for the org."""
    _add_member(app, org_id, account_id, role)
    person = Console(app, account_id)
    assert person.post("/orgs/switch", {"org_id": org_id}).status_code == 303
    return person


def _balance(app, account_id: str, mode: str = "live") -> int:
    from app.services.money import ledger

    with app.app_context():
        try:
            return ledger.cached_balance(account_id, mode)
        finally:
            db.session.remove()


def test_switcher_acts_for_the_org_and_shows_it_on_every_page(app, make_account):
    owner = Console(app, make_account().id)
    org_id = owner.create_org("Acme Robotics")
    for path in ("/dashboard", "/keys", "/usage", "/billing", "/alerts", "/org/members", "/orgs"):
        html = owner.get(path).get_data(as_text=True)
        assert 'id="acting-for"' in html and "Acme Robotics" in html, path
    # the organisation's balance (0, no promotional grant), not the person's $10.00
    assert '<p class="big" id="balance">$0.00</p>' in owner.get("/billing").get_data(as_text=True)
    # a key created while acting for it is an organisation key owned by the member
    owner.post("/keys", {"name": "org-key", "scopes": "call:read"}, page="/keys")
    with app.app_context():
        from app.models import ApiKey

        row = db.session.query(ApiKey).filter_by(name="org-key").one()
        assert (row.account_id, row.member_account_id) == (org_id, owner.account_id)
        db.session.remove()
    # back to the personal account
    r = owner.post("/orgs/switch", {"org_id": "", "next": "/billing"})
    assert r.status_code == 303
    html = owner.get("/billing").get_data(as_text=True)
    assert 'id="acting-for"' not in html and '<p class="big" id="balance">$10.00</p>' in html


def test_switching_to_an_org_one_is_not_a_member_of_is_404_and_a_stale_choice_is_dropped(app, make_account):
    from app.blueprints.console import org_context

    owner, other = Console(app, make_account().id), Console(app, make_account().id)
    org_id = owner.create_org("Private")
    assert other.post("/orgs/switch", {"org_id": org_id}).status_code == 404
    other.client.set_cookie(org_context.COOKIE, org_id)  # a forged cookie changes nothing
    html = other.get("/billing").get_data(as_text=True)
    assert "Private" not in html and '<p class="big" id="balance">$10.00</p>' in html
    assert other.get("/org/members").status_code == 303  # no organisation chosen: to the list


def test_developer_sees_no_billing_or_invite_controls_and_forbidden_posts_name_the_role(app, make_account):
    owner = Console(app, make_account().id)
    org_id = owner.create_org("Roles Inc")
    dev_acct = make_account()
    _add_member(app, org_id, dev_acct.id, "developer")
    dev = Console(app, dev_acct.id)
    assert dev.post("/orgs/switch", {"org_id": org_id}).status_code == 303
    assert "Create rule" not in dev.get("/alerts").get_data(as_text=True)  # alerts:write: owner, admin, billing
    assert "Create key" in dev.get("/keys").get_data(as_text=True)  # keys:write: a developer builds
    members = dev.get("/org/members").get_data(as_text=True)
    assert "Invite someone" not in members and "Pending invitations" not in members
    assert "Top up the organisation" not in members and 'name="role"' not in members
    billing = dev.get("/billing")
    assert billing.status_code == 403 and "your role is developer" in billing.get_data(as_text=True)
    for path, data in (("/billing/topup", {"amount": "10"}), ("/billing/card", {"payment_method_id": "pm_card_visa"}),
                       ("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "100"}),
                       ("/org/invites", {"email": "x@example.com", "role": "viewer"}),
                       (f"/org/members/{owner.account_id}", {"role": "viewer"}),
                       (f"/org/members/{owner.account_id}/remove", {}),
                       ("/alerts", {"name": "a"})):
        r = dev.post(path, data)
        text = r.get_data(as_text=True)
        assert r.status_code == 403 and "your role is developer" in text, path
    assert dev.get("/org/audit").status_code == 403
    assert dev.get("/org/audit.csv").status_code == 403
    # any member may leave: back on the personal account
    left = dev.post(f"/org/members/{dev_acct.id}/remove", page="/org/members")
    assert left.status_code == 303 and left.headers["Location"].endswith("/orgs")
    assert 'id="acting-for"' not in dev.get("/dashboard").get_data(as_text=True)
    with app.app_context():
        from app.services.orgs import orgs

        assert orgs.member_role(org_id, dev_acct.id) is None
        db.session.remove()
    # a billing member pays but does not manage members
    bill_acct = make_account()
    bill = _acting_member(app, org_id, bill_acct.id, "billing")
    assert "Save card" in bill.get("/billing").get_data(as_text=True)
    assert bill.post("/org/invites", {"email": "y@example.com", "role": "viewer"}).status_code == 403
    keys = bill.get("/keys").get_data(as_text=True)
    assert "Create key" not in keys and "Rotate" not in keys  # a billing member changes no key


def test_the_dashboard_offers_top_up_only_to_those_who_may_pay(app, make_account):
    """The dashboard's "Top up" link is for owners and billing members (``billing:write``):
    until 2026-11-29 every role saw it, and a developer who followed it got a 403 page, an
    admin or viewer a billing page with nothing to pay."""
    owner = Console(app, make_account().id)
    org_id = owner.create_org("Payers Ltd")
    assert "Top up</a>" in owner.get("/dashboard").get_data(as_text=True)
    for role, shown in (("billing", True), ("admin", False), ("developer", False), ("viewer", False)):
        acct = make_account()
        _add_member(app, org_id, acct.id, role)
        person = Console(app, acct.id)
        assert "Top up</a>" in person.get("/dashboard").get_data(as_text=True)  # their own account
        person.post("/orgs/switch", {"org_id": org_id})
        html = person.get("/dashboard").get_data(as_text=True)
        assert 'id="acting-for"' in html and ("Top up</a>" in html) is shown, role


def test_a_developer_sees_and_changes_only_their_own_organisation_keys(app, make_account):
    """The console's keys page applies the API's rule (``orgs.own_items_only`` /
    ``orgs.keys_of``): owners and admins every key of the organisation, a developer theirs."""
    from app.models import ApiKey

    owner = Console(app, make_account().id)
    org_id = owner.create_org("Keys Inc")
    dev_acct = make_account()
    dev = _acting_member(app, org_id, dev_acct.id, "developer")
    owner.post("/keys", {"name": "owner-key", "scopes": "call:read"}, page="/keys")
    dev.post("/keys", {"name": "dev-key", "scopes": "call:read"}, page="/keys")
    with app.app_context():
        ids = {row.name: row.id for row in db.session.query(ApiKey).filter_by(account_id=org_id)}
        db.session.remove()
    assert ids.keys() == {"owner-key", "dev-key"}
    mine, theirs = dev.get("/keys").get_data(as_text=True), owner.get("/keys").get_data(as_text=True)
    assert "dev-key" in mine and "owner-key" not in mine
    assert "dev-key" in theirs and "owner-key" in theirs
    assert dev.post(f"/keys/{ids['owner-key']}/revoke", page="/keys").status_code == 404
    assert dev.post(f"/keys/{ids['dev-key']}/revoke", page="/keys").status_code == 303
    with app.app_context():
        rows = db.session.query(ApiKey).filter_by(account_id=org_id)
        revoked = {row.name: row.revoked_at is not None for row in rows}
        db.session.remove()
    assert revoked == {"owner-key": False, "dev-key": True}


def test_the_keys_page_names_the_member_who_owns_each_organisation_key(app, make_account):
    """Acting for an organisation, owners and admins see every member's keys: each row names
    its member (e-mail). Until 2026-11-29 the rows did not say whose key was whose, so an
    owner could not tell which key to revoke when a person left or a key leaked."""
    owner = Console(app, make_account(email="keys-owner@example.com").id)
    org_id = owner.create_org("Whose Keys")
    dev_acct = make_account(email="keys-dev@example.com")
    dev = _acting_member(app, org_id, dev_acct.id, "developer")
    dev.post("/keys", {"name": "dev-key", "scopes": "call:read"}, page="/keys")
    owner.post("/keys", {"name": "owner-key", "scopes": "call:read"}, page="/keys")
    html = owner.get("/keys").get_data(as_text=True)
    cells = dict(re.findall(r'<td data-label="Name">([\w-]+).*?<td data-label="Member"[^>]*>([^<]+)</td>', html, re.S))
    assert cells == {"dev-key": "keys-dev@example.com", "owner-key": "keys-owner@example.com"}
    assert 'data-label="Member"' not in dev.get("/keys").get_data(as_text=True)  # their own keys only
    personal = Console(app, dev_acct.id)
    assert 'data-label="Member"' not in personal.get("/keys").get_data(as_text=True)


def test_a_viewers_keys_page_says_why_there_is_no_create_form(app, make_account):
    """A role that may not create keys (billing, viewer) reads why on the keys page, naming
    the roles that may, as the billing page does for payments; until 2026-11-29 the form was
    simply missing."""
    owner = Console(app, make_account().id)
    org_id = owner.create_org("Readers")
    viewer_acct = make_account()
    viewer = _acting_member(app, org_id, viewer_acct.id, "viewer")
    html = viewer.get("/keys").get_data(as_text=True)
    assert "Create a key" not in html
    assert "Your role (viewer) cannot create organisation keys: that needs role owner, admin or developer." in html
    assert "cannot create organisation keys" not in owner.get("/keys").get_data(as_text=True)


def test_last_owner_cannot_be_demoted_or_removed_the_page_says_why(app, make_account):
    owner = Console(app, make_account().id)
    org_id = owner.create_org("Solo")
    r = owner.post(f"/org/members/{owner.account_id}", {"role": "admin"})
    assert r.status_code == 409 and "last owner" in r.get_data(as_text=True)
    r = owner.post(f"/org/members/{owner.account_id}/remove")
    assert r.status_code == 409 and "last owner" in r.get_data(as_text=True)
    with app.app_context():
        from app.services.orgs import orgs

        assert orgs.member_role(org_id, owner.account_id) == "owner"
        db.session.remove()


def test_invite_revoke_role_change_remove_and_the_audit_log(app, make_account):
    from app.models.orgs import OrgInvite

    owner = Console(app, make_account().id)
    org_id = owner.create_org("Team")
    r = owner.post("/org/invites", {"email": "bad address", "role": "viewer"})
    assert r.status_code == 400 and 'id="e-email"' in r.get_data(as_text=True)
    r = owner.post("/org/invites", {"email": "dev@example.com", "role": "developer"})
    assert r.status_code == 303
    assert "dev@example.com" in owner.get("/org/members").get_data(as_text=True)
    with app.app_context():
        invite_id = db.session.query(OrgInvite).filter_by(org_id=org_id, email="dev@example.com").one().id
        db.session.remove()
    assert owner.post(f"/org/invites/{invite_id}/revoke").status_code == 303
    with app.app_context():
        assert db.session.get(OrgInvite, invite_id).revoked_at is not None
        db.session.remove()
    member = make_account()
    _add_member(app, org_id, member.id, "viewer")
    assert owner.post(f"/org/members/{member.id}", {"role": "billing"}).status_code == 303
    assert owner.post(f"/org/members/{member.id}/remove").status_code == 303
    # the audit log: newest first, in pages of 50 with a cursor, and the CSV of every entry
    html = owner.get("/org/audit").get_data(as_text=True)
    actions = re.findall(r"<code>([a-z.]+)</code>", html)
    assert actions[:4] == ["member.remove", "member.update", "member.add", "invite.revoke"]
    assert actions[-1] == "org.create" and "Older entries" not in html
    csv = owner.get("/org/audit.csv")
    assert csv.mimetype == "text/csv" and csv.get_data(as_text=True).count("\r\n") == len(actions) + 1
    assert owner.get("/org/audit?cursor=notacursor").status_code == 404


def test_every_change_made_in_the_console_names_the_person_and_the_console(app, make_account):
    """Changes made through the console's billing, keys and alerts forms are audited with the
    person as actor and ``console`` as the credential, as its member forms are. Until
    2026-11-29 only the forms that passed an actor did: a checkout, an auto top-up, a key or an
    alert made in the console named no person (the route layer sets the actor for the API only)."""
    from app.models.orgs import OrgAuditEntry

    owner = Console(app, make_account().id)
    org_id = owner.create_org("Who Did It")
    assert owner.post("/billing/topup", {"amount": "20"}, page="/billing").status_code == 303
    assert owner.post("/billing/card", {"payment_method_id": "pm_card_visa"}, page="/billing").status_code == 303
    assert owner.post("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "100"},
                      page="/billing").status_code == 303
    assert owner.post("/keys", {"name": "ci", "scopes": ["call:write"]}, page="/keys").status_code == 200
    with app.app_context():
        entries = db.session.query(OrgAuditEntry).filter_by(org_id=org_id).order_by(OrgAuditEntry.id).all()
        got = [(e.action, e.actor_account_id, e.credential_id) for e in entries]
        db.session.remove()
    assert {a for a, _, _ in got} >= {"org.create", "checkout.create", "autotopup.set", "key.create"}
    assert all((who, cred) == (owner.account_id, "console") for a, who, cred in got if a != "payment.credit"), got


def test_the_audit_page_names_people_by_e_mail(app, make_account):
    """The console's audit log names who acted, and the member a change was made to, by
    e-mail (the account id in the cell's title); until 2026-11-29 it showed bare account ids,
    which no one reading the page could tell apart."""
    owner = Console(app, make_account(email="boss-audit@example.com").id)
    org_id = owner.create_org("Named")
    member = make_account(email="member-audit@example.com")
    _add_member(app, org_id, member.id, "viewer")
    assert owner.post(f"/org/members/{member.id}", {"role": "developer"}).status_code == 303
    html = owner.get("/org/audit").get_data(as_text=True)
    row = re.search(r"<tr><td data-label=\"When\">.*?</tr>", html, re.S).group(0)  # the newest: member.update
    assert "member.update" in row
    who = re.search(r'data-label="Who"[^>]*>(.*?)</td>', row, re.S).group(1)
    target = re.search(r'data-label="Target"[^>]*>(.*?)</td>', row, re.S).group(1)
    assert "boss-audit@example.com" in who and f'title="{owner.account_id}"' in who
    assert "member-audit@example.com" in target and f'title="{member.id}"' in target


def test_an_admin_sees_no_controls_on_an_owners_row(app, make_account):
    """Only an owner changes or removes an owner (``manage_owners``): an admin's members page
    shows an owner's role and budget as text with no Save or Remove, while other members' rows
    keep their controls. Until 2026-11-29 the admin got the form and the Remove button on the
    owner's row, and each answered a 403 page."""
    owner_acct = make_account(email="the-owner@example.com")
    owner = Console(app, owner_acct.id)
    org_id = owner.create_org("Admins")
    admin_acct, dev_acct = make_account(email="the-admin@example.com"), make_account(email="a-dev@example.com")
    _add_member(app, org_id, admin_acct.id, "admin")
    _add_member(app, org_id, dev_acct.id, "developer")
    admin = Console(app, admin_acct.id)
    admin.post("/orgs/switch", {"org_id": org_id})
    html = admin.get("/org/members").get_data(as_text=True)
    rows = dict(re.findall(r'<tr data-member="([^"]+)">(.*?)</tr>', html, re.S))
    assert "Save" not in rows["the-owner@example.com"] and "Remove" not in rows["the-owner@example.com"]
    assert "Save" in rows["a-dev@example.com"] and "Remove" in rows["a-dev@example.com"]
    assert admin.post(f"/org/members/{owner_acct.id}/remove", page="/org/members").status_code == 403  # as before


def test_audit_log_pages_with_a_cursor(app, make_account):
    from app.blueprints.console.org_pages import AUDIT_PAGE
    from app.services.orgs.audit import Actor, record
    from app.services.platform.uow import unit_of_work

    owner = Console(app, make_account().id)
    org_id = owner.create_org("Busy")
    with app.app_context():
        with unit_of_work():
            for n in range(AUDIT_PAGE + 5):
                record(org_id, Actor(owner.account_id), "key.create", f"key_{n}")
        db.session.remove()
    first = owner.get("/org/audit").get_data(as_text=True)
    assert first.count("<code>key.create</code>") == AUDIT_PAGE
    nxt = re.search(r'href="(/org/audit\?cursor=\d+)"', first).group(1)
    second = owner.get(nxt).get_data(as_text=True)
    assert second.count("<code>key.create</code>") == 5 and "<code>org.create</code>" in second


def _usage_rows(html: str) -> dict:
    """The "Usage by member" table: member -> (calls, spend)."""
    return {m: (int(c), spend) for m, c, spend in re.findall(
        r'<tr data-member-usage="([^"]+)">.*?data-label="Calls" class="num">(\d+)<.*?'
        r'data-label="Spend" class="num">([^<]+)<', html)}


def test_members_page_budget_end_to_end_with_spend_and_usage_by_member(app, client, make_account, mod):  # noqa: F811
    """The members page sets a member's monthly budget (dollars, passed in cents), shows what
    each member spent this month beside it, lists this month's usage by member (everyone for
    owners, admins and billing; one's own row for the others) and clears the budget; the
    API then answers the 402 ``member_budget_exceeded`` at the budget and lets calls through
    once it is cleared."""
    from app.models import OrgMember
    from tests.orgkit import fund, h, org_key

    owner = Console(app, make_account(email="boss@example.com").id)
    org_id = owner.create_org("Budgets")
    dev = make_account(email="dev-budget@example.com")
    _add_member(app, org_id, dev.id, "developer")
    fund(app, org_id, 100, "enterprise")
    assert owner.post(f"/org/members/{dev.id}", {"role": "developer", "monthly_budget": "0.06"}).status_code == 303
    html = owner.get("/org/members").get_data(as_text=True)
    assert 'value="0.06"' in html and "No usage this month." not in html
    key = org_key(client, dev, org_id)["key"]
    answers = [client.post("/v1/module/svc/call", json={"action": "ok"}, headers=h(key)) for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 402]
    assert answers[2].get_json()["error"] == "member_budget_exceeded"
    html = owner.get("/org/members").get_data(as_text=True)
    dev_row = re.search(r'<tr data-member="dev-budget@example.com">.*?</tr>', html, re.S).group(0)
    assert "$0.06 <span class=\"muted\">of $0.06</span>" in dev_row
    assert _usage_rows(html) == {"dev-budget@example.com": (2, "$0.06"), "boss@example.com": (0, "$0.00")}
    # a developer sees their own row of the usage by member only
    mine = Console(app, dev.id)
    mine.post("/orgs/switch", {"org_id": org_id})
    assert _usage_rows(mine.get("/org/members").get_data(as_text=True)) == {"dev-budget@example.com": (2, "$0.06")}
    # cleared: no budget, the next call goes through
    assert owner.post(f"/org/members/{dev.id}", {"role": "developer", "monthly_budget": ""}).status_code == 303
    with app.app_context():
        assert db.session.get(OrgMember, (org_id, dev.id)).monthly_budget_micros is None
        db.session.remove()
    assert client.post("/v1/module/svc/call", json={"action": "ok"}, headers=h(key)).status_code == 200
    r = owner.post(f"/org/members/{dev.id}", {"role": "developer", "monthly_budget": "lots"})
    assert r.status_code == 400 and "Monthly budget" in r.get_data(as_text=True)


def test_members_page_budget_error_keeps_what_was_typed(app, make_account):
    """A malformed monthly budget answers the members page with the row as the person left it
    (the amount typed, marked invalid and tied to the message; the role chosen), not the
    stored values: the page used to reset the row, so the typo and the role change were lost."""
    owner = Console(app, make_account(email="keeper@example.com").id)
    org_id = owner.create_org("Typed")
    dev = make_account(email="dev-typed@example.com")
    _add_member(app, org_id, dev.id, "developer")
    r = owner.post(f"/org/members/{dev.id}", {"role": "viewer", "monthly_budget": "12,5O"})
    assert r.status_code == 400
    row = re.search(r'<tr data-member="dev-typed@example.com">.*?</tr>', r.get_data(as_text=True), re.S).group(0)
    assert re.search(r'<input[^>]*name="monthly_budget"[^>]*value="12,5O"', row, re.S)
    assert 'aria-invalid="true"' in row and 'aria-describedby="org-error"' in row
    assert re.search(r'<option value="viewer" selected>', row) and '<option value="developer" selected>' not in row
    # the other rows keep their stored values
    me = re.search(r'<tr data-member="keeper@example.com">.*?</tr>', r.get_data(as_text=True), re.S).group(0)
    assert 'aria-invalid' not in me and '<option value="owner" selected>' in me


def test_removing_a_member_or_leaving_asks_first(app, make_account):
    """Remove revokes the member's organisation keys, disables their agents and revokes their
    invitations; Leave takes one's own access: both forms ask first (console.js's
    ``form[data-confirm]``, loaded by the page), as a key's Revoke does. They went at one click."""
    owner = Console(app, make_account(email="asker@example.com").id)
    org_id = owner.create_org("Asks")
    dev = make_account(email="dev-asked@example.com")
    _add_member(app, org_id, dev.id, "developer")
    page = owner.get("/org/members").get_data(as_text=True)
    remove = re.search(rf'<form[^>]*action="/org/members/{dev.id}/remove"[^>]*>', page).group(0)
    assert "dev-asked@example.com" in re.search(r'data-confirm="([^"]+)"', remove).group(1)
    leave = re.search(rf'<form[^>]*action="/org/members/{owner.account_id}/remove"[^>]*>', page).group(0)
    assert "Leave" in re.search(r'data-confirm="([^"]+)"', leave).group(1)
    assert re.search(r'<script src="/console/static/console\.js[^"]*" defer>', page)


def test_balance_headings_name_the_mode_shown(app, make_account):
    """Live and test balances are separate: in test mode the dashboard's Balance and the billing
    page's Credits read $0.00 beside a live balance, and said neither which (the members
    page's "Balance (live)" did)."""
    acct = make_account()
    for mode in ("live", "test"):
        c = Console(app, acct.id, mode=mode)
        assert re.search(rf"<h2>Balance \({mode}\)</h2>", c.get("/dashboard").get_data(as_text=True)), mode
        assert re.search(rf"<h2>Credits \({mode}\)</h2>", c.get("/billing").get_data(as_text=True)), mode


def test_members_page_counts_one_call_in_the_singular(app, client, make_account, mod):  # noqa: F811
    """The members page's "This month" says "1 call", as the dashboard does (it said "1 calls")."""
    from tests.orgkit import fund, h, org_key

    owner_acct = make_account()
    owner = Console(app, owner_acct.id)
    org_id = owner.create_org("Grammar")
    fund(app, org_id, 100, "enterprise")
    assert client.post("/v1/module/svc/call", json={"action": "ok"},
                       headers=h(org_key(client, owner_acct, org_id)["key"])).status_code == 200
    html = owner.get("/org/members").get_data(as_text=True)
    assert ">1 call</p>" in html and "1 calls" not in html


def test_billing_save_card_pay_once_per_form_and_auto_topup(app, make_account):
    acct = make_account()
    me = Console(app, acct.id, mode="test")
    html = me.get("/billing").get_data(as_text=True)
    assert "/api/" not in html  # no page sends the person to a raw API path
    r = me.post("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "100"}, page="/billing")
    text = r.get_data(as_text=True)
    assert r.status_code == 409 and "save one under" in text and "/api/" not in text
    assert me.post("/billing/card", {"payment_method_id": "pm_card_visa"}, page="/billing").status_code == 303
    assert "visa ···· 4242" in me.get("/billing").get_data(as_text=True)
    before = _balance(app, acct.id, "test")
    page = me.get("/billing").get_data(as_text=True)
    pay_key = re.search(r'name="pay_key" value="([^"]+)"', page).group(1)
    for _ in range(2):  # a double submit of one form pays once
        r = me.client.post("/billing/pay", data={"pay_amount": "7.50", "pay_key": pay_key, "csrf": _csrf(page)})
        assert r.status_code == 303
    assert _balance(app, acct.id, "test") - before == 7_500_000
    r = me.post("/billing/pay", {"pay_amount": "abc"}, page="/billing")
    assert r.status_code == 400 and "Enter an amount" in r.get_data(as_text=True)
    r = me.post("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "100"}, page="/billing")
    assert r.status_code == 303
    assert "add $20.00 from the saved card" in me.get("/billing").get_data(as_text=True)
    r = me.post("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "10"}, page="/billing")
    assert r.status_code == 400 and 'id="e-autotopup"' in r.get_data(as_text=True)
    assert me.post("/billing/auto-topup/delete", page="/billing").status_code == 303
    assert 'id="autotopup-state">Off.' in me.get("/billing").get_data(as_text=True)
    # a declining card: the decline is shown on the page, nothing credited
    me.post("/billing/card", {"payment_method_id": "pm_card_chargeDeclined"}, page="/billing")
    r = me.post("/billing/pay", {"pay_amount": "3"}, page="/billing")
    assert r.status_code == 402 and "declined" in r.get_data(as_text=True)
    # a card that asks for 3-D Secure: the page says to use the checkout, not an API path
    me.post("/billing/card", {"payment_method_id": "pm_card_authenticationRequired"}, page="/billing")
    r = me.post("/billing/pay", {"pay_amount": "3"}, page="/billing")
    assert r.status_code == 402 and "3-D Secure" in r.get_data(as_text=True)
    assert "through the checkout" in r.get_data(as_text=True) and "/api/" not in r.get_data(as_text=True)
    assert _balance(app, acct.id, "test") - before == 7_500_000


def test_cancel_and_resume_a_pending_checkout(app, make_account):
    from app.models import Payment

    acct = make_account()
    me = Console(app, acct.id, mode="test")
    r = me.post("/billing/topup", {"amount": "12"}, page="/billing")
    assert r.status_code == 303 and "/pay/sandbox/checkout/" in r.headers["Location"]
    with app.app_context():
        pay = db.session.query(Payment).filter_by(account_id=acct.id, kind="checkout").one()
        db.session.remove()
    html = me.get("/billing").get_data(as_text=True)
    assert f"/billing/checkouts/{pay.id}/resume" in html
    resumed = me.get(f"/billing/checkouts/{pay.id}/resume")
    assert resumed.status_code == 303 and resumed.headers["Location"].endswith(pay.provider_id)
    assert me.post(f"/billing/checkouts/{pay.id}/cancel", page="/billing").status_code == 303
    with app.app_context():
        assert db.session.get(Payment, pay.id).status == "canceled"
        db.session.remove()
    r = me.post(f"/billing/checkouts/{pay.id}/cancel", page="/billing")
    assert r.status_code == 409 and "can no longer be canceled" in r.get_data(as_text=True)
    other = Console(app, make_account().id, mode="test")
    assert other.get(f"/billing/checkouts/{pay.id}/resume").status_code == 404


def test_cancelling_a_checkout_and_turning_off_auto_top_up_ask_first(app, make_account):
    """Neither can be undone from where it is pressed (a canceled checkout cannot be paid, a
    deleted rule is gone with its amounts): each form asks first, naming what it acts on —
    console.js's ``form[data-confirm]``, the mechanism of Revoke, Disable and Remove — and the
    billing page loads the script that asks."""
    me = Console(app, make_account().id, mode="test")
    assert me.post("/billing/card", {"payment_method_id": "pm_card_visa"}, page="/billing").status_code == 303
    r = me.post("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "100"}, page="/billing")
    assert r.status_code == 303
    assert me.post("/billing/topup", {"amount": "12"}, page="/billing").status_code == 303
    page = me.get("/billing").get_data(as_text=True)

    def question(action: str) -> str:
        form = re.search(rf'<form[^>]*action="{action}"[^>]*>', page, re.S).group(0)
        return re.search(r'data-confirm="([^"]+)"', form).group(1)

    cancel = question(r"/billing/checkouts/[^\"]+/cancel")
    assert "Cancel the checkout of $12.00" in cancel and "start a new checkout" in cancel
    off = question("/billing/auto-topup/delete")
    assert "Turn off auto top-up" in off and "$5.00" in off and "$20.00" in off
    assert re.search(r'<script src="/console/static/console\.js[^"]*" defer>', page)


def test_connect_a_wallet_by_signing_the_shown_message(app, make_account):
    from eth_account import Account as EthAccount
    from eth_account.messages import encode_defunct

    from app.services.billing import wallets

    acct = make_account()
    me = Console(app, acct.id)
    wallet = EthAccount.create()
    r = me.post("/billing/wallet/message", {"chain": "base", "address": wallet.address}, page="/billing")
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and 'id="sign-message"' in html and 'id="wallet-sign"' in html
    import html as htmllib

    message = htmllib.unescape(re.search(r'<pre id="sign-message" class="wrap">(.*?)</pre>', html, re.S).group(1))
    nonce = re.search(r'name="nonce" value="([^"]+)"', html).group(1)
    bad = me.post("/billing/wallet/connect", {"chain": "base", "address": wallet.address, "nonce": nonce,
                                              "signature": "0x" + "11" * 65}, page="/billing")
    assert bad.status_code == 400 and 'id="e-wallet"' in bad.get_data(as_text=True)
    assert "signature" in bad.get_data(as_text=True).lower()
    signature = EthAccount.sign_message(encode_defunct(text=message), wallet.key).signature.hex()
    signature = signature if signature.startswith("0x") else "0x" + signature
    r = me.post("/billing/wallet/connect", {"chain": "base", "address": wallet.address, "nonce": nonce,
                                            "signature": signature}, page="/billing")
    assert r.status_code == 303
    with app.app_context():
        assert wallets.get_wallet(acct.id).address == wallet.address
        db.session.remove()
    assert "Wallet connected." in me.get("/billing?done=wallet_connected").get_data(as_text=True)


def test_billing_page_without_a_live_processor_still_shows_history_and_wallet(app, make_account, monkeypatch):
    """A deployment with no live processor (production without Stripe) answered the billing
    page with a 503 error; it now shows the page, says why paying is not offered, and keeps
    the history and the wallet."""
    acct = make_account()
    me = Console(app, acct.id)
    monkeypatch.setitem(app.config, "PAYMENTS_PROCESSOR", "none")
    r = me.get("/billing")
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and 'id="payments-off"' in html and "Live payments need a real processor" in html
    assert "Continue to checkout" not in html and "Save card" not in html and "Payment history" in html
    assert 'id="wallet-start"' in html
    r = me.post("/billing/topup", {"amount": "5"}, page="/billing")
    assert r.status_code == 400 and "Live payments need a real processor" in r.get_data(as_text=True)


def test_a_card_paid_at_the_sandbox_checkout_is_saved_when_asked(app, make_account):
    """Issue 40: "a card used at checkout is not saved": ticking "Save this payment method"
    on the sandbox checkout makes the card the payer's saved default (unticked: not saved)."""
    from urllib.parse import urlsplit

    from app.models import Payment

    acct = make_account()
    me = Console(app, acct.id, mode="test")
    for amount, pm, save in (("3", "pm_card_visa", None), ("4", "pm_card_mastercard", "true")):
        r = me.post("/billing/topup", {"amount": amount}, page="/billing")
        checkout = urlsplit(r.headers["Location"]).path
        assert 'name="save_method"' in me.get(checkout).get_data(as_text=True)
        form = {"action": "pay", "payment_method": pm, **({"save_method": save} if save else {})}
        assert me.client.post(checkout, data=form).status_code == 303
        methods = me.get("/billing").get_data(as_text=True)
        if save is None:
            assert "None saved." in methods
    assert '<li class="method"><span>mastercard ···· 4444</span>' in methods and methods.count('<li class="method">') == 1
    with app.app_context():
        from app.services.billing import payments

        assert payments.saved_method(acct.id, "test").payment_method_id == "pm_card_mastercard"
        assert {p.status for p in db.session.query(Payment).filter_by(account_id=acct.id)} == {"succeeded"}
        db.session.remove()


def test_activity_and_usage_calls_follow_the_chosen_org_and_the_roles_share(app, client, make_account, mod):  # noqa: F811
    """With an organisation chosen, the activity page, the usage page's recent calls, both CSV
    downloads and a call's page read the organisation's calls (the activity page used to read
    the person's own account under the organisation's banner); owners, admins and billing see
    every member's calls, developers and viewers only their own keys' — the API's rule for the
    per-call export (``orgs.usage_scope``)."""
    from app.models import ApiKey as ApiKeyRow, ModuleCall
    from tests.orgkit import fund, h, org_key

    owner_acct, dev_acct = make_account(), make_account()
    owner = Console(app, owner_acct.id)
    org_id = owner.create_org("Calls")
    _add_member(app, org_id, dev_acct.id, "developer")
    fund(app, org_id, 100, "enterprise")
    for acct in (owner_acct, dev_acct):
        key = org_key(client, acct, org_id)["key"]
        assert client.post("/v1/module/svc/call", json={"action": "ok"}, headers=h(key)).status_code == 200
    with app.app_context():
        ids = {m: db.session.query(ModuleCall.id).filter(ModuleCall.account_id == org_id, ModuleCall.actor.in_(
            db.session.query(ApiKeyRow.id).filter(ApiKeyRow.member_account_id == m))).scalar()
            for m in (owner_acct.id, dev_acct.id)}
        db.session.remove()
    dev = Console(app, dev_acct.id)
    dev.post("/orgs/switch", {"org_id": org_id})
    for who, sees, hidden in ((owner, set(ids.values()), set()), (dev, {ids[dev_acct.id]}, {ids[owner_acct.id]})):
        for page in ("/activity", "/usage", "/activity/export.csv", "/usage/export.csv"):
            text = who.get(page).get_data(as_text=True)
            assert all(i in text for i in sees) and not any(i in text for i in hidden), (who.account_id, page)
        assert who.get(f"/usage/calls/{ids[dev_acct.id]}").status_code == 200
    assert dev.get(f"/usage/calls/{ids[owner_acct.id]}").status_code == 404
    assert owner.get(f"/usage/calls/{ids[owner_acct.id]}").status_code == 200


def test_a_role_change_that_disables_agents_says_so(app, client, make_account):
    """Lowering a developer to viewer on the members page disables the agents they
    registered for the organisation (``orgs.update_member``) and the page says how many."""
    from tests.agentkit import Keypair
    from tests.orgkit import h, org_key

    owner_acct, dev = make_account(plan="scale"), make_account(plan="scale")
    owner = Console(app, owner_acct.id)
    org_id = owner.create_org("Team")
    _add_member(app, org_id, dev.id, "developer")
    key = org_key(client, dev, org_id)
    r = client.post("/api/agent/register", json={"name": "bot", "pubkey": Keypair().pubkey}, headers=h(key["key"]))
    assert r.status_code == 201, r.get_json()
    r = owner.post(f"/org/members/{dev.id}", {"role": "viewer"})
    assert r.status_code == 303 and r.headers["Location"].endswith("/org/members?disabled_agents=1")
    page = owner.get(r.headers["Location"]).get_data(as_text=True)
    assert "1 agent this member registered was disabled" in page
    r = owner.post(f"/org/members/{dev.id}", {"role": "developer"})
    assert r.status_code == 303 and r.headers["Location"].endswith("/org/members")


def test_removing_a_member_says_how_many_of_their_invitations_were_revoked(app, client, make_account):
    """Removing an admin on the members page revokes the invitations they sent
    (``invites.revoke_sent_by``) and the page says so; they leave the pending list."""
    from tests.orgkit import h

    owner_acct, admin = make_account(plan="scale"), make_account(plan="scale")
    owner = Console(app, owner_acct.id)
    org_id = owner.create_org("Team")
    _add_member(app, org_id, admin.id, "admin")
    for email in ("one@example.com", "two@example.com"):
        r = client.post(f"/api/orgs/{org_id}/invites", json={"email": email, "role": "viewer"}, headers=h(admin.key))
        assert r.status_code == 201, r.get_json()
    assert "two@example.com" in owner.get("/org/members").get_data(as_text=True)
    r = owner.post(f"/org/members/{admin.id}/remove", {})
    assert r.status_code == 303 and r.headers["Location"].endswith("/org/members?revoked_invites=2")
    page = owner.get(r.headers["Location"]).get_data(as_text=True)
    assert "2 pending invitations this member sent were revoked" in page and "two@example.com" not in page


def test_with_saved_cards_but_no_default_the_page_says_to_make_one_the_default(app, make_account):
    """Removing the default card leaves the other saved cards and no default (docs/payments.md):
    the "Pay with the saved method" box said "Save a payment method below" beside a listed
    saved card; it now says to make one the default."""
    acct = make_account()
    me = Console(app, acct.id, mode="test")
    for pm in ("pm_card_mastercard", "pm_card_visa"):
        assert me.post("/billing/card", {"payment_method_id": pm}, page="/billing").status_code == 303
    assert me.post("/billing/methods/pm_card_visa/remove", page="/billing").status_code == 303
    html = me.get("/billing").get_data(as_text=True)
    assert "mastercard ···· 4444" in html and "Save a payment method below" not in html
    assert "make a saved one the default" in html.lower()


def test_resuming_a_checkout_past_its_expiry_says_it_expired(app, make_account):
    """Between a checkout's expiry and the job that marks it expired it is still `pending`:
    Resume said "This checkout is pending and can no longer be paid"."""
    from datetime import timedelta

    from app.models import Payment
    from app.models.base import utcnow

    acct = make_account()
    me = Console(app, acct.id, mode="test")
    assert me.post("/billing/topup", {"amount": "12"}, page="/billing").status_code == 303
    with app.app_context():
        pay = db.session.query(Payment).filter_by(account_id=acct.id, kind="checkout").one()
        pay.expires_at = utcnow() - timedelta(seconds=1)
        db.session.commit()
        pay_id = pay.id
        db.session.remove()
    r = me.get(f"/billing/checkouts/{pay_id}/resume")
    text = r.get_data(as_text=True)
    assert r.status_code == 409 and "This checkout has expired" in text and "is pending" not in text


def test_auto_topup_on_a_card_that_needs_3d_secure_is_warned(app, make_account):
    """Auto top-up charges off-session, where a card that asks for 3-D Secure fails
    (Stripe's ``authentication_required``). The API accepts the rule (the bank decides at
    each charge); the billing page says what happens to every card, and warns by name when
    the saved card is known to need it: the processor says so (the sandbox's 3-D Secure
    card), or the card's latest off-session charge failed so."""
    from app.models import Payment
    from app.models.base import utcnow

    acct = make_account()
    me = Console(app, acct.id, mode="test")
    assert me.post("/billing/card", {"payment_method_id": "pm_card_visa"}, page="/billing").status_code == 303
    html = me.get("/billing").get_data(as_text=True)
    assert 'id="autotopup-offsession">Auto top-up charges the saved card without you present. If the bank asks ' \
           'for 3-D Secure, the charge fails' in html and "after 3 failures in a row auto top-up turns off" in html
    assert 'id="autotopup-3ds"' not in html
    assert me.post("/billing/card", {"payment_method_id": "pm_card_authenticationRequired"},
                   page="/billing").status_code == 303
    r = me.post("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "100"}, page="/billing")
    assert r.status_code == 303  # accepted, as by the API
    html = me.get("/billing").get_data(as_text=True)
    warning = re.search(r'<p class="error" id="autotopup-3ds">(.*?)</p>', html).group(1)
    assert "visa ···· 3184 asks for 3-D Secure, so auto top-up's charges on it will fail" in warning
    # a card the processor says nothing of, whose last off-session charge needed authentication
    assert me.post("/billing/card", {"payment_method_id": "pm_card_visa"}, page="/billing").status_code == 303
    with app.app_context():
        db.session.add(Payment(id="pay_console3ds", account_id=acct.id, method="card", kind="charge",
                               processor="sandbox", mode="test", amount_micros=20_000_000, status="failed",
                               failure_code="authentication_required", meta={"payment_method": "pm_card_visa"},
                               created_at=utcnow()))
        db.session.commit()
        db.session.remove()
    assert "visa ···· 4242 asks for 3-D Secure" in me.get("/billing").get_data(as_text=True)


@pytest.mark.parametrize("typed", ["inf", "nan", "1e3", "10.005", "-5", "0.50", "10001", "oops"])
def test_a_top_up_amount_is_read_exactly_or_refused_in_dollars(app, make_account, typed):
    """The checkout's amount was a float: "inf" answered a 500, "10.005" became $10.00 and
    "1e3" $1,000. It is read as every money field of the console (``dollars_to_cents``), the
    schema's range said in dollars (it said "greater than or equal to 100", cents); a
    refusal starts no checkout."""
    from sqlalchemy import func, select

    from app.models import Payment

    me = Console(app, make_account().id, mode="test")
    r = me.post("/billing/topup", {"amount": typed}, page="/billing")
    assert r.status_code == 400, typed
    text = r.get_data(as_text=True)
    assert 'id="e-amount"' in text and "Enter an amount in dollars from 1.00 to 10,000, with at most 2 decimals" in text
    with app.app_context():
        assert db.session.execute(select(func.count()).select_from(Payment)).scalar_one() == 0
        db.session.remove()


def test_a_top_up_amount_in_dollars_starts_its_checkout(app, make_account):
    from sqlalchemy import select

    from app.models import Payment

    me = Console(app, make_account().id, mode="test")
    r = me.post("/billing/topup", {"amount": "$25.5"}, page="/billing")
    assert r.status_code == 303 and "/pay/sandbox/checkout/" in r.headers["Location"]
    with app.app_context():
        assert db.session.execute(select(Payment.amount_micros)).scalar_one() == 25_500_000
        db.session.remove()


@pytest.mark.parametrize("fields, said", [
    ({"threshold": "0"}, "Enter the threshold from $0.01 to $10,000.00."),
    ({"add_amount": "0.50", "monthly_cap": "2000000"},
     "Enter the amount added from $1.00 to $10,000.00; the monthly cap from $1.00 to $1,000,000.00."),
    ({"add_amount": "20", "monthly_cap": "10"}, "The monthly cap must be at least the amount added."),
])
def test_auto_topup_refusals_are_said_in_dollars(app, make_account, fields, said):
    """The form is in dollars; its refusals named the API's cents ("threshold: Must be greater
    than or equal to 1. (amounts in cents above)", "monthly_cap_cents: must be at least
    amount_cents (two fields related: 422)"). Nothing is set."""
    me = Console(app, make_account().id, mode="test")
    assert me.post("/billing/card", {"payment_method_id": "pm_card_visa"}, page="/billing").status_code == 303
    r = me.post("/billing/auto-topup", {"threshold": "5", "add_amount": "20", "monthly_cap": "100", **fields},
                page="/billing")
    text = r.get_data(as_text=True)
    assert r.status_code == 400 and f'<p class="error" role="alert" id="e-autotopup">{said}</p>' in text
    assert "cents" not in re.search(r'id="e-autotopup">([^<]*)<', text).group(1)
    assert 'id="autotopup-state">Off.' in me.get("/billing").get_data(as_text=True)


def test_removing_a_saved_method_asks_first(app, make_account):
    """Remove detaches the method at the processor (it cannot be attached again): its form
    asks (console.js's ``form[data-confirm]``, as Revoke, Disable and Delete), saying what
    stops when it is the default, and the billing page loads the script that asks."""
    me = Console(app, make_account().id, mode="test")
    assert me.post("/billing/card", {"payment_method_id": "pm_card_visa"}, page="/billing").status_code == 303
    html = me.get("/billing").get_data(as_text=True)
    form = re.search(r'<form[^>]*action="/billing/methods/pm_card_visa/remove"[^>]*>', html, re.S).group(0)
    question = re.search(r'data-confirm="([^"]+)"', form).group(1)
    assert question.startswith("Remove visa ···· 4242? It is detached from the payment processor")
    assert "It is the default: paying without the checkout and auto top-up stop" in question
    assert re.search(r'<script src="/console/static/console\.js[^"]*" defer>', html)


def test_a_declined_payment_row_stays_one_piece_beside_its_label(app, make_account):
    """At 390 px a payment's decline message fell under the "Status" label, beside nothing."""
    from tests.support.stacked import split_cells

    me = Console(app, make_account().id, mode="test")
    me.post("/billing/card", {"payment_method_id": "pm_card_chargeDeclined"}, page="/billing")
    assert me.post("/billing/pay", {"pay_amount": "3"}, page="/billing").status_code == 402
    html = me.get("/billing").get_data(as_text=True)
    assert "Your card was declined." in html and split_cells(html) == []
