"""Issue 16 items 3–4 over HTTP: per-key spend limits (refused before charging, refunds
give room back, PATCH), expiry, rotation, the 100-key cap, and bad input changing nothing."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from app.services.money import spend
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401


def _key(client, acct, **body):
    r = client.post("/api/keys", json={"name": "k", **body}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    return r.get_json()


def _rotated_then_limited(client, acct, period: str) -> tuple[dict, dict]:
    """(old, new): a key without a limit rotated with an hour's overlap, then the new key
    given 6 cents per ``period`` by the owner (which holds the old key too)."""
    old = _key(client, acct)
    new = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 3600},
                      headers=acct.headers).get_json()
    r = client.patch(f"/api/keys/{new['id']}", json={"spend_limit_cents": 6, "spend_limit_period": period},
                     headers=acct.headers)
    assert r.status_code == 200, r.get_json()
    return old, new


def test_spend_limit_refuses_before_charging_and_refund_gives_room_back(app, client, make_account, mod):
    acct = make_account(cents=100, plan="pro")  # its keys share the plan's rate limit: more than 10/s here
    key = _key(client, acct, spend_limit_cents=6, spend_limit_period="day")
    assert (key["spend_limit_cents"], key["spend_limit_period"], key["spent_cents"]) == (6, "day", 0)
    assert call(client, acct, {"action": "ok"}, bearer=key["key"]).status_code == 200
    assert call(client, acct, {"action": "ok"}, bearer=key["key"]).status_code == 200
    r = call(client, acct, {"action": "ok"}, bearer=key["key"])
    body = r.get_json()
    assert r.status_code == 402 and body["error"] == "key_spend_limit_reached"
    assert (body["limit_cents"], body["spent_cents"], body["period"]) == (6, 6, "day")
    assert body["resets_at"].endswith("T00:00:00Z") and "6 cents per day" in body["message"]
    assert balance_cents(app, acct.id) == 94  # the refused call charged nothing
    # A failed (refunded) call gives its room back: 1 cent left after "boom" is refunded.
    client.patch(f"/api/keys/{key['id']}", json={"spend_limit_cents": 9}, headers=acct.headers)
    assert call(client, acct, {"action": "boom"}, bearer=key["key"]).status_code == 502
    listed = {k["id"]: k for k in client.get("/api/keys", headers=acct.headers).get_json()["keys"]}
    assert listed[key["id"]]["spent_cents"] == 6 and listed[key["id"]]["spend_limit_cents"] == 9
    assert call(client, acct, {"action": "ok"}, bearer=key["key"]).status_code == 200
    assert call(client, acct, {"action": "text"}, bearer=key["key"]).status_code == 402
    # Removing the limit lets it spend again.
    r = client.patch(f"/api/keys/{key['id']}", json={"spend_limit_cents": None}, headers=acct.headers)
    assert r.get_json()["spend_limit_cents"] is None and r.get_json()["spent_cents"] is None
    assert call(client, acct, {"action": "text"}, bearer=key["key"]).status_code == 200


def test_period_boundaries_are_utc(ctx):
    """As the engine computes them (``gw_period_bounds``), whatever the caller's zone."""
    at = datetime(2026, 3, 4, 23, 30, tzinfo=timezone(timedelta(hours=-5)))  # 2026-03-05 04:30 UTC, Thursday
    assert spend.period_bounds("day", at)[0] == datetime(2026, 3, 5, tzinfo=timezone.utc)
    assert spend.period_bounds("week", at) == (datetime(2026, 3, 2, tzinfo=timezone.utc),
                                               datetime(2026, 3, 9, tzinfo=timezone.utc))
    assert spend.period_bounds("month", at) == (datetime(2026, 3, 1, tzinfo=timezone.utc),
                                                datetime(2026, 4, 1, tzinfo=timezone.utc))
    assert spend.period_bounds("month", datetime(2026, 12, 31, tzinfo=timezone.utc))[1].year == 2027
    assert spend.period_bounds("total", at) == (spend.EPOCH, None)


