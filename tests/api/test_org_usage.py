"""Issue 37 item 5: usage per organisation and per member. Every member reads the
organisation's totals; ``member_id`` narrows them to one member's keys (one's own: any
member; another's: owner, admin, billing); the per-call export is for owners, admins and
billing, or one's own calls. Bad input is refused and reads nothing of another account."""
from __future__ import annotations

import csv
import io
from urllib.parse import urlencode

from tests.gateway_helpers import call, mod, provider, provider_server  # noqa: F401
from tests.orgkit import h, join, make_org, org_key
from tests.support.errors import error_code


def _get(client, path, headers, **query):
    return client.get(f"/api/usage/{path}?{urlencode(query)}", headers=headers)





def _export_now(client, headers, **query):
    from app.models.base import utcnow
    from datetime import timedelta

    now = utcnow()
    r = _get(client, "export", headers, **{"from": (now - timedelta(days=1)).isoformat(),
                                           "to": (now + timedelta(hours=1)).isoformat(), **query})
    return r, (list(csv.DictReader(io.StringIO(r.get_data(as_text=True)))) if r.status_code == 200 else None)


def test_usage_per_member_in_an_organisation(app, client, make_account, mod):  # noqa: F811
    from tests.api.test_orgs import _pay_checkout

    owner, billing, dev, dev2, viewer, stranger = (make_account(plan="scale") for _ in range(6))
    org = make_org(client, owner)
    oid = org["id"]
    for acct, role in ((billing, "billing"), (dev, "developer"), (dev2, "developer"), (viewer, "viewer")):
        join(app, oid, acct, role)
    _pay_checkout(client, owner, 1000, org_id=oid)
    dev_key, dev2_key = org_key(client, dev, oid), org_key(client, dev2, oid)
    for bearer in (dev_key["key"], dev_key["key"], dev2_key["key"]):
        assert call(client, None, {"action": "ok"}, bearer=bearer).status_code == 200
    assert call(client, dev, {"action": "ok"}).status_code == 200  # dev's personal call: not the org's

    # the organisation's totals: every member
    for acct in (owner, billing, dev, viewer):
        r = _get(client, "current", acct.headers, org_id=oid)
        assert r.status_code == 200 and (r.get_json()["calls"], r.get_json()["spend_cents"]) == (3, 9)
    # one member: owners, admins and billing any member; everyone their own
    for acct in (owner, billing):
        assert _get(client, "current", acct.headers, org_id=oid, member_id=dev.id).get_json()["calls"] == 2
        assert _get(client, "current", acct.headers, org_id=oid, member_id=dev2.id).get_json()["calls"] == 1
    mine = _get(client, "current", dev.headers, org_id=oid, member_id=dev.id).get_json()
    assert (mine["calls"], mine["spend_cents"]) == (2, 6)
    assert _get(client, "current", h(dev_key["key"]), member_id=dev.id).get_json()["calls"] == 2  # the key's org
    assert _get(client, "current", owner.headers, org_id=oid, member_id=owner.id).get_json()["calls"] == 0
    by_module = _get(client, "by-module", billing.headers, org_id=oid, member_id=dev.id).get_json()
    assert [(m["calls"], m["spend_cents"]) for m in by_module["by_module"]] == [(2, 6)]
    days = _get(client, "daily", dev.headers, org_id=oid, member_id=dev.id, days=2).get_json()["days"]
    assert len(days) == 2 and sum(d["calls"] for d in days) == 2  # today's (yesterday's just after midnight)
    # another member's usage: not for developers and viewers (the 403 names the roles)
    for acct in (dev, viewer):
        r = _get(client, "current", acct.headers, org_id=oid, member_id=dev2.id)
        assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
        assert r.get_json()["roles"] == ["owner", "admin", "billing"]
    r = _get(client, "by-module", h(dev_key["key"]), member_id=dev2.id)
    assert r.status_code == 403 and "owner, admin or billing" in r.get_json()["message"]

    # the per-call export: everyone's for owners, admins, billing; one's own for the others
    r, rows = _export_now(client, owner.headers, org_id=oid)
    assert len(rows) == 3
    r, rows = _export_now(client, billing.headers, org_id=oid, member_id=dev2.id)
    assert len(rows) == 1
    r, rows = _export_now(client, dev.headers, org_id=oid, member_id=dev.id)
    assert len(rows) == 2
    for headers in (dev.headers, h(dev_key["key"]), viewer.headers):
        r, _ = _export_now(client, headers, org_id=oid)
        assert r.status_code == 403 and error_code(r.get_json()) == "org_role_required"
        assert "member_id=<your id>" in r.get_json()["message"]
    r, rows = _export_now(client, dev.headers)  # the developer's personal account: their own call
    assert len(rows) == 1

    # bad input: 400/403/404, nothing of another account read
    r = _get(client, "current", dev.headers, member_id=dev2.id)  # another id without an organisation
    assert r.status_code == 404 and "org_id" in r.get_json()["message"]
    r = _get(client, "current", dev.headers, member_id=dev.id)  # a personal account's only member: itself
    assert r.status_code == 200 and r.get_json()["calls"] == 1
    assert _get(client, "current", stranger.headers, org_id=oid).status_code == 404
    assert _get(client, "current", stranger.headers, org_id=oid, member_id=dev.id).status_code == 404
    assert _get(client, "current", owner.headers, org_id="acct_unknown").status_code == 404
    assert _get(client, "current", owner.headers, org_id=oid, member_id=stranger.id).status_code == 404
    other = make_org(client, stranger, "Other")
    assert _get(client, "current", owner.headers, org_id=other["id"]).status_code == 404
    assert _get(client, "current", owner.headers, org_id=oid, member_id=other["id"]).status_code == 404
    assert _get(client, "current", h(dev_key["key"]), org_id=other["id"]).status_code == 404
    assert _get(client, "current", owner.headers, org_id=oid, member_id="x" * 33).status_code == 400

    # once the calls are rolled up, the totals come from the rollups and a member's share
    # still from the call log: the same numbers
    from datetime import timedelta

    from app.models.base import utcnow
    from app.services.billing import usage_log

    with app.app_context():
        usage_log.roll(now=utcnow() + timedelta(hours=2), max_hours=24 * 400)
        assert usage_log.rolled_through() > utcnow() - timedelta(hours=1)
    assert _get(client, "current", owner.headers, org_id=oid).get_json()["calls"] == 3
    assert _get(client, "current", owner.headers, org_id=oid, member_id=dev.id).get_json()["calls"] == 2
    days = _get(client, "daily", billing.headers, org_id=oid, member_id=dev2.id, days=2).get_json()["days"]
    assert (sum(d["calls"] for d in days), sum(d["spend_cents"] for d in days)) == (1, 3)

    # a former member's usage stays readable by the organisation
    assert client.delete(f"/api/orgs/{oid}/members/{dev.id}", headers=owner.headers).status_code == 200
    r = _get(client, "current", owner.headers, org_id=oid, member_id=dev.id)
    assert r.status_code == 200 and r.get_json()["calls"] == 2, r.get_json()
    assert _get(client, "current", dev.headers, org_id=oid, member_id=dev.id).status_code == 404  # not a member
    # every member's share in one read (the console's members page): the same numbers as one
    # member at a time, after the roll-up, the former member included
    from app.extensions import db
    from app.services.billing import usage

    with app.app_context():
        start, end = usage.billing_period()
        split = {u["member_id"]: (u["calls"], u["errors"], u["spend_micros"]) for u in usage.by_member(oid, start, end)}
        assert usage.by_member(oid, start, end, mode="test") == []
        db.session.remove()
    assert split == {dev.id: (2, 0, 60_000), dev2.id: (1, 0, 30_000)}


