"""``topuprace``: two workers racing the same auto top-up threshold (issue 41).

An account with a saved sandbox card and auto top-up (under 5 USD → 20 USD) starts just
above the threshold; 16 concurrent metered calls through the gunicorn workers take it under
(the crossing is noticed by the balance row's trigger, in the charge's transaction), while
two extra worker processes, besides the scheduler, run every open top-up run of the account
as fast as they can (``autotopup.run`` on the same run ids). Checked: the threshold was
crossed (else the window is opened again: the balance is put back above it, up to
``WINDOWS`` times, rather than passing blindly), exactly one top-up payment succeeded, one
run succeeded, and the balance is the start minus the successful calls plus one top-up.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid

import requests

FAULTS = ("topuprace",)
WINDOWS = 3
THRESHOLD_CENTS, AMOUNT_CENTS, CALLS = 500, 2000, 16

_RACER = """
import sys, time
from wsgi import app
from app.extensions import db
from app.models import AutoTopupRun
from app.services.billing import autotopup
deadline = time.monotonic() + float(sys.argv[2])
with app.app_context():
    while time.monotonic() < deadline:
        ids = [r.id for r in db.session.query(AutoTopupRun).filter(
            AutoTopupRun.account_id == sys.argv[1], AutoTopupRun.status.in_(("queued", "processing")))]
        db.session.remove()
        for run_id in ids:
            autotopup.run(run_id)
        time.sleep(0.005)
"""


def _calls(drv, key: str, price_cents: int) -> int:
    ok = []

    def one():
        idem = f"topup-{uuid.uuid4().hex}"
        for _ in range(20):
            try:
                r = requests.post(f"{drv.url}/v1/module/faulty/call", json={"action": "run"}, timeout=15,
                                  headers={"Authorization": f"Bearer {key}", "Idempotency-Key": idem})
            except requests.RequestException:
                time.sleep(0.2)
                continue
            if r.status_code in (200, 402):
                ok.append(r.status_code == 200)
                return
            time.sleep(0.2)

    threads = [threading.Thread(target=one) for _ in range(CALLS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return sum(ok)


def run(drv, sh, vbin, root, flask, price_cents: int) -> tuple[list[str], dict]:
    problems: list[str] = []
    created = json.loads(flask(drv.env, "accounts", "create", "--email", "topup@example.com", "--plan", "enterprise"))
    acct, key = created["account_id"], created["key"]
    auth = {"Authorization": f"Bearer {key}"}
    r = requests.post(f"{drv.url}/api/pay/method", json={"payment_method_id": "pm_card_visa"}, headers=auth, timeout=30)
    if r.status_code != 200:
        return [f"topuprace: saving the card answered {r.status_code} {r.text[:200]}"], {}

    def balance() -> int:
        return int(drv.sql(f"SELECT balance_micros FROM accounts WHERE id = '{acct}'")[0][0])

    crossed, charged = False, 0
    for window in range(1, WINDOWS + 1):
        # just above the threshold: the calls below take it under
        lift = (THRESHOLD_CENTS + 10) * 10_000 - balance()
        if lift:
            flask(drv.env, "accounts", "grant-credits", acct, "--cents", str(lift // 10_000))
        r = requests.put(f"{drv.url}/api/pay/auto-topup", headers=auth, timeout=30, json={
            "threshold_cents": THRESHOLD_CENTS, "amount_cents": AMOUNT_CENTS, "monthly_cap_cents": 100 * AMOUNT_CENTS})
        if r.status_code != 200:
            return [f"topuprace: setting auto top-up answered {r.status_code} {r.text[:200]}"], {}
        start = balance()
        racers = [subprocess.Popen([str(vbin / "python"), "-c", _RACER, acct, "15"], env=drv.env, cwd=str(root),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        charged = _calls(drv, key, price_cents)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and drv.sql(
                f"SELECT count(*) FROM auto_topup_runs WHERE account_id = '{acct}' "
                "AND status IN ('queued', 'processing')")[0][0] != "0":
            time.sleep(0.2)
        for p in racers:
            _, err = p.communicate(timeout=60)
            if p.returncode != 0:  # a racer that died raced nothing
                problems.append(f"topuprace: a racing worker failed: {err[-300:]}")
        runs = drv.sql(f"SELECT status FROM auto_topup_runs WHERE account_id = '{acct}'")
        if runs:
            crossed = True
            drv.note(f"topuprace: {charged} calls crossed the threshold (window {window}); runs {runs}")
            break
        drv.note("topuprace: the calls did not cross the threshold; trying the window again")
    if not crossed:
        return [f"topuprace: no threshold crossing in {WINDOWS} windows: the race was not tested"], {}
    paid = drv.sql(f"SELECT count(*) FROM payments WHERE account_id = '{acct}' AND product = 'Auto top-up' "
                   "AND status = 'succeeded'")[0][0]
    runs_ok = drv.sql(f"SELECT count(*) FROM auto_topup_runs WHERE account_id = '{acct}' AND status = 'succeeded'")[0][0]
    expected = start - charged * price_cents * 10_000 + AMOUNT_CENTS * 10_000
    if paid != "1" or runs_ok != "1":
        problems.append(f"topuprace: {paid} top-up payments and {runs_ok} succeeded runs, expected exactly one")
    if balance() != expected:
        problems.append(f"topuprace: balance {balance()} micros, expected {expected} (start {start}, "
                        f"{charged} calls, one top-up)")
    return problems, {"calls": charged, "topups": int(paid), "runs": runs_ok}
