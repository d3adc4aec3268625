"""Issue 37 item 3: invitations by e-mail. The link's page (its GET changes nothing)
accepts with a button: the account of the invited address is created if needed (the
promotional grant stays one per mailbox), signed in on the console and made a member; a
person with a key can accept by API (the invite's address must be theirs). Single use,
7 days, revocable, replaced by a newer invite; bad input changes nothing."""
from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import select, update

from app.extensions import db
from app.models import Account
from app.models.base import utcnow
from app.models.tokens import SingleUseToken
from tests.api.test_console_security import _csrf, _mails
from tests.orgkit import balances, join, make_org
from tests.support.errors import error_code

_LINK = re.compile(r"/invites/([A-Za-z0-9_\-]+)")


def _invite(client, inviter, org_id, email, role="developer"):
    return client.post(f"/api/orgs/{org_id}/invites", json={"email": email, "role": role}, headers=inviter.headers)


def _token(app, email) -> str:
    mail = _mails(app, email)[-1]
    assert "http" in mail["text"] and "7 days" in mail["text"]
    return _LINK.search(mail["text"]).group(1)


def _email(app, acct) -> str:
    with app.app_context():
        out = db.session.get(Account, acct.id).email
        db.session.remove()
    return out


def _members(client, acct, org_id) -> dict:
    r = client.get(f"/api/orgs/{org_id}/members", headers=acct.headers)
    return {m["email"]: m["role"] for m in r.get_json()["members"]}


def test_link_page_creates_the_account_signs_in_and_joins(app, client, make_account, ledger_clean):
    owner = make_account()
    org = make_org(client, owner)
    email = "new.dev@example.com"
    r = _invite(client, owner, org["id"], email)
    assert r.status_code == 201, r.get_json()
    invite = r.get_json()
    assert (invite["email"], invite["role"], invite["org_id"], invite["invited_by"]) == \
        (email, "developer", org["id"], owner.id)
    token = _token(app, email)
    browser = app.test_client()
    for _ in range(2):  # a mail scanner's prefetch uses nothing
        page = browser.get(f"/invites/{token}")
        assert page.status_code == 200 and "developer" in page.get_data(as_text=True)
    r = browser.post(f"/invites/{token}", data={"csrf": _csrf(page.get_data(as_text=True))})
    assert r.status_code == 303 and r.headers["Location"].endswith("/dashboard")
    assert browser.get("/dashboard").status_code == 200  # signed in on the console
    assert _members(client, owner, org["id"]) == {_email(app, owner): "owner", email: "developer"}
    with app.app_context():
        person = db.session.execute(select(Account).where(Account.email == email)).scalar_one()
        assert person.balance_micros == 10_000_000  # a new mailbox: the promotional grant
        db.session.remove()
    other = app.test_client()
    page = other.get("/login").get_data(as_text=True)
    r = other.post(f"/invites/{token}", data={"csrf": _csrf(page)})  # single use
    assert r.status_code == 404 and other.get(f"/invites/{token}").status_code == 404
    assert client.get(f"/api/orgs/{org['id']}/invites", headers=owner.headers).get_json() == {"invites": []}
    ledger_clean()


def test_the_link_page_lands_acting_for_the_organisation_joined(app, client, make_account):
    """Accepting on the page opens the console acting for the organisation just joined (as
    Stripe's and OpenRouter's invitations do): until 2026-11-29 it landed on the person's own
    account, so the new member's first key, made on the keys page, was a personal key spending
    their own promotional credit instead of the organisation's balance."""
    from app.blueprints.console import org_context

    owner = make_account()
    org = make_org(client, owner)
    email = "lands.in.org@example.com"
    _invite(client, owner, org["id"], email)
    token = _token(app, email)
    browser = app.test_client()
    page = browser.get(f"/invites/{token}")
    r = browser.post(f"/invites/{token}", data={"csrf": _csrf(page.get_data(as_text=True))})
    assert r.status_code == 303 and r.headers["Location"].endswith("/dashboard")
    assert browser.get_cookie(org_context.COOKIE).value == org["id"]
    html = browser.get("/dashboard").get_data(as_text=True)
    assert 'id="acting-for"' in html and org["name"] in html