def test_member_id_with_a_key_filter_reads_that_key_of_the_member(app, client, make_account, mod):  # noqa: F811
    """`member_id` and `key_id` together (one of the member's keys): the usage routes
    answered 500 (``member_rows`` iterated a SELECT); the export already narrowed them."""
    from tests.api.test_orgs import _pay_checkout

    owner, dev, dev2 = (make_account(plan="scale") for _ in range(3))
    oid = make_org(client, owner)["id"]
    for acct in (dev, dev2):
        join(app, oid, acct, "developer")
    _pay_checkout(client, owner, 1000, org_id=oid)
    first, second, other = org_key(client, dev, oid), org_key(client, dev, oid), org_key(client, dev2, oid)
    for bearer in (first["key"], first["key"], second["key"], other["key"]):
        assert call(client, None, {"action": "ok"}, bearer=bearer).status_code == 200
    for key_id, calls in ((first["id"], 2), (second["id"], 1), (other["id"], 0)):
        q = {"org_id": oid, "member_id": dev.id, "key_id": key_id}
        r = _get(client, "current", owner.headers, **q)
        assert r.status_code == 200, r.get_json()
        assert (r.get_json()["calls"], r.get_json()["spend_cents"]) == (calls, 3 * calls)
        r = _get(client, "by-module", owner.headers, **q)
        assert r.status_code == 200 and sum(m["calls"] for m in r.get_json()["by_module"]) == calls
        r = _get(client, "daily", owner.headers, days=1, **q)
        assert r.status_code == 200 and r.get_json()["days"][0]["calls"] == calls
        r, rows = _export_now(client, owner.headers, **q)
        assert r.status_code == 200 and len(rows) == calls


