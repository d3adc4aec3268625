"""The agent lifecycle end to end: a PyNaCl keypair is registered, signs in, calls a module
with its session, submits a module that gets approved, another account calls it (forwarded
to the agent's webhook, signed per Standard Webhooks and verified there), 30% accrues, and
settlement — run twice — credits the agent's balance exactly once with a clean ledger."""
from __future__ import annotations

from datetime import timedelta

from standardwebhooks import Webhook

from app.extensions import db
from app.models import Module, ModuleAction
from app.services.accounts import accounts
from app.services.money import ledger
from app.services.money import settlement
from app.services.billing import usage
from tests.agentkit import Keypair
from tests.support.standin import Request, StandIn


class AgentServer(StandIn):
    """The agent's own server: verifies every request's Standard Webhooks signature with the
    secrets it was given (401 otherwise). ``/module`` serves the agent's module; ``/events``
    receives the agent's events; ``/catalog`` is an unrelated provider module."""

    def __init__(self):
        super().__init__()
        self.secrets: dict = {}          # path -> whsec_ secret
        self.events: list = []
        self.module_calls: list = []
        self.route("POST", "/catalog", lambda req: (200, {"echo": req.json()}))
        self.route("POST", "*", self.signed)

    def signed(self, req: Request):
        try:
            payload = Webhook(self.secrets.get(req.path)).verify(
                req.body, {k.lower(): v for k, v in req.headers.items()})
        except Exception:  # noqa: BLE001 - unsigned, forged or stale
            return 401, {"error": "bad signature"}
        with self.lock:
            if req.path == "/events":
                self.events.append(payload)
                return 200, {}
            self.module_calls.append({"body": payload, "call_id": req.headers.get("webhook-id")})
        return 200, {"forecast": "sunny", "for": payload.get("city"), "verified": True}


def test_agent_lifecycle(app, client, make_account, ledger_clean):
    server = AgentServer()
    with server as base:
        owner, payer, admin = make_account(), make_account(cents=500), make_account(admin=True)
        with app.app_context():  # a catalog module the agent will use
            db.session.add(Module(slug="echo", name="Echo", upstream_url=base + "/catalog", status="approved",
                                  actions=[ModuleAction(name="say", price_cents=2)]))
            db.session.commit()

        # 1. keypair, register, sign in
        kp = Keypair()
        r = client.post("/api/agent/register", json={"name": "Weatherbot", "pubkey": kp.pubkey,
                                                     "webhook": base + "/events"}, headers=owner.headers)
        assert r.status_code == 201, r.get_json()
        agent = r.get_json()
        server.secrets["/events"] = agent["webhook_secret"]
        nonce = client.get("/api/agent/nonce").get_json()["nonce"]
        r = client.post("/api/agent/signin", json={"pubkey": kp.pubkey, "nonce": nonce,
                                                   "signature": kp.sign(nonce)})
        assert r.status_code == 200 and r.get_json()["agent_id"] == agent["id"]
        session = {"Authorization": f"Bearer {r.get_json()['session']}"}

        # 2. call a module with the session: no credits → 402; funded by its owner → 200
        r = client.post("/v1/module/echo/call", json={"action": "say", "text": "hi"}, headers=session)
        assert r.status_code == 402 and r.get_json()["error"] == "payment_required"
        with app.app_context():
            accounts.grant_credits(agent["account_id"], 100, "funded by owner")
        r = client.post("/v1/module/echo/call", json={"action": "say", "text": "hi"}, headers=session)
        assert r.status_code == 200, r.get_json()
        assert r.get_json()["cost_cents"] == 2 and r.get_json()["result"]["echo"]["text"] == "hi"
        u = client.get(f"/api/agent/{agent['id']}/usage", headers=session).get_json()
        assert (u["calls"], u["spend_cents"]) == (1, 2)
        assert u["by_module"] == [{"slug": "echo", "calls": 1, "spend_cents": 2}]

        # 3. submit a module, not callable until approved
        r = client.post("/api/agent/build", json={"slug": "weather", "price_cents": 10, "actions": ["today"],
                                                  "webhook": base + "/module"}, headers=session)
        assert r.status_code == 202 and r.get_json()["status"] == "pending_review"
        server.secrets["/module"] = r.get_json()["webhook_secret"]
        r = client.post("/v1/module/weather/call", json={"action": "today"}, headers=payer.headers)
        assert r.status_code == 404 and r.get_json()["error"] == "module_not_found"
        assert "weather" not in [m["slug"] for m in client.get("/api/modules").get_json()["modules"]]
        r = client.post("/api/admin/modules/weather/approve", json={"notes": "ok"}, headers=admin.headers)
        assert r.status_code == 200
        assert "weather" in [m["slug"] for m in client.get("/api/modules").get_json()["modules"]]
        assert [e["type"] for e in server.events] == ["module.approved"]

        # 4. another account calls it: forwarded to the agent, signed, verified there
        r = client.post("/v1/module/weather/call", json={"action": "today", "city": "Oslo"},
                        headers=payer.headers)
        assert r.status_code == 200, r.get_json()
        body = r.get_json()
        assert body["ok"] is True and body["cost_cents"] == 10
        assert body["result"] == {"forecast": "sunny", "for": "Oslo", "verified": True}
        assert server.module_calls == [{"body": {"action": "today", "city": "Oslo"}, "call_id": body["call_id"]}]

        # 5. 30% accrues to the owner agent
        e = client.get(f"/api/agent/{agent['id']}/earnings", headers=owner.headers).get_json()
        assert (e["accrued_cents"], e["settled_cents"], e["accrued_micros"]) == (3, 0, 30_000)
        board = client.get("/api/agent/leaderboard", headers=payer.headers).get_json()["entries"]
        assert board[0] == {"rank": 1, "agent_id": agent["id"], "name": "Weatherbot", "earnings_cents": 3}

        # 6. settle the month twice: the agent's balance rises exactly once
        with app.app_context():
            month_start, month_end = usage.billing_period()
            month = month_start.strftime("%Y-%m")
            before = accounts.get_account(agent["account_id"]).balance_micros
            assert before == 980_000
            first = settlement.settle_month(month, now=month_end + timedelta(hours=2))
            db.session.remove()
            second = settlement.settle_month(month, now=month_end + timedelta(hours=2))
            assert (first["settled"], first["total_cents"]) == (1, 3)
            assert (second["settled"], second["already_settled"]) == (0, 1)
            assert accounts.get_account(agent["account_id"]).balance_micros == before + 30_000
            assert ledger.balance(ledger.earnings(agent["id"])) == 0
            db.session.remove()
        e = client.get(f"/api/agent/{agent['id']}/earnings", headers=session).get_json()
        assert (e["accrued_cents"], e["settled_cents"], e["lifetime_cents"]) == (0, 3, 3)
        settled = [ev for ev in server.events if ev["type"] == "settlement.completed"]
        assert len(settled) == 1 and settled[0]["data"]["amount_micros"] == 30_000
    ledger_clean()