@pytest.mark.parametrize("body", [
    {"spend_limit_cents": 0}, {"spend_limit_cents": -5}, {"spend_limit_cents": 1.5},
    {"spend_limit_cents": "5"}, {"spend_limit_cents": 10**12}, {"spend_limit_cents": 5, "spend_limit_period": "year"},
    {"spend_limit_period": "day"}, {"expires_at": "not a date"},
])
def test_bad_key_input_is_400_and_creates_nothing(client, account, body):
    before = client.get("/api/keys", headers=account.headers).get_json()["keys"]
    r = client.post("/api/keys", json={"name": "bad", **body}, headers=account.headers)
    assert r.status_code == 400 and r.get_json()["error"] == "invalid_request"
    assert client.get("/api/keys", headers=account.headers).get_json()["keys"] == before


def test_patch_and_rotate_bad_input_and_other_accounts(client, make_account):
    a, b = make_account(), make_account()
    key = _key(client, a, spend_limit_cents=5)
    assert key["spend_limit_period"] == "month"
    for body in ({"spend_limit_cents": 0}, {"spend_limit_period": "hour"}, {}):
        assert client.patch(f"/api/keys/{key['id']}", json=body, headers=a.headers).status_code == 400
    for bad in (-1, 604_801, 1.5):
        r = client.post(f"/api/keys/{key['id']}/rotate", json={"overlap_seconds": bad}, headers=a.headers)
        assert r.status_code == 400
    assert client.patch(f"/api/keys/{key['id']}", json={"spend_limit_cents": 9}, headers=b.headers).status_code == 404
    assert client.post(f"/api/keys/{key['id']}/rotate", json={}, headers=b.headers).status_code == 404
    listed = {k["id"]: k for k in client.get("/api/keys", headers=a.headers).get_json()["keys"]}
    assert listed[key["id"]]["spend_limit_cents"] == 5  # nothing changed


