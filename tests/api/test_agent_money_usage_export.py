"""Issue 16 items 1, 2, 5, 6 over HTTP: agent sessions see and hold money, the owner funds
an agent once per Idempotency-Key, the daily series and the streamed export (chat
included), and the 402 when x402 is off."""
from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timedelta, timezone

from tests import agentkit
from tests.gateway_helpers import balance_cents, call, mod, provider, provider_server  # noqa: F401
from tests.support.finalize import drain


def _agent(client, owner):
    kp = agentkit.Keypair()
    agent = agentkit.register(client, owner, kp).get_json()
    return agent, agentkit.session_headers(client, kp)


def test_owner_funds_agent_once_and_agent_sees_and_spends_it(app, client, make_account, mod, ledger_clean):
    owner, other = make_account(cents=300), make_account(cents=300)
    agent, session = _agent(client, owner)
    fund = lambda who, amount, key=None: client.post(  # noqa: E731
        f"/api/agent/{agent['id']}/fund", json={"amount_cents": amount},
        headers={**who.headers, **({"Idempotency-Key": key} if key else {})})
    first = fund(owner, 200, "f-1")
    assert first.status_code == 200 and first.get_json()["replayed"] is False
    again = fund(owner, 200, "f-1")  # Stripe's semantics: the first answer, marked as a replay
    assert again.get_json() == first.get_json() and again.headers["Idempotent-Replayed"] == "true"
    assert fund(owner, 150, "f-1").status_code == 409
    assert balance_cents(app, owner.id) == 100
    r = fund(owner, 101)
    assert r.status_code == 402 and r.get_json()["error"] == "insufficient_funds"
    for bad in (0, -1, 1.5, "5", None):
        assert fund(other, bad).status_code == 400
    assert fund(other, 1).status_code == 404  # another account's agent
    assert client.post("/api/agent/agt_nope/fund", json={"amount_cents": 1}, headers=other.headers).status_code == 404
    assert fund_from_session(client, agent, session).status_code in (403, 404)
    assert balance_cents(app, owner.id) == 100
    me = client.get("/api/account", headers=session).get_json()
    assert me["agent_id"] == agent["id"] and me["balance_cents"] == 200
    assert call(client, None, {"action": "ok"}, headers=session, bearer=session["Authorization"][7:]).status_code == 200
    assert client.get("/api/wallet/balance", headers=session).get_json()["credits_cents"] == 197
    kinds = [t["kind"] for t in client.get("/api/wallet/transactions", headers=session).get_json()["transactions"]]
    assert "agent_fund" in kinds and "module_call" in kinds
    assert client.get("/api/usage/current", headers=session).get_json()["spend_cents"] == 3
    assert client.get("/api/usage/by-module", headers=session).get_json()["by_module"][0]["slug"] == "svc"
    assert client.get("/api/keys", headers=session).status_code == 403  # still no key management
    ledger_clean()


def fund_from_session(client, agent, session):
    return client.post(f"/api/agent/{agent['id']}/fund", json={"amount_cents": 1}, headers=session)


def test_daily_series_and_export_include_calls_and_chat(app, client, make_account, mod):
    acct = make_account(cents=100)
    ok = call(client, acct, {"action": "ok"}, key="idem-1").get_json()
    assert call(client, acct, {"action": "boom"}).status_code == 502
    refused = call(client, acct, {"action": "bad"}).get_json()  # the provider's 422: ok false, charged
    assert refused["ok"] is False
    _chat_row(app, acct.id)
    days = client.get("/api/usage/daily?days=3", headers=acct.headers).get_json()["days"]
    # usage counts a call by its charge (written before the answer); the export lists each
    # call's status and receipt hash, written by the finalize writer after the answer
    drain(app)
    today = datetime.now(timezone.utc).date().isoformat()
    assert len(days) == 3 and days[-1]["date"] == today
    assert (days[-1]["calls"], days[-1]["errors"], days[-1]["spend_cents"]) == (4, 1, 3 + 2 + 2)
    now = datetime.now(timezone.utc)
    q = {"from": (now - timedelta(hours=1)).isoformat(), "to": (now + timedelta(minutes=1)).isoformat()}
    r = client.get("/api/usage/export", query_string=q, headers=acct.headers)
    assert r.status_code == 200 and r.mimetype == "text/csv" and r.is_streamed
    header, *_ = r.get_data(as_text=True).split("\r\n", 1)
    assert header.split(",")[-3:] == ["actor", "actor_account_id", "ok"]  # appended: earlier columns keep their place
    rows = list(csv.DictReader(io.StringIO(r.get_data(as_text=True))))
    by_id = {row["call_id"]: row for row in rows}
    assert len(rows) == 4 and by_id[ok["call_id"]]["cost_cents"] == "3"
    # a call the provider refused is charged and does not read as a success
    assert (by_id[refused["call_id"]]["status"], by_id[refused["call_id"]]["ok"]) == ("succeeded", "false")
    assert by_id[refused["call_id"]]["cost_cents"] == "2" and by_id[ok["call_id"]]["ok"] == "true"
    assert by_id[ok["call_id"]]["idempotency_key"] == "idem-1"
    assert by_id[ok["call_id"]]["receipt_hash"] == ok["receipt"]["hash"]
    assert {row["status"] for row in rows} == {"succeeded", "refunded", "settled"}
    chat = next(row for row in rows if row["module"] == "chat")
    assert (chat["action"], chat["cost_micros"], chat["cost_cents"]) == ("m-1", "25000", "2")
    nd = client.get("/api/usage/export", query_string={**q, "format": "json"}, headers=acct.headers)
    assert nd.mimetype == "application/x-ndjson"
    lines = [json.loads(line) for line in nd.get_data(as_text=True).splitlines()]
    assert [line["call_id"] for line in lines] == [row["call_id"] for row in rows]
    oks = {line["call_id"]: line["ok"] for line in lines}
    assert (oks[ok["call_id"]], oks[refused["call_id"]]) == (True, False)
    assert {line["ok"] for line in lines if line["status"] in ("refunded", "settled")} == {None}


