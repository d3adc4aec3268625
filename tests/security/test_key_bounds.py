"""Issue 42 items 1–2: a credential cannot widen its own limits or scopes (a key creates,
changes and rotates only keys within its own scopes, spend limit and expiry; the console's
owner keeps full power), and the 100-key cap holds through rotations."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from app.extensions import db
from app.services.accounts import keys
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401


def _post(client, bearer, path, body, method="post"):
    return getattr(client, method)(path, json=body, headers={"Authorization": f"Bearer {bearer}"})


def _key(client, acct, **body):
    r = client.post("/api/keys", json={"name": "k", **body}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def test_a_limited_key_cannot_lift_its_own_limit(client, account):
    lim = _key(client, account, spend_limit_cents=7, spend_limit_period="week")
    for body in ({"spend_limit_cents": None}, {"spend_limit_cents": 8}, {"spend_limit_period": "day"}):
        r = _post(client, lim["key"], f"/api/keys/{lim['id']}", body, "patch")
        assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits", (body, r.get_json())
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    assert (listed[lim["id"]]["spend_limit_cents"], listed[lim["id"]]["spend_limit_period"]) == (7, "week")
    # within its own: lower, or the same amount over a longer period
    assert _post(client, lim["key"], f"/api/keys/{lim['id']}", {"spend_limit_cents": 5}, "patch").status_code == 200
    r = _post(client, lim["key"], f"/api/keys/{lim['id']}", {"spend_limit_period": "month"}, "patch")
    assert r.status_code == 200 and r.get_json()["spend_limit_period"] == "month"


def test_a_limited_key_cannot_mint_an_unlimited_or_larger_key(client, account):
    lim = _key(client, account, spend_limit_cents=7, spend_limit_period="week")
    r = _post(client, lim["key"], "/api/keys", {"name": "child"})
    assert r.status_code == 201  # no limit asked: it inherits the creator's
    assert (r.get_json()["spend_limit_cents"], r.get_json()["spend_limit_period"]) == (7, "week")
    for body in ({"spend_limit_cents": 8, "spend_limit_period": "week"},
                 {"spend_limit_cents": 7, "spend_limit_period": "day"}):
        r = _post(client, lim["key"], "/api/keys", {"name": "child", **body})
        assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits", body
    r = _post(client, lim["key"], "/api/keys", {"name": "c", "spend_limit_cents": 3, "spend_limit_period": "month"})
    assert r.status_code == 201
    # nor lift another key's limit, nor rotate an unlimited key into a new unlimited one
    child = r.get_json()
    r = _post(client, lim["key"], f"/api/keys/{child['id']}", {"spend_limit_cents": None}, "patch")
    assert r.status_code == 403
    free = _key(client, account)
    r = _post(client, lim["key"], f"/api/keys/{free['id']}/rotate", {})
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits"
    assert len(client.get("/api/keys", headers=account.headers).get_json()["keys"]) == 5


def test_a_key_cannot_grant_a_scope_it_lacks_nor_rotate_a_broader_key(client, account):
    narrow = _key(client, account, scopes=["keys:read", "keys:write"])
    r = _post(client, narrow["key"], "/api/keys", {"name": "x", "scopes": ["call:write"]})
    assert r.status_code == 403 and r.get_json()["error"] == "insufficient_scope"
    r = _post(client, narrow["key"], "/api/keys", {"name": "x"})
    assert r.status_code == 201 and sorted(r.get_json()["scopes"]) == ["keys:read", "keys:write"]
    broad = _key(client, account)
    r = _post(client, narrow["key"], f"/api/keys/{broad['id']}/rotate", {})
    assert r.status_code == 403


def test_an_expiring_key_mints_keys_that_expire_no_later(client, account):
    soon = datetime.now(timezone.utc) + timedelta(days=2)
    exp = _key(client, account, expires_at=soon.isoformat())
    r = _post(client, exp["key"], "/api/keys", {"name": "x"})
    assert r.status_code == 201
    assert datetime.fromisoformat(r.get_json()["expires_at"]) == datetime.fromisoformat(exp["expires_at"])
    r = _post(client, exp["key"], "/api/keys", {"name": "x", "expires_at": (soon + timedelta(days=1)).isoformat()})
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits"
    r = _post(client, exp["key"], f"/api/keys/{exp['id']}/rotate", {})
    assert r.status_code == 201 and r.get_json()["expires_at"] is not None
    assert datetime.fromisoformat(r.get_json()["expires_at"]) <= soon + timedelta(seconds=1)


def test_the_console_owner_keeps_full_power(app, client, account):
    lim = _key(client, account, spend_limit_cents=7, spend_limit_period="day")
    with app.app_context():  # what the console calls: no creating key
        row = keys.update_key(account.id, lim["id"], {"spend_limit_cents": None}, "live")
        assert row.spend_limit_micros is None
        row, _ = keys.create_key(account.id, "big", None, creator_scopes=frozenset({"keys:read"}),
                                 creator_mode="live", spend_limit_cents=10**6)
        assert row.spend_limit_micros == 10**6 * 10_000
        db.session.remove()


@pytest.mark.parametrize("overlap", [86_400, 1])
def test_rotations_cannot_pass_the_key_cap(app, client, account, overlap):
    with app.app_context():
        for i in range(keys.MAX_ACTIVE_KEYS - 1):  # the account's own key makes 100
            keys.mint(account.id, f"k{i}", ["keys:read"])
        db.session.remove()
    ids = [k["id"] for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]]
    assert len(ids) == keys.MAX_ACTIVE_KEYS
    r = client.post(f"/api/keys/{ids[0]}/rotate", json={"overlap_seconds": overlap}, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "key_limit_reached"
    # without overlap the old key stops at once: the rotation fits
    r = client.post(f"/api/keys/{ids[0]}/rotate", json={"overlap_seconds": 0}, headers=account.headers)
    assert r.status_code == 201
    assert len(client.get("/api/keys", headers=account.headers).get_json()["keys"]) == keys.MAX_ACTIVE_KEYS


def test_a_controlled_key_cannot_widen_its_own_controls_nor_mint_a_wider_key(client, make_account):
    """The per-key controls (issue 39 item 5) are bounds like the spend limit: a key limited
    to one model and 10 requests a minute could lift both with ``keys:write`` (PATCH itself,
    or mint a key without them). Now only narrower is allowed; a key it makes inherits them."""
    account = make_account(plan="enterprise")  # a burst of 13 requests: past starter's 10/s
    ctl = _key(client, account, allowed_models=["m-small"], allowed_modules=["svc"], rpm_limit=10, tpm_limit=1000)
    for body in ({"allowed_models": None}, {"allowed_models": ["m-small", "m-big"]}, {"allowed_modules": None},
                 {"rpm_limit": None}, {"rpm_limit": 11}, {"tpm_limit": 1001}):
        r = _post(client, ctl["key"], f"/api/keys/{ctl['id']}", body, "patch")
        assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits", (body, r.get_json())
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    assert (listed[ctl["id"]]["allowed_models"], listed[ctl["id"]]["rpm_limit"]) == (["m-small"], 10)
    r = _post(client, ctl["key"], "/api/keys", {"name": "wider", "allowed_models": ["m-big"]})
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits"
    child = _post(client, ctl["key"], "/api/keys", {"name": "child"}).get_json()  # inherits the controls
    assert (child["allowed_models"], child["allowed_modules"], child["rpm_limit"], child["tpm_limit"]) == (
        ["m-small"], ["svc"], 10, 1000)
    # narrower is fine
    r = _post(client, ctl["key"], f"/api/keys/{ctl['id']}", {"rpm_limit": 5, "allowed_models": []}, "patch")
    assert r.status_code == 200 and (r.get_json()["rpm_limit"], r.get_json()["allowed_models"]) == (5, [])
    # the owner (console, or a key without controls) is not bounded by them
    assert client.patch(f"/api/keys/{ctl['id']}", json={"rpm_limit": None},
                        headers=account.headers).status_code == 200


def test_changing_the_period_carries_the_count_over(app, client, make_account, mod, ledger_clean):
    """A key limited to 3 cents a day that had spent them switched itself to `week`, then
    `month`, then `total` (each no shorter: allowed) and each switch started a counter at
    zero: 12 cents in one day against its 3-cent daily limit. The count of the period it
    leaves now carries over to the new period's counter (as a rotation carries it), so a
    switch never frees room in the current period. The owner shortening a period is held
    the same way: a child limited to 3 a week that spent them today gets no fresh day."""
    acct = make_account(cents=100, plan="pro")
    lim = _key(client, acct, spend_limit_cents=3, spend_limit_period="day")
    assert call(client, acct, {"action": "ok"}, bearer=lim["key"]).status_code == 200  # 3 of 3
    for period in ("week", "month", "total"):
        r = _post(client, lim["key"], f"/api/keys/{lim['id']}", {"spend_limit_period": period}, "patch")
        assert r.status_code == 200 and r.get_json()["spent_cents"] == 3, (period, r.get_json())
        r = call(client, acct, {"action": "ok"}, bearer=lim["key"])
        assert r.status_code == 402 and r.get_json()["error"] == "key_spend_limit_reached", (period, r.get_json())
    weekly = _key(client, acct, spend_limit_cents=3, spend_limit_period="week")
    assert call(client, acct, {"action": "ok"}, bearer=weekly["key"]).status_code == 200
    r = client.patch(f"/api/keys/{weekly['id']}", json={"spend_limit_period": "day"}, headers=acct.headers)
    assert r.status_code == 200 and r.get_json()["spent_cents"] == 3
    assert call(client, acct, {"action": "ok"}, bearer=weekly["key"]).status_code == 402
    assert balance_cents(app, acct.id) == 100 - 6
    ledger_clean()


def test_a_retiring_key_is_bounded_by_its_rotations_limit(app, client, make_account, mod, ledger_clean):
    """A rotated key in its overlap charges under its rotation's newest key's limit (one limit
    per rotation: a limit the owner sets on the new key holds the old key too), but as a
    creator it was judged by its own row, which had none: the old key minted a key without
    any limit (working until the overlap's end) next to a 3-cent daily budget it could no
    longer spend itself. Its bound is now the limit its charges are counted under."""
    acct = make_account(cents=100, plan="pro")
    old = _key(client, acct)
    new = _post(client, acct.key, f"/api/keys/{old['id']}/rotate", {"overlap_seconds": 3600}).get_json()
    r = _post(client, acct.key, f"/api/keys/{new['id']}", {"spend_limit_cents": 3, "spend_limit_period": "day"},
              "patch")
    assert r.status_code == 200
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 402
    r = _post(client, old["key"], "/api/keys", {"name": "escape"})
    assert r.status_code == 201 and (r.get_json()["spend_limit_cents"], r.get_json()["spend_limit_period"]) == (
        3, "day"), r.get_json()
    r = _post(client, old["key"], "/api/keys", {"name": "bigger", "spend_limit_cents": 4})
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits"
    # its own allow-lists it still narrows: judged under the limit it counts under, as it is
    # (its rpm/tpm are its successor's: 409 key_retiring)
    r = _post(client, old["key"], f"/api/keys/{old['id']}", {"allowed_modules": ["ok"]}, "patch")
    assert r.status_code == 200 and r.get_json()["allowed_modules"] == ["ok"], r.get_json()
    r = _post(client, old["key"], f"/api/keys/{old['id']}", {"rpm_limit": 5}, "patch")
    assert r.status_code == 409 and r.get_json()["error"] == "key_retiring"
    ledger_clean()


def test_a_key_changes_only_keys_within_its_scopes(client, account):
    """Issue 42: a key may edit only keys whose scopes are within its own. Rotation held
    it (403), but PATCH did not: a key with only `keys:write` lifted the spend limit of a
    key that may call modules (`call:write`), a budget the budgeted key cannot lift itself."""
    manager = _key(client, account, scopes=["keys:read", "keys:write"])
    caller = _key(client, account, scopes=["call:write"], spend_limit_cents=5, spend_limit_period="day")
    for body in ({"spend_limit_cents": None}, {"spend_limit_cents": 500}, {"rpm_limit": 5}):
        r = _post(client, manager["key"], f"/api/keys/{caller['id']}", body, "patch")
        assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits", (body, r.get_json())
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    assert (listed[caller["id"]]["spend_limit_cents"], listed[caller["id"]]["rpm_limit"]) == (5, None)
    # a key of scopes within its own it changes
    peer = _key(client, account, scopes=["keys:read"])
    assert _post(client, manager["key"], f"/api/keys/{peer['id']}", {"rpm_limit": 5}, "patch").status_code == 200


def test_a_key_revokes_only_keys_within_its_scopes(client, account):
    """A key with only `keys:write` revoked the account's full-scope keys (its owner's root
    key included): a leaked narrow key could lock the owner out of the API. A key now revokes
    only keys whose scopes are within its own (as PATCH and rotate); itself always; the
    console's owner any."""
    manager = _key(client, account, scopes=["keys:read", "keys:write"])
    wide = _key(client, account)  # every scope of the account's key
    r = client.delete(f"/api/keys/{wide['id']}", headers={"Authorization": f"Bearer {manager['key']}"})
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits", r.get_json()
    assert "call:write" in r.get_json()["message"]
    assert client.get("/api/keys", headers={"Authorization": f"Bearer {wide['key']}"}).status_code == 200
    peer = _key(client, account, scopes=["keys:read"])
    for target in (peer, manager):  # within its scopes, and itself
        r = client.delete(f"/api/keys/{target['id']}", headers={"Authorization": f"Bearer {manager['key']}"})
        assert r.status_code == 200 and r.get_json() == {"revoked": True, "id": target["id"]}, r.get_json()
    assert client.get("/api/keys", headers={"Authorization": f"Bearer {manager['key']}"}).status_code == 401


