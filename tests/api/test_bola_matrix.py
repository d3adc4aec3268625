"""BOLA matrix (OWASP API1): every authenticated route that takes an object id, called
with another account's credential on an object that exists, answers 404 ``not_found`` —
never 200/403 — and changes nothing. The route list comes from the OpenAPI document, so
a new id-taking route fails ``test_every_id_route_is_covered`` until it is added here."""
from __future__ import annotations

import pytest

from tests.agentkit import Keypair, register


def _make_key(client, owner):
    return client.post("/api/keys", json={"name": "victim"}, headers=owner.headers).get_json()["id"]


def _make_provider_key(client, owner):
    """A provider key stored directly (adding one asks the provider, which is not running here)."""
    from app.extensions import db
    from app.models import ProviderKey

    with client.application.app_context():
        db.session.add(ProviderKey(id=f"pkey_{owner.id[-12:]}", owner_kind="account", owner_id=owner.id,
                                   provider="demo_llm", ciphertext=b"sealed", prefix="sk-victi"))
        db.session.commit()
        db.session.remove()
    return f"pkey_{owner.id[-12:]}"


def _make_alert(client, owner):
    r = client.post("/api/alerts", json={"name": "a", "metric": "calls", "op": ">", "threshold": 1,
                                         "window": "day", "channel": "email", "target": "a@example.com"},
                    headers=owner.headers)
    return r.get_json()["id"]


def _make_checkout(client, owner):
    return client.post("/api/pay/checkout", json={"amount_cents": 100}, headers=owner.headers).get_json()["payment_id"]


def _make_invoice(client, owner):
    """A paid sandbox checkout: its invoice."""
    from urllib.parse import urlparse

    url = client.post("/api/pay/checkout", json={"amount_cents": 100}, headers=owner.headers).get_json()["url"]
    client.post(urlparse(url).path, data={"action": "pay", "payment_method": "pm_card_visa"})
    return client.get("/api/pay/invoices", headers=owner.headers).get_json()["invoices"][0]["id"]