def test_a_key_filter_does_not_open_another_members_usage(app, client, make_account, mod):  # noqa: F811
    """A developer or viewer reads the organisation's totals and their own usage, not
    another member's: `key_id` naming another member's key answered that key's usage (the
    member's share by another door); it is now 404 like that key on the key routes."""
    from tests.api.test_orgs import _pay_checkout

    owner, dev, viewer, billing = (make_account(plan="scale") for _ in range(4))
    oid = make_org(client, owner)["id"]
    for acct, role in ((dev, "developer"), (viewer, "viewer"), (billing, "billing")):
        join(app, oid, acct, role)
    _pay_checkout(client, owner, 1000, org_id=oid)
    owners, mine = org_key(client, owner, oid), org_key(client, dev, oid)
    for bearer in (owners["key"], owners["key"], mine["key"]):
        assert call(client, None, {"action": "ok"}, bearer=bearer).status_code == 200
    for path in ("current", "by-module", "daily"):
        for headers in (dev.headers, viewer.headers, h(mine["key"])):
            r = _get(client, path, headers, org_id=oid, key_id=owners["id"])
            assert r.status_code == 404 and error_code(r.get_json()) == "not_found", (path, r.get_json())
        r = _get(client, path, billing.headers, org_id=oid, key_id=owners["id"])  # read_member_usage
        assert r.status_code == 200
    r = _get(client, "current", dev.headers, org_id=oid, key_id=mine["id"])  # one's own key
    assert r.status_code == 200 and r.get_json()["calls"] == 1
    assert _get(client, "current", owner.headers, org_id=oid, key_id=mine["id"]).get_json()["calls"] == 1


def test_the_organisation_export_says_who_made_each_call(app, client, make_account, mod):  # noqa: F811
    """The per-call export is for owners, admins and billing because "it lists who called
    what": its rows named no key and no member. Each row now carries `actor` (the key that
    made the call, as on the receipt) and `actor_account_id` (the member behind it; the
    account itself for a personal key)."""
    from tests.api.test_orgs import _pay_checkout

    owner, dev = make_account(plan="scale"), make_account(plan="scale")
    oid = make_org(client, owner)["id"]
    join(app, oid, dev, "developer")
    _pay_checkout(client, owner, 1000, org_id=oid)
    owners, devs = org_key(client, owner, oid), org_key(client, dev, oid)
    made = {}
    for key in (owners, devs, devs):
        r = call(client, None, {"action": "ok"}, bearer=key["key"])
        assert r.status_code == 200
        made[r.get_json()["call_id"]] = r.get_json()["receipt"]
    r, rows = _export_now(client, owner.headers, org_id=oid)
    assert r.status_code == 200 and len(rows) == 3
    for row in rows:
        receipt = made[row["call_id"]]
        assert (row["actor"], row["actor_account_id"]) == (receipt["actor"], receipt["actor_account_id"])
    assert sorted((row["actor"], row["actor_account_id"]) for row in rows) == sorted(
        [(owners["id"], owner.id), (devs["id"], dev.id), (devs["id"], dev.id)])
    assert call(client, dev, {"action": "ok"}).status_code == 200  # the developer's personal key
    r, rows = _export_now(client, dev.headers)
    assert [row["actor_account_id"] for row in rows] == [dev.id] and rows[0]["actor"].startswith("key_")


def test_an_alert_watching_an_organisation_fires_on_its_members_calls(app, client, make_account, mod):  # noqa: F811
    from app.services.billing import alerts
    from tests.api.test_orgs import _pay_checkout

    owner, dev = make_account(plan="scale"), make_account(plan="scale")
    org = make_org(client, owner)
    join(app, org["id"], dev, "developer")
    _pay_checkout(client, owner, 1000, org_id=org["id"])
    alert = client.post("/api/alerts", json={"name": "org spend", "metric": "spend_cents", "op": ">=",
                                             "threshold": 6, "window": "day", "channel": "webhook",
                                             "target": "https://hooks.example.com/org", "org_id": org["id"]},
                        headers=owner.headers)
    assert alert.status_code == 201
    personal = client.post("/api/alerts", json={"name": "mine", "metric": "spend_cents", "op": ">=",
                                                "threshold": 6, "window": "day", "channel": "webhook",
                                                "target": "https://hooks.example.com/me"}, headers=dev.headers)
    key = org_key(client, dev, org["id"])
    for _ in range(2):  # 6 cents of the organisation's money, none of the developer's
        assert call(client, None, {"action": "ok"}, bearer=key["key"]).status_code == 200
    with app.app_context():
        alerts.evaluate_all(dispatch=False)
    events = client.get(f"/api/alerts/events?org_id={org['id']}", headers=dev.headers).get_json()["events"]
    assert [(e["alert_id"], e["value"]) for e in events] == [(alert.get_json()["id"], 6)]
    assert client.get("/api/alerts/events", headers=dev.headers).get_json()["events"] == []
    assert personal.status_code == 201