def test_a_limited_key_may_give_a_key_a_limit_and_a_control_at_once(client, account):
    """The result of a PATCH is what must be within the acting key's bounds: a key limited to
    5 cents a day setting 5 a day and an rpm limit on an unlimited key in one request was
    refused (403: the controls were checked against the key's limit before the change), while
    the same two changes one after the other were accepted."""
    lim = _key(client, account, spend_limit_cents=5, spend_limit_period="day")
    free = _key(client, account)
    r = _post(client, lim["key"], f"/api/keys/{free['id']}",
              {"spend_limit_cents": 5, "spend_limit_period": "day", "rpm_limit": 10}, "patch")
    assert r.status_code == 200, r.get_json()
    assert (r.get_json()["spend_limit_cents"], r.get_json()["spend_limit_period"], r.get_json()["rpm_limit"]) == (
        5, "day", 10)
    r = _post(client, lim["key"], f"/api/keys/{free['id']}", {"spend_limit_cents": 6, "rpm_limit": 9}, "patch")
    assert r.status_code == 403 and r.get_json()["error"] == "beyond_own_limits"
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    assert (listed[free["id"]]["spend_limit_cents"], listed[free["id"]]["rpm_limit"]) == (5, 10)


def test_a_limited_key_cannot_move_money_past_its_limit_to_an_agent(app, client, make_account, mod, ledger_clean):
    """A key limited to 5 cents a day (created without `scopes`, so with every scope of its
    creator) registered an agent with a keypair of its own and funded it with 300 cents of
    the account's balance: the agent's sessions are not key-limited, so the budget was
    spent through them. Moving money to an agent is spending by the key: it counts against
    the key's limit like a call (402 `key_spend_limit_reached` past it; nothing moved)."""
    from tests import agentkit

    acct = make_account(cents=1000, plan="pro")
    lim = _key(client, acct, spend_limit_cents=5, spend_limit_period="day")
    bearer = {"Authorization": f"Bearer {lim['key']}"}
    agent = client.post("/api/agent/register", json={"name": "bot", "pubkey": agentkit.Keypair().pubkey},
                        headers=bearer).get_json()
    fund = lambda cents: client.post(f"/api/agent/{agent['id']}/fund",  # noqa: E731
                                     json={"amount_cents": cents}, headers=bearer)
    r = fund(300)
    assert r.status_code == 402 and r.get_json()["error"] == "key_spend_limit_reached", r.get_json()
    assert balance_cents(app, acct.id) == 1000
    assert fund(2).status_code == 200  # within: counted, 2 of 5
    r = call(client, acct, {"action": "ok"}, bearer=lim["key"])  # 3 more would be 5 of 5: fits
    assert r.status_code == 200
    assert fund(1).status_code == 402 and call(client, acct, {"action": "ok"}, bearer=lim["key"]).status_code == 402
    assert balance_cents(app, acct.id) == 1000 - 5
    # the owner's own key (no limit) funds as before
    assert client.post(f"/api/agent/{agent['id']}/fund", json={"amount_cents": 300},
                       headers=acct.headers).status_code == 200
    ledger_clean()
