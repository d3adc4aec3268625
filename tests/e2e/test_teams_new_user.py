"""Issue 37 "Done when", tried as a new user would: an owner creates an organisation, funds
it with 20 USD by sandbox checkout and invites a developer by e-mail; the developer opens
the link (a new account, signed in on the console acting for the organisation), switches to
their own account and makes a key there, then an
organisation key by API and calls a module; the organisation's balance drops, the
developer's does not; the developer's monthly budget stops them exactly at the limit; the
developer is refused inviting and billing (nothing changes) and sees their usage in the
organisation; the owner removes them and the key is refused at once (the SPEC allows
60 s); the audit log shows each step, with the sandbox's credit of the checkout, and the
developer's own log their console key."""
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
    landed = browser.get("/dashboard").get_data(as_text=True)  # signed in, acting for Acme
    assert 'id="acting-for"' in landed and "Acme" in landed
    # their own key first: the switcher back to the personal account, then the keys page
    browser.post("/orgs/switch", data={"org_id": "", "csrf": _csrf(landed)})
    keys_page = browser.get("/keys").get_data(as_text=True)
    assert 'id="acting-for"' not in keys_page
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
    r = client.post("/api/pay/checkout", json={"amount_cents": 500, "org_id": org_id}, headers=h(personal))
    assert r.status_code == 403 and r.get_json()["roles"] == ["owner", "billing"]
    assert balances(app, org_id) == [1994]  # the refusals changed nothing
    # the developer sees the organisation's usage and their own share of it
    usage = client.get(f"/api/usage/current?org_id={org_id}&member_id={dev_id}", headers=h(personal)).get_json()
    assert (usage["calls"], usage["spend_cents"]) == (2, 6)  # the refused call was never opened

    assert client.delete(f"/api/orgs/{org_id}/members/{dev_id}", headers=owner.headers).status_code == 200
    r = call(client, None, {"action": "ok"}, bearer=org_key["key"])
    assert r.status_code == 401
    assert balances(app, org_id) == [1994]

    log = client.get(f"/api/orgs/{org_id}/audit", headers=owner.headers).get_json()["entries"]
    steps = [(e["action"], e["actor_account_id"]) for e in reversed(log)]
    assert steps == [("org.create", owner.id), ("checkout.create", owner.id), ("payment.credit", None),
                     ("invite.create", owner.id), ("member.add", dev_id), ("key.create", dev_id),
                     ("member.update", owner.id), ("member.remove", owner.id)]
    assert log[0]["after"] == {"revoked_keys": [org_key["id"]], "disabled_agents": []}
    exported = client.get(f"/api/orgs/{org_id}/audit?format=csv", headers=owner.headers).get_data(as_text=True)
    assert len(exported.strip().splitlines()) == 1 + len(steps)
    # the developer's own log: the key made on the console
    own = client.get("/api/audit", headers=h(personal)).get_json()["entries"]
    assert [(e["action"], e["actor_account_id"]) for e in own] == [("key.create", dev_id)]
    ledger_clean()