def _save_method(client, owner):
    client.post("/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=owner.headers)
    return "pm_card_visa"


def _make_agent(client, owner):
    return register(client, owner, Keypair()).get_json()["id"]


def _make_org(client, owner):
    return client.post("/api/orgs", json={"name": "victim"}, headers=owner.headers).get_json()["id"]


def _make_org_member(client, owner):
    """``<org>/members/<owner's id>``: the organisation's one member, its owner."""
    me = client.get("/api/account", headers=owner.headers).get_json()["id"]
    return f"{_make_org(client, owner)}/members/{me}"


def _make_org_invite(client, owner):
    org = _make_org(client, owner)
    r = client.post(f"/api/orgs/{org}/invites", json={"email": "invitee@example.com", "role": "viewer"},
                    headers=owner.headers)
    return f"{org}/invites/{r.get_json()['id']}"


# (method, OpenAPI path) -> (creator, path template, verify-unchanged request[, JSON body,
# the owner's success status (default 200)])
CASES = {
    ("patch", "/api/keys/{key_id}"): (_make_key, "/api/keys/{id}", ("get", "/api/keys"),
                                      {"spend_limit_cents": 5}),
    ("post", "/api/keys/{key_id}/rotate"): (_make_key, "/api/keys/{id}/rotate", ("get", "/api/keys"),
                                            {"overlap_seconds": 60}, 201),
    ("post", "/api/agent/{agent_id}/fund"): (_make_agent, "/api/agent/{id}/fund", ("get", "/api/account"),
                                             {"amount_cents": 1}),
    ("delete", "/api/keys/{key_id}"): (_make_key, "/api/keys/{id}", ("get", "/api/keys")),
    ("delete", "/api/provider-keys/{key_id}"): (_make_provider_key, "/api/provider-keys/{id}",
                                                ("get", "/api/provider-keys")),
    ("delete", "/api/alerts/{alert_id}"): (_make_alert, "/api/alerts/{id}", ("get", "/api/alerts")),
    ("get", "/api/agent/{agent_id}/usage"): (_make_agent, "/api/agent/{id}/usage", None),
    ("get", "/api/pay/checkout/{payment_id}"): (_make_checkout, "/api/pay/checkout/{id}", None),
    ("get", "/api/pay/invoices/{invoice_id}"): (_make_invoice, "/api/pay/invoices/{id}", ("get", "/api/pay/invoices")),
    ("get", "/api/pay/invoices/{invoice_id}.pdf"): (_make_invoice, "/api/pay/invoices/{id}.pdf",
                                                    ("get", "/api/pay/invoices")),
    ("post", "/api/pay/methods/{payment_method_id}/default"): (_save_method, "/api/pay/methods/{id}/default",
                                                              ("get", "/api/pay/methods")),
    ("delete", "/api/pay/methods/{payment_method_id}"): (_save_method, "/api/pay/methods/{id}",
                                                        ("get", "/api/pay/methods")),
    ("post", "/api/pay/checkout/{payment_id}/cancel"): (_make_checkout, "/api/pay/checkout/{id}/cancel",
                                                       ("get", "/api/pay/history")),
    ("get", "/api/agent/{agent_id}/earnings"): (_make_agent, "/api/agent/{id}/earnings", None),
    # that the intruder's DELETE disabled nothing: test_agent_disable.py (the session still works)
    ("delete", "/api/agent/{agent_id}"): (_make_agent, "/api/agent/{id}", None),
    ("get", "/api/orgs/{org_id}"): (_make_org, "/api/orgs/{id}", ("get", "/api/orgs")),
    ("get", "/api/orgs/{org_id}/members"): (_make_org, "/api/orgs/{id}/members", None),
    ("patch", "/api/orgs/{org_id}/members/{member_id}"): (_make_org_member, "/api/orgs/{id}", None,
                                                          {"role": "owner"}),
    # the owner reaches it: 409 last_owner (the only owner cannot leave)
    ("delete", "/api/orgs/{org_id}/members/{member_id}"): (_make_org_member, "/api/orgs/{id}",
                                                           ("get", "/api/orgs"), None, 409),
    ("get", "/api/orgs/{org_id}/invites"): (_make_org, "/api/orgs/{id}/invites", None),
    ("get", "/api/orgs/{org_id}/audit"): (_make_org, "/api/orgs/{id}/audit", None),
    ("post", "/api/orgs/{org_id}/invites"): (_make_org, "/api/orgs/{id}/invites", ("get", "/api/orgs"),
                                             {"email": "someone@example.com", "role": "viewer"}, 201),
    ("delete", "/api/orgs/{org_id}/invites/{invite_id}"): (_make_org_invite, "/api/orgs/{id}", None),
}
# Id-taking routes whose objects are not owned by an account (shared catalog, operator
# review) or whose id is itself the credential: e-mail tokens and the hosted checkout page,
# which like Stripe's is addressed by an unguessable session id (~143 random bits).
NOT_OWNED = {
    ("post", "/v1/module/{slug}/call"), ("get", "/api/modules/{slug}"), ("get", "/v1/models/{model_id}"),
    ("post", "/api/admin/modules/{slug}/approve"), ("post", "/api/admin/modules/{slug}/reject"),
    ("get", "/email/unsubscribe/{token}"), ("post", "/email/unsubscribe/{token}"),
    ("get", "/pay/sandbox/checkout/{session_id}"), ("post", "/pay/sandbox/checkout/{session_id}"),
    ("post", "/api/orgs/invites/{token}/accept"),  # the invitation's token, and the address must be the caller's
}


def test_every_id_route_is_covered(client):
    spec = client.get("/openapi.json").get_json()
    for path, ops in spec["paths"].items():
        if "{" not in path:
            continue
        for method in ops:
            if method in ("get", "post", "put", "patch", "delete"):
                key = (method, path)
                assert key in CASES or key in NOT_OWNED, f"{method.upper()} {path}: add it to the BOLA matrix"


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: f"{c[0]} {c[1]}")
def test_other_accounts_object_is_404(client, make_account, case):
    owner, intruder = make_account(), make_account()
    creator, template, check, *rest = CASES[case]
    body = rest[0] if rest else None
    ok = rest[1] if len(rest) > 1 else 200
    object_id = creator(client, owner)
    url = template.format(id=object_id)
    before = client.open(check[1], method=check[0].upper(), headers=owner.headers).get_json() if check else None
    r = client.open(url, method=case[0].upper(), headers=intruder.headers, json=body)
    assert r.status_code == 404 and r.get_json()["error"] == "not_found", (case, r.status_code)
    if check:
        after = client.open(check[1], method=check[0].upper(), headers=owner.headers).get_json()
        assert after == before
    # The owner still reaches it (the 404 above is about ownership, not a bad id).
    assert client.open(url, method=case[0].upper(), headers=owner.headers, json=body).status_code == ok
