"""Issue 37 "Done when", tried as a new user would: an owner creates an organisation, funds
it with 20 USD by sandbox checkout and invites a developer by e-mail; the developer opens
the link (a new account, signed in on the console), makes a key there, then an
organisation key by API and calls a module; the organisation's balance drops, the
developer's does not; the developer's monthly budget stops them at the limit; the developer is
refused inviting and billing; the owner removes them and the key is refused; the audit
log shows each step."""
from __future__ import annotations

import re
from urllib.parse import urlparse

from app.scopes import ALL_SCOPES
from tests.api.test_console_security import _csrf, _mails
from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401
from tests.orgkit import balances, h
from tests.support.errors import error_code


def test_an_owner_and_a_developer_share_one_balance(app, client, make_account, mod, ledger_clean):  # noqa: F811
    owner = make_account()
    org = client.post("/api/orgs", json={"name": "Acme"}, headers=owner.headers).get_json()
    org_id = org["id"]
    r = client.post("/api/pay/checkout", json={"amount_cents": 2000, "org_id": org_id}, headers=owner.headers)
    page = urlparse(r.get_json()["url"]).path
    assert b"succeeded" in client.post(page, data={"action": "pay", "payment_method": "pm_card_visa"}).data
    assert client.get(f"/api/orgs/{org_id}", headers=owner.headers).get_json()["balance_cents"] == 2000

    email = "dev@acme.example"
    r = client.post(f"/api/orgs/{org_id}/invites", json={"email": email, "role": "developer"}, headers=owner.headers)
    assert r.status_code == 201
    link = re.search(r"http\S+/invites/\S+", _mails(app, email)[-1]["text"]).group(0)
    browser = app.test_client()
    page = browser.get(urlparse(link).path)
    r = browser.post(urlparse(link).path, data={"csrf": _csrf(page.get_data(as_text=True))})
    assert r.status_code == 303
    keys_page = browser.get("/keys").get_data(as_text=True)  # signed in: their own keys page
    html = browser.post("/keys", data={"name": "laptop", "scopes": list(ALL_SCOPES),
                                       "csrf": _csrf(keys_page)}).get_data(as_text=True)
    personal = re.search(r'id="secret">(svc_live_\w+)<', html).group(1)
    dev_id = client.get("/api/account", headers=h(personal)).get_json()["id"]

    r = client.post("/api/keys", json={"name": "ci", "org_id": org_id}, headers=h(personal))
    assert r.status_code == 201
    org_key = r.get_json()
    r = call(client, None, {"action": "ok"}, bearer=org_key["key"])
    assert r.status_code == 200 and r.get_json()["cost_cents"] == 3
    assert balances(app, org_id, dev_id) == [1997, 1000]  # the org paid; the promo credit is untouched
    # the developer's monthly budget stops them exactly at the limit (3 spent, 6 allowed: one more call)
    r = client.patch(f"/api/orgs/{org_id}/members/{dev_id}", json={"monthly_budget_cents": 6}, headers=owner.headers)
    assert r.status_code == 200 and r.get_json()["spent_this_month_cents"] == 3
    assert call(client, None, {"action": "ok"}, bearer=org_key["key"]).status_code == 200
    r = call(client, None, {"action": "ok"}, bearer=org_key["key"])
    assert r.status_code == 402 and error_code(r.get_json()) == "member_budget_exceeded"
    assert balances(app, org_id, dev_id) == [1994, 1000]

    r = client.post(f"/api/orgs/{org_id}/invites", json={"email": "x@acme.example", "role": "viewer"},
                    headers=h(personal))
    assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
    r = client.post("/api/pay/checkout", json={"amount_cents": 500}, headers=h(org_key["key"]))
    assert r.status_code == 403 and "owner or billing" in r.get_json()["message"]

    assert client.delete(f"/api/orgs/{org_id}/members/{dev_id}", headers=owner.headers).status_code == 200
    r = call(client, None, {"action": "ok"}, bearer=org_key["key"])
    assert r.status_code == 401
    assert balances(app, org_id) == [1994]

    log = client.get(f"/api/orgs/{org_id}/audit", headers=owner.headers).get_json()["entries"]
    assert [e["action"] for e in reversed(log)] == ["org.create", "invite.create", "member.add", "key.create",
                                                     "member.update", "member.remove"]
    assert {e["actor_account_id"] for e in log} == {owner.id, dev_id}
    ledger_clean()
