"""``webhookreplay``: processor webhooks replayed, concurrently and after a worker died
between the processor's answer and the booking (issue 41).

An account pays two ways through the sandbox processor of the fault run's gunicorn: a
hosted checkout (its ``checkout.session.completed`` event, signed with the sandbox's
webhook secret the way Stripe signs) and an off-session charge of its saved card
(``POST /api/wallet/fund``; the processor's ``payment_intent.succeeded`` event). Each
booking is made slow on purpose (a trigger sleeps in the ``pending → succeeded`` UPDATE
of ``payments``) and, once a database session is seen sleeping there, every gunicorn
worker is ``kill -9``-ed: the webhook's delivery, or the charge whose processor already
said ``succeeded``, dies before its booking commits (checked: the payment is still
pending; else the window is opened again, up to ``WINDOWS`` times, rather than passing
blindly). Then, with the trigger gone and the workers respawned, the processor redelivers:
each event ``REPLAYS`` times from ``CLIENTS`` threads at once (new connections, so the
three workers share them), plus a second event id reporting the same checkout. Checked:
each event id stored once, each payment ``succeeded`` with exactly one credit posting
``pay:<id>``, and the balance moved by exactly the two amounts; the driver's ``ledger
check`` and ``money reconcile`` then cover the books.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from collections import Counter

import requests

from app.services.billing.processors import sign_payload

FAULTS = ("webhookreplay",)
WINDOWS = 3
CLIENTS, REPLAYS = 8, 3  # each event delivered CLIENTS × REPLAYS times at once
CHECKOUT_CENTS, FUND_CENTS = 2000, 1500
SECRET = "whsec_sbx_fault_" + secrets.token_hex(8)
SLEEP = 3.0  # seconds the booking's UPDATE sleeps while the window is open

_SLOW = f"""
CREATE OR REPLACE FUNCTION fault_slow_booking() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep({SLEEP}); RETURN NEW; END $$;
DROP TRIGGER IF EXISTS fault_slow_booking ON payments;
CREATE TRIGGER fault_slow_booking BEFORE UPDATE ON payments FOR EACH ROW
    WHEN (OLD.status = 'pending' AND NEW.status = 'succeeded') EXECUTE FUNCTION fault_slow_booking();