def test_export_and_daily_bad_input(client, account):
    now = datetime.now(timezone.utc)
    for q in ({"from": now.isoformat()}, {"from": "yesterday", "to": now.isoformat()},
              {"from": now.isoformat(), "to": (now + timedelta(days=1)).isoformat(), "format": "xlsx"}):
        r = client.get("/api/usage/export", query_string=q, headers=account.headers)
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", q
    for days in (0, 91, "x", 1.5):
        assert client.get(f"/api/usage/daily?days={days}", headers=account.headers).status_code == 400


def test_export_instant_without_a_utc_date_is_400_not_500(client, account):
    # valid RFC 3339, but year 1 at +05:00 (or year 9999 at -05:00) has no UTC date
    for q, param in ({"from": "0001-01-01T00:00:00+05:00", "to": "0001-01-02T00:00:00Z"}, "from"), \
                    ({"from": "9999-12-31T20:00:00Z", "to": "9999-12-31T23:30:00-05:00"}, "to"):
        r = client.get("/api/usage/export", query_string=q, headers=account.headers)
        assert r.status_code == 400 and r.get_json()["error"] == "invalid_request", (q, r.get_json())
        assert r.get_json()["message"].startswith(param + ":")


def test_402_without_x402_offers_no_x_payment_and_no_empty_pay_to(app, client, make_account, mod):
    acct = make_account(cents=1)
    saved = app.config["X402_PAY_TO"]
    app.config["X402_PAY_TO"] = None
    try:
        r = call(client, acct, {"action": "ok"})
    finally:
        app.config["X402_PAY_TO"] = saved
    body = r.get_json()
    assert r.status_code == 402 and "X-Pay-To" not in r.headers and "PAYMENT-REQUIRED" not in r.headers
    assert "X-Payment" not in body["message"] and "POST /api/wallet/fund" in body["message"]
    assert body["pay_to"] is None and "accepts" not in body


def _chat_row(app, account_id):
    """A settled chat completion of 25,000 micros, through the chat billing service."""
    from app.services.money import holds

    with app.app_context():
        holds.hold("chatcmpl-export1", account_id, "m-1", 30_000, False)
        holds.settle("chatcmpl-export1", account_id, 30_000, 25_000, model="m-1", provider="p", prompt_tokens=1,
                     completion_tokens=1, estimated=False, attempts=1, latency_ms=1)


def test_export_csv_does_not_hand_a_spreadsheet_a_formula(app, client, make_account, mod):
    """A caller's Idempotency-Key is free text: in the CSV a value a spreadsheet would run as a
    formula gets a leading apostrophe (OWASP CSV injection; before: written as sent, so an
    organisation owner opening a developer's calls in Excel ran it); NDJSON stays exact."""
    acct = make_account(cents=100)
    planted = '=HYPERLINK("http://evil.example","open")'
    for key in (planted, "@sum", "plain-key"):
        assert call(client, acct, {"action": "ok"}, key=key).status_code == 200
    drain(app)
    now = datetime.now(timezone.utc)
    q = {"from": (now - timedelta(hours=1)).isoformat(), "to": (now + timedelta(minutes=1)).isoformat()}
    r = client.get("/api/usage/export", query_string=q, headers=acct.headers)
    keys = sorted(row["idempotency_key"] for row in csv.DictReader(io.StringIO(r.get_data(as_text=True))))
    assert keys == sorted(["'" + planted, "'@sum", "plain-key"])
    nd = client.get("/api/usage/export", query_string={**q, "format": "json"}, headers=acct.headers)
    assert sorted(json.loads(line)["idempotency_key"] for line in nd.get_data(as_text=True).splitlines()) == \
        sorted([planted, "@sum", "plain-key"])