def test_the_link_page_warns_a_person_signed_in_as_someone_else(app, client, make_account):
    """Opened in a browser signed in as another account (the inviter trying the link, a person
    with two mailboxes), the page says who is signed in and that accepting signs in the
    invited address instead; the button names it. Until 2026-11-29 it offered "Accept and
    sign in" and silently swapped the session for the invitee's."""
    from tests.api.test_console_orgs_billing import Console

    owner = make_account()
    org = make_org(client, owner)
    _invite(client, owner, org["id"], "someone.else@example.com")
    token = _token(app, "someone.else@example.com")
    signed_in = Console(app, owner.id)
    html = signed_in.get(f"/invites/{token}").get_data(as_text=True)
    assert 'id="invite-other-account"' in html and _email(app, owner) in html
    assert "Accept and sign in as someone.else@example.com" in html
    fresh = app.test_client().get(f"/invites/{token}").get_data(as_text=True)
    assert 'id="invite-other-account"' not in fresh


def test_the_invitation_e_mail_and_page_name_who_invited(app, client, make_account):
    """The e-mail and the link's page say who sent the invitation (their address), so the
    recipient can tell a colleague's invitation from a stranger's; until 2026-11-29 both named
    only the organisation."""
    owner = make_account(email="inviter@example.com")
    org = make_org(client, owner)
    _invite(client, owner, org["id"], "invitee@example.com", "viewer")
    assert "inviter@example.com invited you" in _mails(app, "invitee@example.com")[-1]["text"]
    page = client.get(f"/invites/{_token(app, 'invitee@example.com')}").get_data(as_text=True)
    assert "invited by inviter@example.com" in page


def test_a_used_link_opened_signed_in_offers_the_console_not_sign_in(app, client, make_account):
    """A used (or unknown) link opened by someone already signed in points to their console;
    until 2026-11-29 it offered "Sign in" to a person who was signed in."""
    from tests.api.test_console_orgs_billing import Console

    person = make_account()
    html = Console(app, person.id).get("/invites/no-such-token").get_data(as_text=True)
    assert "Go to the console" in html and ">Sign in<" not in html
    assert ">Sign in<" in app.test_client().get("/invites/no-such-token").get_data(as_text=True)


def test_link_page_for_an_existing_mailbox_grants_nothing_more(app, client, make_account, ledger_clean):
    owner, known = make_account(), make_account(email="farm@example.com")
    org = make_org(client, owner)
    _invite(client, owner, org["id"], "Farm+team@example.com", "viewer")
    token = _token(app, "farm+team@example.com")
    browser = app.test_client()
    page = browser.get(f"/invites/{token}")
    assert browser.post(f"/invites/{token}", data={"csrf": _csrf(page.get_data(as_text=True))}).status_code == 303
    with app.app_context():
        person = db.session.execute(select(Account).where(Account.email == "farm+team@example.com")).scalar_one()
        assert person.balance_micros == 0 and person.id != known.id
        db.session.remove()
    ledger_clean()


def test_accept_by_api_with_ones_own_key(app, client, make_account):
    owner, dev, stranger = make_account(), make_account(), make_account()
    org = make_org(client, owner)
    assert _invite(client, owner, org["id"], _email(app, dev)).status_code == 201
    token = _token(app, _email(app, dev))
    r = client.post(f"/api/orgs/invites/{token}/accept", headers=stranger.headers)  # not their address
    assert r.status_code == 403 and error_code(r.get_json()) == "invite_email_mismatch"
    r = client.post(f"/api/orgs/invites/{token}/accept", headers=dev.headers)  # the link still works
    assert r.status_code == 200 and (r.get_json()["id"], r.get_json()["role"]) == (org["id"], "developer")
    r = client.post(f"/api/orgs/invites/{token}/accept", headers=dev.headers)
    assert r.status_code == 404 and error_code(r.get_json()) == "invalid_token"
    r = _invite(client, owner, org["id"], _email(app, dev))  # already a member
    assert r.status_code == 409 and error_code(r.get_json()) == "already_member"
    assert f'member of "{org["name"]}" ({org["id"]})' in r.get_json()["message"]  # named, not only its id
    # a developer cannot invite; an admin cannot invite an owner
    r = _invite(client, dev, org["id"], "x@example.com")
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    admin = make_account()
    join(app, org["id"], admin, "admin")
    r = _invite(client, admin, org["id"], "x@example.com", "owner")
    assert r.status_code == 403 and "role owner" in r.get_json()["message"]
    assert _invite(client, stranger, org["id"], "x@example.com").status_code == 404
    for body in ({"email": "x@example.com", "role": "boss"}, {"email": "not an address", "role": "viewer"}):
        r = client.post(f"/api/orgs/{org['id']}/invites", json=body, headers=owner.headers)
        assert r.status_code == 400
    assert client.get(f"/api/orgs/{org['id']}/invites", headers=owner.headers).get_json() == {"invites": []}
    r = client.get(f"/api/orgs/{org['id']}/invites", headers=dev.headers)
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"