def test_expired_key_is_401_like_a_revoked_one(app, client, account):
    key = _key(client, account, expires_at=(datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat())
    headers = {"Authorization": f"Bearer {key['key']}"}
    assert client.get("/api/account", headers=headers).status_code == 200  # cached with its expiry
    import time
    time.sleep(1.2)
    r = client.get("/api/account", headers=headers)
    assert r.status_code == 401 and r.get_json()["error"] == "unauthorized"
    assert key["id"] not in {k["id"] for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}


def test_rotation_overlap_then_old_key_stops(client, account):
    old = _key(client, account, scopes=["account:read", "keys:read"], spend_limit_cents=7, spend_limit_period="week")
    r = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 0}, headers=account.headers)
    new = r.get_json()
    assert r.status_code == 201 and new["id"] != old["id"] and new["key"] != old["key"]
    assert (new["name"], new["scopes"], new["spend_limit_cents"], new["spend_limit_period"]) == \
        ("k", ["account:read", "keys:read"], 7, "week")
    assert client.get("/api/account", headers={"Authorization": f"Bearer {old['key']}"}).status_code == 401
    assert client.get("/api/account", headers={"Authorization": f"Bearer {new['key']}"}).status_code == 200
    r = client.post(f"/api/keys/{old['id']}/rotate", json={}, headers=account.headers)
    assert r.status_code == 404  # an expired key cannot be rotated again
    # Default overlap: one day.
    again = client.post(f"/api/keys/{new['id']}/rotate", json={}, headers=account.headers).get_json()
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    left = datetime.fromisoformat(listed[new["id"]]["expires_at"]) - datetime.now(timezone.utc)
    assert timedelta(hours=23, minutes=59) < left <= timedelta(days=1) and again["id"] in listed
    # a key in its overlap is retiring: rotating it again would mint a key and retire none
    # (it got 201 before, each time: past the 100-key cap, keys that never expire)
    r = client.post(f"/api/keys/{new['id']}/rotate", json={}, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "key_already_rotated", r.get_json()
    assert again["id"] in r.get_json()["message"]
    assert len(client.get("/api/keys", headers=account.headers).get_json()["keys"]) == len(listed)


def test_at_most_100_active_keys(app, client, account):
    from app.services.accounts import keys

    with app.app_context():
        for i in range(99):  # the account fixture already has one key
            keys.mint(account.id, f"k{i}", ["call:read"])
    r = client.post("/api/keys", json={"name": "one too many"}, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "key_limit_reached"
    victim = client.get("/api/keys", headers=account.headers).get_json()["keys"][-2]
    client.delete(f"/api/keys/{victim['id']}", headers=account.headers)
    assert client.post("/api/keys", json={"name": "room again"}, headers=account.headers).status_code == 201


def test_rotation_keeps_the_expiry(client, account):
    """Issue 40: a key expiring on 2026-12-27 rotated into a key that never expired."""
    expiry = (datetime.now(timezone.utc) + timedelta(days=30)).replace(microsecond=0)
    old = _key(client, account, expires_at=expiry.isoformat())
    new = client.post(f"/api/keys/{old['id']}/rotate", json={}, headers=account.headers).get_json()
    assert datetime.fromisoformat(new["expires_at"]) == datetime.fromisoformat(old["expires_at"]) == expiry
    plain = _key(client, account)
    assert client.post(f"/api/keys/{plain['id']}/rotate", json={}, headers=account.headers).get_json()[
        "expires_at"] is None


def test_rotate_without_a_body_uses_the_default_overlap(client, account):
    old = _key(client, account)
    r = client.post(f"/api/keys/{old['id']}/rotate", headers=account.headers)
    assert r.status_code == 201 and r.get_json()["name"] == "k"


def test_rotate_refuses_a_body_that_is_not_json(client, account):
    """The body is optional, but a body that is there must be JSON (schemathesis found
    random bytes under another media type answered 201 and rotating the key)."""
    key = _key(client, account)
    before = client.get("/api/keys", headers=account.headers).get_json()["keys"]
    for data, ctype, status in ((b"\x00\xffgarbage", "application/octet-stream", 400),
                                (b"overlap_seconds=0", "application/x-www-form-urlencoded", 400),
                                (b"{not json", "application/json", 400),
                                (b"\xff\xfe\x80", "application/json", 400),  # not UTF-8 (schemathesis)
                                (b"   ", "application/json", 400)):
        r = client.post(f"/api/keys/{key['id']}/rotate", data=data, content_type=ctype,
                        headers=account.headers)
        assert r.status_code == status, (ctype, r.status_code, r.get_data(as_text=True))
        assert r.get_json()["error"] == "invalid_request"
    assert client.get("/api/keys", headers=account.headers).get_json()["keys"] == before  # nothing rotated
    assert client.post(f"/api/keys/{key['id']}/rotate", headers=account.headers).status_code == 201  # no body


def test_a_rotated_key_and_its_successor_share_one_spend_limit(app, client, make_account, mod, ledger_clean):
    """Rotation carries this period's count over to the new key, and the old key keeps
    working for the overlap. Each had its own counter, so the same budget was spent twice
    (12 cents charged against a 9-cent daily limit here). The old key's charges now count
    on its successor's counter, refunds give the room back there, and a second rotation
    moves the whole family on."""
    acct = make_account(cents=100, plan="pro")  # two keys, one plan rate limit: more than 10/s here
    old = client.post("/api/keys", json={"name": "lim", "spend_limit_cents": 9, "spend_limit_period": "day"},
                      headers=acct.headers).get_json()
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200  # 3 of 9
    new = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 3600},
                      headers=acct.headers).get_json()
    assert new["spent_cents"] == 3
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200  # 6 of 9
    assert call(client, acct, {"action": "boom"}, bearer=new["key"]).status_code == 502  # refunded: room back
    assert call(client, acct, {"action": "boom"}, bearer=old["key"]).status_code == 502
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200  # 9 of 9
    for bearer in (new["key"], old["key"]):
        r = call(client, acct, {"action": "ok"}, bearer=bearer)
        assert r.status_code == 402 and r.get_json()["error"] == "key_spend_limit_reached", r.get_json()
    assert balance_cents(app, acct.id) == 100 - 9
    listed = {k["id"]: k for k in client.get("/api/keys", headers=acct.headers).get_json()["keys"]}
    assert listed[new["id"]]["spent_cents"] == 9
    # rotating the successor: the first key (still in its overlap) follows to the newest
    newest = client.post(f"/api/keys/{new['id']}/rotate", json={"overlap_seconds": 3600},
                         headers=acct.headers).get_json()
    assert newest["spent_cents"] == 9
    for bearer in (old["key"], new["key"], newest["key"]):
        assert call(client, acct, {"action": "ok"}, bearer=bearer).status_code == 402
    ledger_clean()


