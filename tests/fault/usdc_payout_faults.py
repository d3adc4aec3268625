"""``usdcpayout``: a USDC payout through the chain stand-in while the chain fails and the
payout worker dies between the chain's send and the booking (issue 41).

A seller owns a second module of the fault run (``usdcmod``) and has a USDC payout
destination on ``base`` (the operator's payout wallet, ``PAYOUT_WALLET_KEY``, funded on the
stand-in chain: the x402 rails' chain when they run, else one of its own). After the run
a payer calls that module, the seller's earnings are settled, and ``flask money payouts``
(retry delay 0) is run through the faults, in order:

1. the node is down: nothing is signed or sent, the payout stays ``pending``, owed;
2. the transaction reverts (the USDC contract refuses it): the payout is ``failed``,
   still owed, nothing moved;
3. the retry (attempt 2, the next nonce) is mined, and the stand-in ``kill -9``-s that
   ``flask money payouts`` process before its answer: the USDC moved, nothing is booked
   (else the window is opened again, up to ``WINDOWS`` times, rather than passing blindly);
4. the recovery (``PAYOUT_RECOVER_AFTER_SECONDS=0``) while the node is down again: still
   ``sending``, nothing booked; then with the node back: it sends the SAME signed
   transaction (already mined: the same hash), reads its receipt and books it once.

Checked: two transactions to the seller (one reverted, one succeeded), the seller's USDC
balance is exactly the payout, one ``paid`` payout (attempt 2, the succeeded hash), one
ledger posting ``payout:<id>``, nothing left owed, and a further run sends nothing. The
driver's ``money reconcile`` (its environment has the chain) then compares the USDC
payouts with the chain.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import requests
from eth_account import Account as EthAccount

from tests.api.test_wallet import USDC_BASE
from tests.fault.payout_faults import WINDOWS, kill_windows
from tests.standins import chain_server

FAULTS = ("usdcpayout",)
WALLET_KEY = "0x" + "4c" * 32
SELLER_ADDR = "0x52908400098527886E0F7030069857D2E4169EE7"
PRICE_CENTS, CALLS = 50, 10

_SETUP = """
import sys
from wsgi import app
from app.services.billing import payouts
with app.app_context():
    payouts.set_destination(sys.argv[1], "usdc", sys.argv[2], "base")
"""

_SETTLE = """
import json, sys
from wsgi import app
from app.models.base import utcnow
from app.services.money import settlement
with app.app_context():
    now = utcnow()
    month = f"{now.year:04d}-{now.month:02d}"
    _, end = settlement.month_bounds(month)
    print(json.dumps(settlement.settle_earner(sys.argv[1], month, end=end), default=str))
