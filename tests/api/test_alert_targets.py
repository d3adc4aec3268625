"""Alert e-mail targets (finding 5): an address other than the account's own gets a
confirmation link first; until it is confirmed the alert is `pending_verification` and
sends nothing; the link works once; the account's own address needs no confirmation."""
from __future__ import annotations

import re

from app.extensions import db
from app.services.billing import alerts
from tests import usage_seed
from tests.publichelpers import path_of, smtp, text_of

RULE = {"name": "Spend guard", "metric": "spend_cents", "op": ">", "threshold": 1, "window": "day",
        "channel": "email"}
LINK = re.compile(r"(https?://\S+/alerts/confirm\?token=[A-Za-z0-9_\-]+)")


def _spend_and_evaluate(app, account_id):
    with app.app_context():
        usage_seed.record(account_id, "mod", spend_micros=50_000)
        db.session.commit()
        fired = alerts.evaluate_all()["fired"]
        db.session.remove()
    return fired


def test_other_address_pending_until_confirmed(app, client, account):
    with smtp(app) as sink:
        r = client.post("/api/alerts", json={**RULE, "target": "Boss@Example.com"}, headers=account.headers)
        assert r.status_code == 201 and r.get_json()["status"] == "pending_verification"
        listed = client.get("/api/alerts", headers=account.headers).get_json()["alerts"]
        assert listed[0]["status"] == "pending_verification"
        assert len(sink.messages) == 1 and sink.messages[0]["To"] == "boss@example.com"
        mail = sink.messages[0]
        assert "Spend guard" not in text_of(mail) + str(mail["Subject"])  # no attacker text
        assert _spend_and_evaluate(app, account.id) == 0  # pending: nothing fires or sends
        assert len(sink.messages) == 1
        page = path_of(LINK.search(text_of(mail)).group(1))
        token = page.split("token=", 1)[1]
        assert client.get(page).status_code == 200  # opening the page changes nothing
        assert client.get("/api/alerts", headers=account.headers).get_json()["alerts"][0]["status"] \
            == "pending_verification"
        assert client.post("/alerts/confirm", data={"token": token}).status_code == 200
        again = client.post("/alerts/confirm", data={"token": token})  # single use
        # pressed twice: the page does not claim "nothing will be sent" of an active alert
        assert again.status_code == 404 and b"already used" in again.data and b"Nothing will be sent" not in again.data
        assert client.get("/api/alerts", headers=account.headers).get_json()["alerts"][0]["status"] == "active"
        assert _spend_and_evaluate(app, account.id) == 1
        assert len(sink.messages) == 2 and sink.messages[1]["To"] == "boss@example.com"


def test_own_address_active_at_once(client, account):
    own = client.get("/api/account", headers=account.headers).get_json()["email"]
    r = client.post("/api/alerts", json={**RULE, "target": own.upper()}, headers=account.headers)
    assert r.status_code == 201 and r.get_json()["status"] == "active"


def test_webhook_alerts_need_no_confirmation(client, account):
    r = client.post("/api/alerts", json={**RULE, "channel": "webhook", "target": "https://hooks.example.com/x"},
                    headers=account.headers)
    assert r.get_json()["status"] == "active"


def test_bad_or_deleted_confirmation_is_404(client, account):
    assert client.get("/alerts/confirm?token=nope").status_code == 404
    r = client.post("/alerts/confirm", data={"token": "nope"})
    assert r.status_code == 404 and b"Nothing will be sent" in r.data


def test_confirming_a_target_activates_the_accounts_other_alerts_to_it(app, client, account):
    """The page asks the target to allow "this account's spend alerts": one confirmation
    activates every pending alert of the account to that address (before, only the link's
    own, so an alert whose confirmation mail the per-target limit dropped stayed silent
    forever); an alert to another address stays pending, and the other link still shows
    its page and succeeds."""
    with smtp(app) as sink:
        ids = [client.post("/api/alerts", json={**RULE, "name": f"r{i}", "target": target},
                           headers=account.headers).get_json()["id"]
               for i, target in enumerate(("boss@example.com", "Boss@Example.com", "other@example.com"))]
        links = [path_of(LINK.search(text_of(m)).group(1)) for m in sink.messages]
    assert len(links) == 3
    assert client.post("/alerts/confirm", data={"token": links[0].split("token=", 1)[1]}).status_code == 200
    status = {a["id"]: a["status"] for a in client.get("/api/alerts", headers=account.headers).get_json()["alerts"]}
    assert [status[i] for i in ids] == ["active", "active", "pending_verification"]
    assert client.get(links[1]).status_code == 200
    assert client.post("/alerts/confirm", data={"token": links[1].split("token=", 1)[1]}).status_code == 200
    assert _spend_and_evaluate(app, account.id) == 2