def test_a_retiring_key_whose_successor_was_revoked_can_be_rotated(app, client, make_account, mod, ledger_clean):
    """Rotate, then revoke the new key (say it leaked): the old key still works through its
    overlap, but rotating it was 409 "rotate <successor> instead" and rotating the successor
    404 — no way to replace the key but to revoke it. A retiring key whose successor is no
    longer active rotates again; the new key carries the rotation's count (kept on the
    revoked successor's counter), so the limit is still one limit."""
    acct = make_account(cents=100, plan="pro")
    old = client.post("/api/keys", json={"name": "lim", "spend_limit_cents": 9, "spend_limit_period": "day"},
                      headers=acct.headers).get_json()
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200  # 3 of 9
    new = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 3600},
                      headers=acct.headers).get_json()
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200  # 6 of 9
    assert client.delete(f"/api/keys/{new['id']}", headers=acct.headers).status_code == 200
    r = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 3600}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    again = r.get_json()
    assert again["spent_cents"] == 6
    assert call(client, acct, {"action": "ok"}, bearer=again["key"]).status_code == 200  # 9 of 9
    for bearer in (again["key"], old["key"]):
        assert call(client, acct, {"action": "ok"}, bearer=bearer).status_code == 402
    # the old key is retiring again, towards a live successor: 409 as before
    r = client.post(f"/api/keys/{old['id']}/rotate", json={}, headers=acct.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "key_already_rotated"
    assert balance_cents(app, acct.id) == 100 - 9
    ledger_clean()


@pytest.mark.parametrize("expiry_days", [None, 30])
def test_rotating_a_retiring_key_again_keeps_the_rotations_expiry(client, account, expiry_days):
    """A retiring key whose successor was revoked rotates again: the new key got the
    retiring key's own expires_at, i.e. the end of its overlap (an hour here), so the
    replacement of a key that never expired stopped with 401 after the overlap. It keeps
    the rotation's expiry (its successor's: never, or the date the first key had)."""
    expiry = None if expiry_days is None else \
        (datetime.now(timezone.utc) + timedelta(days=expiry_days)).replace(microsecond=0)
    old = _key(client, account, **({} if expiry is None else {"expires_at": expiry.isoformat()}))
    new = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 3600},
                      headers=account.headers).get_json()
    assert client.delete(f"/api/keys/{new['id']}", headers=account.headers).status_code == 200
    r = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 60}, headers=account.headers)
    assert r.status_code == 201, r.get_json()
    again = r.get_json()
    assert again["expires_at"] == (None if expiry is None else new["expires_at"]), again["expires_at"]
    if expiry is not None:
        assert datetime.fromisoformat(again["expires_at"]) == expiry
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    left = datetime.fromisoformat(listed[old["id"]]["expires_at"]) - datetime.now(timezone.utc)
    assert left <= timedelta(seconds=60)  # the retiring key: the new overlap


def test_a_limit_set_on_the_successor_after_a_rotation_holds_the_old_key_too(app, client, make_account, mod,
                                                                               ledger_clean):
    """Rotate a key without a limit, then give the new key one: the old key, still in its
    overlap, spent without being counted (its own row had no limit, so its charges skipped
    the rotation's counter) and the new key's limit did not bound the rotation. The old
    key's charges count on the newest key's counter under the newest key's limit."""
    acct = make_account(cents=100, plan="pro")
    old, new = _rotated_then_limited(client, acct, "day")
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200  # 3 of 6
    assert call(client, acct, {"action": "ok"}, bearer=new["key"]).status_code == 200  # 6 of 6
    for bearer in (old["key"], new["key"]):
        r = call(client, acct, {"action": "ok"}, bearer=bearer)
        assert r.status_code == 402 and r.get_json()["error"] == "key_spend_limit_reached", r.get_json()
    listed = {k["id"]: k for k in client.get("/api/keys", headers=acct.headers).get_json()["keys"]}
    assert listed[new["id"]]["spent_cents"] == 6
    # and removing it from the new key frees the old key too
    client.patch(f"/api/keys/{new['id']}", json={"spend_limit_cents": None}, headers=acct.headers)
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200
    assert balance_cents(app, acct.id) == 100 - 9
    ledger_clean()