def test_revoked_replaced_and_expired_links_are_refused(app, client, make_account):
    owner, person = make_account(), make_account()
    org = make_org(client, owner)
    email = _email(app, person)
    first = _invite(client, owner, org["id"], email).get_json()
    first_token = _token(app, email)
    second = _invite(client, owner, org["id"], email, "viewer").get_json()  # replaces the first
    second_token = _token(app, email)
    pending = client.get(f"/api/orgs/{org['id']}/invites", headers=owner.headers).get_json()["invites"]
    assert [i["id"] for i in pending] == [second["id"]]
    r = client.post(f"/api/orgs/invites/{first_token}/accept", headers=person.headers)
    assert r.status_code == 404 and error_code(r.get_json()) == "invalid_token"
    r = client.delete(f"/api/orgs/{org['id']}/invites/{second['id']}", headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["revoked_at"] is not None
    assert client.post(f"/api/orgs/invites/{second_token}/accept", headers=person.headers).status_code == 404
    assert client.delete(f"/api/orgs/{org['id']}/invites/{first['id']}x", headers=owner.headers).status_code == 404
    _invite(client, owner, org["id"], email)
    third_token = _token(app, email)
    with app.app_context():  # seven days later
        db.session.execute(update(SingleUseToken).where(SingleUseToken.purpose == "org_invite")
                           .values(expires_at=utcnow() - timedelta(seconds=1)))
        db.session.commit()
        db.session.remove()
    assert client.post(f"/api/orgs/invites/{third_token}/accept", headers=person.headers).status_code == 404
    assert client.get(f"/invites/{third_token}").status_code == 404
    assert set(_members(client, owner, org["id"]).values()) == {"owner"}
    assert balances(app, org["id"]) == [0]


def test_a_replaced_invitation_is_audited_as_revoked(app, client, make_account):
    """A newer invitation to the same address revokes the pending one: the audit log says so
    (``invite.revoke`` naming the invitation that replaced it). Until 2026-11-29 the log showed
    two ``invite.create`` and never that the first link had stopped working."""
    owner = make_account()
    org = make_org(client, owner)
    first = _invite(client, owner, org["id"], "twice@example.com").get_json()
    second = _invite(client, owner, org["id"], "twice@example.com", "viewer").get_json()
    log = client.get(f"/api/orgs/{org['id']}/audit", headers=owner.headers).get_json()["entries"]
    steps = [(e["action"], e["target"], e["actor_account_id"]) for e in reversed(log)]
    assert steps == [("org.create", org["id"], owner.id), ("invite.create", first["id"], owner.id),
                     ("invite.revoke", first["id"], owner.id), ("invite.create", second["id"], owner.id)]
    assert (log[1]["before"], log[1]["after"]) == ({"email": "twice@example.com", "role": "developer"},
                                                   {"replaced_by": second["id"]})


def test_invites_to_one_address_are_rate_limited_and_strangers_spend_nothing(app, client, make_account,
                                                                            monkeypatch):
    monkeypatch.setitem(app.config, "INVITE_EMAIL_RATE_LIMIT", "2/hour")
    owner = make_account()
    org = make_org(client, owner)
    # an address no other test mails: the delivered mails are read from the shared folder
    body = {"email": "rate-limited-invitee@example.com", "role": "viewer"}
    for _ in range(3):  # unauthenticated attempts do not use up the address's allowance
        assert client.post(f"/api/orgs/{org['id']}/invites", json=body).status_code == 401
    codes = [_invite(client, owner, org["id"], "rate-limited-invitee@example.com", "viewer").status_code for _ in range(3)]
    assert codes == [201, 201, 429]
    assert len(_mails(app, "rate-limited-invitee@example.com")) == 2


def test_a_person_belongs_to_a_bounded_number_of_orgs(app, client, make_account, monkeypatch):
    from app.services.orgs import orgs

    monkeypatch.setattr(orgs, "MAX_ORGS_PER_PERSON", 2)
    owner = make_account()
    assert [client.post("/api/orgs", json={"name": f"o{i}"}, headers=owner.headers).status_code
            for i in range(3)] == [201, 201, 409]
    r = client.post("/api/orgs", json={"name": "o"}, headers=owner.headers)
    assert error_code(r.get_json()) == "org_limit_reached"
    assert len(client.get("/api/orgs", headers=owner.headers).get_json()["orgs"]) == 2


def test_an_invitation_does_not_pass_the_organisations_limit(app, client, make_account, monkeypatch):
    """The limit counted only the organisations a person created: accepting invitations
    made a person a member of any number (and `GET /api/orgs` lists them all, unpaged).
    Both doors now refuse past it (409 `org_limit_reached`), and the link stays usable."""
    from app.services.orgs import orgs

    monkeypatch.setattr(orgs, "MAX_ORGS_PER_PERSON", 2)
    person, a, b = make_account(), make_account(), make_account()
    assert make_org(client, person, "mine")
    first, second = make_org(client, a, "A")["id"], make_org(client, b, "B")["id"]
    assert _invite(client, a, first, _email(app, person)).status_code == 201
    r = client.post(f"/api/orgs/invites/{_token(app, _email(app, person))}/accept", headers=person.headers)
    assert r.status_code == 200
    assert _invite(client, b, second, _email(app, person)).status_code == 201
    token = _token(app, _email(app, person))
    r = client.post(f"/api/orgs/invites/{token}/accept", headers=person.headers)
    assert r.status_code == 409 and error_code(r.get_json()) == "org_limit_reached", r.get_json()
    browser = app.test_client()
    page = browser.get(f"/invites/{token}")
    r = browser.post(f"/invites/{token}", data={"csrf": _csrf(page.get_data(as_text=True))})
    assert r.status_code == 409 and "organisations" in r.get_data(as_text=True)
    assert len(client.get("/api/orgs", headers=person.headers).get_json()["orgs"]) == 2
    # leaving one frees a place: the same link works
    assert client.delete(f"/api/orgs/{first}/members/{person.id}", headers=person.headers).status_code == 200
    r = client.post(f"/api/orgs/invites/{token}/accept", headers=person.headers)
    assert r.status_code == 200 and r.get_json()["id"] == second


def test_a_removed_or_demoted_inviters_pending_invitations_stop_working(app, client, make_account):
    """An invitation carries its sender's authority: when an admin is removed (or leaves), the
    links they sent stop working, and when one is made a developer so do theirs; an owner made
    admin keeps the invitations an admin could send and loses those that make an owner. Until
    2026-11-29 they all stayed usable for 7 days, so a removed admin could have let anyone in
    after losing access (e.g. their own second address)."""
    owner, admin, other_admin, demoted_owner = make_account(), make_account(), make_account(), make_account()
    org = make_org(client, owner)
    join(app, org["id"], admin, "admin")
    join(app, org["id"], other_admin, "admin")
    join(app, org["id"], demoted_owner, "owner")
    by_admin = _invite(client, admin, org["id"], "friend.of.admin@example.com").get_json()
    admin_token = _token(app, "friend.of.admin@example.com")
    by_other = _invite(client, other_admin, org["id"], "friend.of.other@example.com").get_json()
    other_token = _token(app, "friend.of.other@example.com")
    dev_invite = _invite(client, demoted_owner, org["id"], "dev.of.owner@example.com").get_json()
    owner_invite = _invite(client, demoted_owner, org["id"], "owner.of.owner@example.com", "owner").get_json()
    by_owner = _invite(client, owner, org["id"], "friend.of.owner@example.com").get_json()

    r = client.delete(f"/api/orgs/{org['id']}/members/{admin.id}", headers=owner.headers)
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["revoked_invites"] == [by_admin["id"]]
    r = client.patch(f"/api/orgs/{org['id']}/members/{other_admin.id}", json={"role": "developer"},
                     headers=owner.headers)
    assert r.status_code == 200, r.get_json()
    r = client.patch(f"/api/orgs/{org['id']}/members/{demoted_owner.id}", json={"role": "admin"},
                     headers=owner.headers)
    assert r.status_code == 200, r.get_json()

    pending = client.get(f"/api/orgs/{org['id']}/invites", headers=owner.headers).get_json()["invites"]
    assert sorted(i["id"] for i in pending) == sorted([dev_invite["id"], by_owner["id"]])
    assert owner_invite["id"] not in {i["id"] for i in pending} and by_other["id"] not in {i["id"] for i in pending}
    outsider = app.test_client()
    for token in (admin_token, other_token):
        assert outsider.get(f"/invites/{token}").status_code == 404
    log = client.get(f"/api/orgs/{org['id']}/audit", headers=owner.headers).get_json()["entries"]
    revokes = {e["target"]: e["after"] for e in log if e["action"] == "invite.revoke"}
    assert revokes == {by_admin["id"]: {"reason": "inviter_removed"},
                       by_other["id"]: {"reason": "inviter_role_changed"},
                       owner_invite["id"]: {"reason": "inviter_role_changed"}}
    assert all(e["actor_account_id"] == owner.id for e in log if e["action"] == "invite.revoke")