"""


class UsdcChain:
    """The chain the payout wallet pays on: the x402 rails' stand-in when they run (one
    ``base`` node for the run), else one of its own; the wallet funded with 1,000 USDC."""

    def __init__(self, rails=None):
        self.rails = rails
        self._stack = ExitStack()

    def __enter__(self):
        self.node = self.rails.node if self.rails is not None else self._stack.enter_context(chain_server(USDC_BASE))
        self.wallet = EthAccount.from_key(WALLET_KEY).address
        self.node.balances[self.wallet.lower()] = 1_000_000_000
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def env(self) -> dict:
        chain = {} if self.rails is not None else {  # the rails' env names the same node
            "RPC_URL_BASE": self.node.url, "RPC_URL_ETHEREUM": "", "RPC_URL_POLYGON": "", "RPC_URL_SOLANA": "",
            "CHAIN_CONFIRMATIONS": "0"}
        return {**chain, "PAYOUT_WALLET_KEY": WALLET_KEY}


def setup(drv, flask, sh, vbin, upstream_url: str) -> None:
    """Before the gunicorn starts: the chain in the environment, the module ``usdcmod``
    owned by a seller whose payout destination is a USDC address."""
    drv.env.update(drv.usdc.env())
    catalog = Path(drv.env["CATALOG_PATH"])
    (catalog / "usdcmod.yaml").write_text(
        "slug: usdcmod\nname: USDC payout target\ndescription: its owner is paid out in USDC\nowner: tests\n"
        f"status: approved\nupstream_url: {upstream_url}\nsandbox_url: {upstream_url}\n"
        f"actions:\n  - name: run\n    price_cents: {PRICE_CENTS}\n    method: POST\n    path: /run\n"
        "    timeout_seconds: 5\n")
    flask(drv.env, "catalog", "load")
    seller = json.loads(flask(drv.env, "accounts", "create", "--email", "usdc-seller@example.com"))
    drv.usdc_seller = seller["account_id"]
    flask(drv.env, "modules", "set-owner", "usdcmod", drv.usdc_seller)
    sh(str(vbin / "python"), "-c", _SETUP, drv.usdc_seller, SELLER_ADDR, env=drv.env)


def _earn(drv, flask) -> int:
    """A payer's calls of ``usdcmod`` (each retried with its key until definitive); the
    number charged."""
    payer = json.loads(flask(drv.env, "accounts", "create", "--email", "usdc-payer@example.com", "--plan",
                             "enterprise"))
    flask(drv.env, "accounts", "grant-credits", payer["account_id"], "--cents", str(PRICE_CENTS * CALLS))
    auth = {"Authorization": f"Bearer {payer['key']}"}
    charged = 0
    for _ in range(CALLS):
        key = f"usdc-{uuid.uuid4().hex}"
        for _ in range(20):
            try:
                r = requests.post(f"{drv.url}/v1/module/usdcmod/call", json={"action": "run"}, timeout=15,
                                  headers={**auth, "Idempotency-Key": key})
            except requests.RequestException:
                time.sleep(0.2)
                continue
            if r.status_code in (200, 402, 502, 504):
                charged += r.status_code == 200
                break
            time.sleep(0.2)
    deadline = time.monotonic() + 30  # the calls' finalizations (the earnings) are written
    while time.monotonic() < deadline and drv.sql(
            f"SELECT count(*) FROM module_calls WHERE account_id = '{payer['account_id']}' "
            "AND status = 'pending'")[0][0] != "0":
        time.sleep(0.2)
    return charged


def run(drv, sh, vbin, root, flask) -> tuple[list[str], dict]:
    problems: list[str] = []
    node, seller, addr = drv.usdc.node, drv.usdc_seller, SELLER_ADDR.lower()
    flask_bin = str(vbin / "flask")
    env = {**drv.env, "PAYOUT_MINIMUM_CENTS": "1", "PAYOUT_RETRY_SECONDS": "0"}
    calls = _earn(drv, flask)
    settled = json.loads(sh(str(vbin / "python"), "-c", _SETTLE, seller, env=env).stdout)
    drv.note(f"usdcpayout: {calls} calls, settled {settled}")
    if settled.get("status") != "settled":
        return [f"usdcpayout: nothing settled for the seller ({settled})"], {}

    def payouts() -> list[list[str]]:
        return drv.sql(f"SELECT id, status, attempts::text, processor_ref, amount_micros::text FROM payouts "
                       f"WHERE account_id = '{seller}'")

    def pay(extra: dict | None = None) -> str:
        return sh(flask_bin, "--app", "wsgi", "money", "payouts", env={**env, **(extra or {})}).stdout.strip()

    def to_seller() -> list[dict]:
        return [t for t in node.sent if t["to"] == addr]

    # 1. the node is down: nothing signed or sent, still owed
    node.fail = True
    try:
        pay()
    finally:
        node.fail = False
    rows = payouts()
    if [r[1:3] for r in rows] != [["pending", "0"]] or to_seller():
        problems.append(f"usdcpayout: node down: payouts {rows}, sent {to_seller()}")
    # 2. the transaction reverts: failed, still owed
    node.revert_next = 1
    pay()
    rows = payouts()
    if [r[1:3] for r in rows] != [["failed", "1"]] or [t["status"] for t in to_seller()] != [0]:
        problems.append(f"usdcpayout: revert: payouts {rows}, sent {to_seller()}")
    # 3. the retry is mined, and its worker killed before the answer
    killed: list[str] = []
    victim: list[int] = []
    real_rpc = node.rpc
    lock = threading.Lock()

    def rpc(method, params):
        out = real_rpc(method, params)
        with lock:
            if method == "eth_sendRawTransaction" and victim and not killed and \
                    any(t["tx"] == out and t["status"] == 1 and t["to"] == addr for t in node.sent):
                os.kill(victim[0], signal.SIGKILL)  # the USDC moved; its answer never arrives
                killed.append(out)
        return out

    node.rpc = rpc
    try:
        kill_windows(drv, [flask_bin, "--app", "wsgi", "money", "payouts"], env, root, victim, killed,
                     "usdcpayout: kill -9 of the payout worker after it sent the mined transaction")
    finally:
        node.rpc = real_rpc
    if not killed:
        return problems + [f"usdcpayout hit no mined transaction in {WINDOWS} windows: not tested"], {}
    rows = payouts()
    if [r[1:3] for r in rows] != [["sending", "2"]]:
        problems.append(f"usdcpayout: after the kill: payouts {rows}, expected one sending (attempt 2)")
    # 4. the recovery: the node down (unknown: still sending), then up (booked once)
    node.fail = True
    try:
        pay({"PAYOUT_RECOVER_AFTER_SECONDS": "0"})
    finally:
        node.fail = False
    if [r[1] for r in payouts()] != ["sending"]:
        problems.append(f"usdcpayout: recovery with the node down: payouts {payouts()}")
    drv.note(f"usdcpayout: recovery {pay({'PAYOUT_RECOVER_AFTER_SECONDS': '0'})[:200]}")
    pay({"PAYOUT_RECOVER_AFTER_SECONDS": "0"})  # once more: nothing left to do
    rows = payouts()
    sent = to_seller()
    posted = [r[0] for r in drv.sql(f"SELECT ref FROM ledger_transactions WHERE kind = 'payout' "
                                    f"AND account_id = '{seller}'")]
    owed = drv.sql(f"SELECT coalesce(sum(amount_micros), 0) FROM ledger_entries "
                   f"WHERE ledger_account = 'payable:{seller}'")[0][0]
    if [t["status"] for t in sent] != [0, 1]:
        problems.append(f"usdcpayout: transactions to the seller {sent}, expected one reverted, one succeeded")
    if len(rows) != 1 or rows[0][1:4] != ["paid", "2", killed[0]]:
        problems.append(f"usdcpayout: payouts {rows}, expected one paid by {killed[0]} (attempt 2)")
    elif node.balances.get(addr, 0) != int(rows[0][4]):
        problems.append(f"usdcpayout: the seller holds {node.balances.get(addr, 0)} atomic USDC, "
                        f"paid out {rows[0][4]} micros")
    if posted != [f"payout:{rows[0][0]}" if rows else None]:
        problems.append(f"usdcpayout: payout postings {posted}, expected one of its payout")
    if not 0 <= int(owed) < 10_000:  # whole cents are paid out; a fraction of a cent stays owed
        problems.append(f"usdcpayout: {owed} micros still owed after the payout")
    return problems, {"calls": calls, "transactions": [(t["tx"][:12], t["status"]) for t in sent],
                      "payouts": rows, "killed_after": killed}
