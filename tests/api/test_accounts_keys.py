"""Endpoints 2–5: account and keys, with the bad inputs around them."""
from __future__ import annotations

import pytest

from app.ids import checksum


def test_account_shape(client, account):
    r = client.get("/api/account", headers=account.headers)
    assert r.status_code == 200
    body = r.get_json()
    assert set(body) == {"id", "email", "plan", "balance_cents", "agent_id", "kind", "name", "actor"}
    assert body["id"] == account.id and body["plan"] == "starter"
    assert body["kind"] == "human" and body["name"] is None  # organisations: tests/api/test_orgs.py
    assert body["actor"]["account_id"] == account.id and body["actor"]["org_role"] is None
    assert body["balance_cents"] == 1000 and body["agent_id"] is None
    assert r.headers["X-Request-Id"]


@pytest.mark.parametrize("header", [
    None, "Bearer", "Bearer ", "Basic abc", "Bearer garbage", "Bearer svc_live_short",
    "Bearer svc_sess_" + "a" * 38, "Bearer " + "x" * 5000,
])
def test_bad_credentials_are_401(client, header):
    headers = {"Authorization": header} if header is not None else {}
    r = client.get("/api/account", headers=headers)
    assert r.status_code == 401
    assert r.get_json()["error"] == "unauthorized"
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert r.get_json()["request_id"] == r.headers["X-Request-Id"]


def test_wrong_checksum_is_401(client, account):
    body = account.key[:-6]
    bad = body[:-1] + ("A" if body[-1] != "A" else "B")
    tampered = bad + checksum(bad)[:-1] + "0"
    assert client.get("/api/account", headers={"Authorization": f"Bearer {tampered}"}).status_code == 401
    # Right checksum over a random body that was never issued: also 401.
    forged = bad + checksum(bad)
    assert client.get("/api/account", headers={"Authorization": f"Bearer {forged}"}).status_code == 401


# The Key resource: SPEC's fields plus issue 16's spend limit and expiry.
KEY_FIELDS = {"id", "name", "prefix", "scopes", "last_used_at", "spend_limit_cents", "spend_limit_period",
              "spent_cents", "expires_at", "allowed_models", "allowed_modules", "rpm_limit", "tpm_limit",
              "org_id", "member_id"}  # organisation keys (tests/api/test_orgs.py); null on personal keys


def test_key_lifecycle(client, account):
    r = client.post("/api/keys", json={"name": "ci", "scopes": ["call:read"]}, headers=account.headers)
    assert r.status_code == 201
    created = r.get_json()
    assert set(created) == KEY_FIELDS | {"key"}
    assert created["key"].startswith("svc_live_") and created["key"].startswith(created["prefix"])
    assert created["scopes"] == ["call:read"]

    listed = client.get("/api/keys", headers=account.headers).get_json()["keys"]
    assert {k["id"] for k in listed} >= {created["id"]}
    assert all("key" not in k for k in listed)
    assert all(set(k) == KEY_FIELDS for k in listed)

    new_headers = {"Authorization": f"Bearer {created['key']}"}
    # call:read only: cannot read the account or list keys.
    r = client.get("/api/account", headers=new_headers)
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"

    r = client.delete(f"/api/keys/{created['id']}", headers=account.headers)
    assert r.status_code == 200 and r.get_json() == {"revoked": True, "id": created["id"]}
    assert client.delete(f"/api/keys/{created['id']}", headers=account.headers).status_code == 200
    assert client.get("/api/usage/current", headers=new_headers).status_code in (401, 404)
    assert client.get("/api/account", headers=new_headers).status_code == 401
    listed = client.get("/api/keys", headers=account.headers).get_json()["keys"]
    assert created["id"] not in {k["id"] for k in listed}


def test_key_defaults_to_creator_scopes_and_cannot_escalate(client, account):
    r = client.post("/api/keys", json={"name": "limited", "scopes": ["keys:write", "call:read"]},
                    headers=account.headers)
    limited = {"Authorization": f"Bearer {r.get_json()['key']}"}
    r = client.post("/api/keys", json={"name": "child"}, headers=limited)
    assert r.status_code == 201 and r.get_json()["scopes"] == ["call:read", "keys:write"]
    r = client.post("/api/keys", json={"name": "escalate", "scopes": ["call:write"]}, headers=limited)
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"


def test_other_accounts_key_is_404(client, make_account):
    a, b = make_account(), make_account()
    key_id = client.get("/api/keys", headers=a.headers).get_json()["keys"][0]["id"]
    r = client.delete(f"/api/keys/{key_id}", headers=b.headers)
    assert r.status_code == 404 and r.get_json()["error"] == "not_found"
    assert client.get("/api/account", headers=a.headers).status_code == 200


@pytest.mark.parametrize("body,field", [
    ({}, "name"), ({"name": ""}, "name"), ({"name": 5}, "name"), ({"name": "x" * 101}, "name"),
    ({"name": "k", "scopes": ["root"]}, "scopes"), ({"name": "k", "scopes": "call:read"}, "scopes"),
    ({"name": "k", "extra": 1}, "extra"),
])
def test_key_validation(client, account, body, field):
    r = client.post("/api/keys", json=body, headers=account.headers)
    assert r.status_code == 400
    assert r.get_json()["error"] == "invalid_request" and field in r.get_json()["message"]


def test_last_used_is_batched(app, client, account):
    from app import auth
    from app.extensions import db
    from app.models import ApiKey

    client.get("/api/account", headers=account.headers)
    with app.app_context():
        assert all(k.last_used_at is None for k in ApiKey.query.filter_by(account_id=account.id))
        assert auth.flush_last_used() >= 1
        used = [k for k in ApiKey.query.filter_by(account_id=account.id) if k.last_used_at]
        assert len(used) == 1
        db.session.remove()
    listed = client.get("/api/keys", headers=account.headers).get_json()["keys"]
    assert any(k["last_used_at"] for k in listed)
