"""``payoutkill``: a payout whose worker is ``kill -9``-ed between the processor's answer
and the booking (issue 41).

The fault run's module (``faulty``) is owned by a seller account, so the run's calls
accrue its 30 %. After the run, the seller connects a Stripe Connect destination, its
earnings are settled (the month, as if it had ended) and ``flask money payouts`` runs
against the Stripe stand-in, which makes the transfer and then kills that process before
its answer arrives: the transfer is made, nothing is booked. A second
``flask money payouts`` (recovery delay 0) asks again with the same idempotency key
(``payout:<id>:<attempt>``): the stand-in answers the same transfer, which is booked once.
Checked: the kill hit a transfer (else the window is opened again, up to ``WINDOWS``
times, rather than passing blindly), one transfer at the processor, one paid payout of
everything owed, one ledger posting, nothing left owed; the driver's ``ledger check`` and
``money reconcile`` then cover the books.

No payout webhooks exist (a payout is booked from the processor's answer, asked again
until it is known), so there is no payout webhook to replay.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import timedelta, timezone

from tests.standins import stripe_server

FAULTS = ("payoutkill",)
WINDOWS = 3

_SETTLE = """
import json, sys
from datetime import timedelta, timezone
from wsgi import app
from app.extensions import db
from app.models.base import utcnow
from app.services.billing import payouts
from app.services.money import settlement
with app.app_context():
    payouts.set_destination(sys.argv[1], "stripe_connect", "acct_faultseller1", None)
    now = utcnow()
    after = (now.replace(day=1) + timedelta(days=32)).replace(day=1, hour=2, tzinfo=timezone.utc)
    out = settlement.settle_month(f"{now.year:04d}-{now.month:02d}", now=after)
    print(json.dumps(out, default=str))
"""


def setup(drv, flask) -> None:
    """Make a seller own the fault module before the calls start."""
    seller = json.loads(flask(drv.env, "accounts", "create", "--email", "seller@example.com"))
    drv.seller_id = seller["account_id"]
    flask(drv.env, "modules", "set-owner", "faulty", drv.seller_id)


def kill_windows(drv, cmd: list[str], env: dict, root, victim: list[int], killed: list[str], what: str) -> None:
    """Run ``cmd`` (a payout run) until a stand-in killed it (it fills ``killed``, using the
    pid put in ``victim``), up to ``WINDOWS`` times; each try noted."""
    for window in range(1, WINDOWS + 1):
        proc = subprocess.Popen(cmd, env=env, cwd=str(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        victim[:] = [proc.pid]
        proc.communicate(timeout=120)
        if killed:
            drv.note(f"{what} {killed[0]} (window {window})")
            return
        drv.note(f"{what.split(':')[0]}: nothing in the window; trying it again")


def run(drv, sh, vbin, root) -> tuple[list[str], dict]:
    problems: list[str] = []
    flask_bin = str(vbin / "flask")
    with stripe_server() as fake:
        env = {**drv.env, "PAYMENTS_PROCESSOR": "stripe", "STRIPE_SECRET_KEY": "sk_test_standin",
               "STRIPE_WEBHOOK_SECRET": fake.webhook_secret, "STRIPE_API_BASE": fake.url,
               "PAYOUT_MINIMUM_CENTS": "1"}
        victim: list[int] = []
        killed: list[str] = []
        answer = fake.handle

        def handle(method, path, params, headers):
            out = answer(method, path, params, headers)
            if path == "/v1/transfers" and victim and not killed:
                os.kill(victim[0], signal.SIGKILL)  # the transfer is made; its answer never arrives
                killed.append(out[1].get("id", "?"))
            return out

        fake.handle = handle
        settled = sh(str(vbin / "python"), "-c", _SETTLE, drv.seller_id, env=env).stdout
        drv.note(f"payoutkill: settled {settled.strip()[:200]}")
        kill_windows(drv, [flask_bin, "--app", "wsgi", "money", "payouts"], env, root, victim, killed,
                     "payoutkill: kill -9 of the payout worker after transfer")
        if not killed:
            problems.append(f"payoutkill hit no transfer in {WINDOWS} windows: the window was not tested")
        recovered = sh(flask_bin, "--app", "wsgi", "money", "payouts",
                       env={**env, "PAYOUT_RECOVER_AFTER_SECONDS": "0"}).stdout
        drv.note(f"payoutkill: recovery {recovered.strip()[:200]}")
        transfers = [p for _, path, p in fake.requests if path == "/v1/transfers"]
    rows = drv.sql(f"SELECT id, status, amount_micros, processor_ref FROM payouts WHERE account_id = '{drv.seller_id}'")
    posted = drv.sql(f"SELECT ref FROM ledger_transactions WHERE kind = 'payout' "
                     f"AND account_id = '{drv.seller_id}'")  # its own: usdcpayout pays another seller
    owed = drv.sql(f"SELECT coalesce(sum(amount_micros), 0) FROM ledger_entries "
                   f"WHERE ledger_account = 'payable:{drv.seller_id}'")[0][0]
    if len(transfers) != 1:
        problems.append(f"payoutkill: {len(transfers)} transfers at the processor, expected 1")
    if len(rows) != 1 or rows[0][1] != "paid":
        problems.append(f"payoutkill: payouts {rows}, expected one paid")
    elif killed and rows[0][3] != killed[0]:
        problems.append(f"payoutkill: booked {rows[0][3]}, the processor made {killed[0]}")
    if [r[0] for r in posted] != [f"payout:{rows[0][0]}" if rows else None]:
        problems.append(f"payoutkill: payout postings {posted}")
    if not 0 <= int(owed) < 10_000:  # whole cents are paid out; a fraction of a cent stays owed
        problems.append(f"payoutkill: {owed} micros still owed after the payout")
    return problems, {"transfers": len(transfers), "payouts": rows, "killed_after": killed}