def test_a_retiring_keys_spend_limit_is_changed_on_its_successor(client, account):
    """A retiring key's charges count under its successor's limit (one limit per rotation),
    so a PATCH of its own limit was answered 200 with the new value and then never applied.
    Now 409 ``key_retiring`` naming the successor, for its rpm/tpm too (they are the
    successor's since 2026-11-29); its allow-lists still change."""
    old = _key(client, account, spend_limit_cents=500)
    new = client.post(f"/api/keys/{old['id']}/rotate", json={}, headers=account.headers).get_json()
    r = client.patch(f"/api/keys/{old['id']}", json={"spend_limit_cents": 100}, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "key_retiring", r.get_json()
    assert new["id"] in r.get_json()["message"]
    r = client.patch(f"/api/keys/{old['id']}", json={"spend_limit_cents": None}, headers=account.headers)
    assert r.status_code == 409
    listed = {k["id"]: k for k in client.get("/api/keys", headers=account.headers).get_json()["keys"]}
    assert listed[old["id"]]["spend_limit_cents"] == 500  # unchanged
    r = client.patch(f"/api/keys/{old['id']}", json={"rpm_limit": 10}, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == "key_retiring"
    r = client.patch(f"/api/keys/{old['id']}", json={"allowed_modules": ["text"]}, headers=account.headers)
    assert r.status_code == 200 and r.get_json()["allowed_modules"] == ["text"]  # its own allow-lists change
    r = client.patch(f"/api/keys/{new['id']}", json={"spend_limit_cents": 100}, headers=account.headers)
    assert r.status_code == 200 and r.get_json()["spend_limit_cents"] == 100


def test_rotating_again_after_a_revoked_successor_keeps_the_rotations_limit(app, client, make_account, mod,
                                                                            ledger_clean):
    """Rotate a key without a limit, give the new key one (it holds the old key too), then
    revoke the new key (it leaked) and rotate the old one again: the replacement got the old
    key's own row's limit (none) with the revoked key's count, so the budget set on the
    rotation vanished and the replacement spent without bound. It keeps the rotation's limit
    (the revoked successor's: the one the old key's charges were counted under) and count."""
    acct = make_account(cents=100, plan="pro")
    old, new = _rotated_then_limited(client, acct, "week")
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200  # 3 of 6
    assert client.delete(f"/api/keys/{new['id']}", headers=acct.headers).status_code == 200
    r = client.post(f"/api/keys/{old['id']}/rotate", json={"overlap_seconds": 3600}, headers=acct.headers)
    assert r.status_code == 201, r.get_json()
    again = r.get_json()
    assert (again["spend_limit_cents"], again["spend_limit_period"], again["spent_cents"]) == (6, "week", 3)
    assert call(client, acct, {"action": "ok"}, bearer=again["key"]).status_code == 200  # 6 of 6
    for bearer in (again["key"], old["key"]):
        assert call(client, acct, {"action": "ok"}, bearer=bearer).status_code == 402
    # the retiring key may rotate itself too: within the limit it is bound by
    r = client.post(f"/api/keys/{again['id']}/rotate", json={"overlap_seconds": 0},
                    headers={"Authorization": f"Bearer {again['key']}"})
    assert r.status_code == 201 and r.get_json()["spend_limit_cents"] == 6
    assert balance_cents(app, acct.id) == 100 - 6
    ledger_clean()


def test_a_retiring_key_is_listed_with_the_limit_it_counts_under(app, client, make_account, mod, ledger_clean):
    """A retiring key's charges count under its rotation's newest key's limit, but the list
    showed its own row's: `spend_limit_cents: null` for an old key that was refused with 402
    at the new key's limit, and a `spent_cents` that never moved. It shows the limit, period
    and count that apply to it."""
    acct = make_account(cents=100, plan="pro")
    old, new = _rotated_then_limited(client, acct, "day")
    assert call(client, acct, {"action": "ok"}, bearer=old["key"]).status_code == 200
    listed = {k["id"]: k for k in client.get("/api/keys", headers=acct.headers).get_json()["keys"]}
    for key_id in (old["id"], new["id"]):
        shown = listed[key_id]
        assert (shown["spend_limit_cents"], shown["spend_limit_period"], shown["spent_cents"]) == (6, "day", 3), shown
    ledger_clean()