"""
_FAST = "DROP TRIGGER IF EXISTS fault_slow_booking ON payments; DROP FUNCTION IF EXISTS fault_slow_booking();"


def setup(drv) -> None:
    """The sandbox's webhook secret, known to the driver (the processor's side)."""
    drv.env["SANDBOX_WEBHOOK_SECRET"] = SECRET


def _event(etype: str, obj: dict) -> dict:
    return {"id": "evt_fault_" + secrets.token_hex(10), "object": "event", "type": etype, "livemode": False,
            "created": int(time.time()), "api_version": "sandbox", "data": {"object": obj}}


def _deliver(url: str, event: dict) -> tuple[int | None, dict]:
    """One delivery, signed now (a redelivery is signed again, as Stripe does); a new
    connection each time."""
    payload = json.dumps(event).encode()
    try:
        r = requests.post(f"{url}/api/pay/webhook", data=payload, timeout=30, headers={
            "Content-Type": "application/json", "Stripe-Signature": sign_payload(payload, SECRET),
            "Connection": "close"})
    except requests.RequestException as exc:
        return None, {"error": type(exc).__name__}
    return r.status_code, (r.json() if r.headers.get("Content-Type", "").startswith("application/json") else {})


class _Window:
    """Run ``start`` in a thread with the booking slowed; kill every worker once a session
    sleeps in it. ``hit``: the kill came while the booking was in flight."""

    def __init__(self, drv, sh):
        self.drv, self.sh, self.hit = drv, sh, False

    def run(self, start) -> None:
        drv = self.drv
        self.sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", _SLOW, drv.db)
        try:
            t = threading.Thread(target=start, daemon=True)
            t.start()
            until = time.monotonic() + 15
            while time.monotonic() < until and not self.sleeping():
                time.sleep(0.02)
            if self.sleeping():
                for pid in drv.gunicorn.children():
                    _kill(pid)
                self.hit = True
            t.join(60)
        finally:
            self.sh("psql", "-h", "127.0.0.1", "-U", "postgres", "-q", "-c", _FAST, drv.db)
        drv.gunicorn.wait_http(drv.url + "/openapi.json", timeout=60)

    def sleeping(self) -> bool:
        return self.drv.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND wait_event = 'PgSleep'")[0][0] != "0"


def _kill(pid: int) -> None:
    import os
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _fund(url: str, auth: dict) -> None:
    """An off-session charge of the saved card (its answer may never come: the kill)."""
    try:
        requests.post(f"{url}/api/wallet/fund", json={"amount_cents": FUND_CENTS, "method": "card"}, headers=auth,
                      timeout=30)
    except requests.RequestException:
        pass


def _replay(url: str, events: list[dict]) -> Counter:
    """Every event delivered CLIENTS × REPLAYS times, from CLIENTS threads released together;
    the answers counted by (event id, status, duplicate)."""
    answers: Counter = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client():
        barrier.wait()
        for _ in range(REPLAYS):
            for event in events:
                status, body = _deliver(url, event)
                with lock:
                    answers[(event["id"], status, body.get("duplicate"))] += 1

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return answers


def run(drv, sh, flask) -> tuple[list[str], dict]:
    problems: list[str] = []
    created = json.loads(flask(drv.env, "accounts", "create", "--email", "webhooks@example.com", "--plan",
                               "enterprise"))
    acct, auth = created["account_id"], {"Authorization": f"Bearer {created['key']}"}
    r = requests.post(f"{drv.url}/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=auth,
                      timeout=30)
    if r.status_code != 200:
        return [f"webhookreplay: saving the card answered {r.status_code} {r.text[:200]}"], {}

    def balance() -> int:
        return int(drv.sql(f"SELECT balance_micros FROM accounts WHERE id = '{acct}'")[0][0])

    def status(pid: str) -> str:
        return drv.sql(f"SELECT status FROM payments WHERE id = '{pid}'")[0][0]

    start = balance()
    # 1. a checkout's completion event, its delivery killed during the booking
    checkout = session = None
    events: list[dict] = []
    for window in range(1, WINDOWS + 1):
        r = requests.post(f"{drv.url}/api/pay/checkout", json={"amount_cents": CHECKOUT_CENTS}, headers=auth,
                          timeout=30)
        if r.status_code != 200:
            return [f"webhookreplay: checkout answered {r.status_code} {r.text[:200]}"], {}
        pid = r.json()["payment_id"]
        session = drv.sql(f"SELECT provider_id FROM payments WHERE id = '{pid}'")[0][0]
        obj = {"id": session, "object": "checkout.session", "amount_total": CHECKOUT_CENTS, "currency": "usd",
               "payment_status": "paid", "status": "complete", "client_reference_id": acct,
               "payment_intent": "pi_fault_" + secrets.token_hex(8), "metadata": {"payment_id": pid,
                                                                                  "account_id": acct}}
        event = _event("checkout.session.completed", obj)
        win = _Window(drv, sh)
        win.run(lambda: _deliver(drv.url, event))
        if win.hit and status(pid) == "pending":
            drv.note(f"webhookreplay: kill -9 of every worker during the booking of {event['id']} (window {window})")
            checkout = pid
            events += [event, _event("checkout.session.completed", obj)]  # and the same payment, another event
            break
        drv.note(f"webhookreplay: the checkout window missed (hit {win.hit}, {status(pid)}); trying it again")
        if status(pid) == "succeeded":  # booked before the kill: counted below
            start += CHECKOUT_CENTS * 10_000
    # 2. an off-session charge the processor made, its worker killed before the booking
    fund = None
    for window in range(1, WINDOWS + 1):
        before = {row[0] for row in drv.sql(f"SELECT id FROM payments WHERE account_id = '{acct}'")}
        win = _Window(drv, sh)
        win.run(lambda: _fund(drv.url, auth))
        new = [row for row in drv.sql(f"SELECT id, status FROM payments WHERE account_id = '{acct}' "
                                      "AND kind = 'charge'") if row[0] not in before]
        if win.hit and len(new) == 1 and new[0][1] == "pending":
            fund = new[0][0]
            drv.note(f"webhookreplay: kill -9 of every worker after the charge of {fund} (window {window})")
            events.append(_event("payment_intent.succeeded", {
                "id": "pi_sbx_fault" + secrets.token_hex(8), "object": "payment_intent", "amount": FUND_CENTS,
                "amount_received": FUND_CENTS, "currency": "usd", "status": "succeeded",
                "metadata": {"payment_id": fund, "account_id": acct}}))
            break
        drv.note(f"webhookreplay: the charge window missed (hit {win.hit}, {new}); trying it again")
        if len(new) == 1 and new[0][1] == "succeeded":  # booked before the kill: counted below
            start += FUND_CENTS * 10_000
    if checkout is None or fund is None:
        problems.append(f"webhookreplay: a kill window was not hit in {WINDOWS} tries (checkout {checkout}, "
                        f"charge {fund}): the fault was not tested")
        return problems, {}
    answers = _replay(drv.url, events)
    for event in events:
        fresh = sum(n for (eid, st, dup), n in answers.items() if eid == event["id"] and st == 200 and dup is False)
        other = {f"{st}/{dup}": n for (eid, st, dup), n in answers.items()
                 if eid == event["id"] and not (st == 200 and dup is not None)}
        stored = drv.sql(f"SELECT count(*) FROM payment_events WHERE event_id = '{event['id']}'")[0][0]
        if fresh != 1 or stored != "1" or other:
            problems.append(f"webhookreplay: {event['type']} {event['id']}: {fresh} first deliveries, "
                            f"{stored} stored, other answers {other}")
    for pid in (checkout, fund):
        refs = drv.sql(f"SELECT count(*) FROM ledger_transactions WHERE ref = 'pay:{pid}'")[0][0]
        if status(pid) != "succeeded" or refs != "1":
            problems.append(f"webhookreplay: payment {pid} is {status(pid)} with {refs} credit postings")
    moved = balance() - start
    # window misses paid nothing (a missed checkout stays pending; a missed charge was counted)
    if moved != (CHECKOUT_CENTS + FUND_CENTS) * 10_000:
        problems.append(f"webhookreplay: the balance moved {moved} micros, expected "
                        f"{(CHECKOUT_CENTS + FUND_CENTS) * 10_000}")
    summary: Counter = Counter()
    for (_, st, dup), n in answers.items():
        summary[f"{st} duplicate={dup}"] += n
    return problems, {"deliveries": sum(answers.values()), "events": len(events), "answers": dict(summary)}
