"""x402 under fault, for ``money_under_fault``: payers that pay each call by x402 through a
stand-in facilitator (the one of the tests, which checks the EIP-3009 signatures) whose
settlements really move USDC on a stand-in chain, and two faults:

  * ``x402hang`` – the facilitator settles (the USDC moves) and then never answers ``/settle``
    within X402_FACILITATOR_TIMEOUT_SECONDS;
  * ``x402kill`` – the facilitator settles, then every gunicorn worker is killed (``kill -9``)
    before the answer: the process dies between settlement and booking.

Afterwards ``check`` resolves what is left (``flask money resolve-x402``) and verifies that
every authorization that moved USDC on chain is in the book of outside money exactly once,
for its value, nothing else is, and each payer account's balance is its credits less its
charged calls: the payer's USDC booked exactly once, as the call's charge or as balance.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from contextlib import ExitStack

import requests
from eth_account import Account as EthAccount

from tests.api.test_module_call_x402 import PAY_TO, _pay
from tests.api.test_wallet import USDC_BASE
from tests.standins import FakeFacilitator, chain_server

FAULTS = ("x402hang", "x402kill")
TIMEOUT = 1.0  # X402_FACILITATOR_TIMEOUT_SECONDS


class X402Rails:
    """The stand-in chain and the one stand-in facilitator (``tests.standins.FakeFacilitator``:
    it checks each EIP-3009 signature and settles each authorization once), whose
    settlements move the USDC on the chain; and what moved."""

    def __init__(self):
        self.mode = "ok"  # ok | hang | kill (one kill, then ok)
        self.injected = {"hang": 0, "kill": 0}
        self.kill_workers = None  # set by the driver: kills every gunicorn worker
        self.moved: dict[tuple[str, str], int] = {}  # (payer, nonce) -> atomic USDC moved
        self.faults: dict[tuple[str, str], str] = {}  # (payer, nonce) -> the fault of its settlement
        self.lock = threading.Lock()
        self._stack = ExitStack()

    def __enter__(self):
        self.node = self._stack.enter_context(chain_server(USDC_BASE))
        self.facilitator = FakeFacilitator()
        self.facilitator.on_settle, self.facilitator.after_settle = self._move, self._fault
        self.facilitator_url = self.facilitator.start()
        self._stack.callback(self.facilitator.stop)
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def env(self) -> dict:
        return {"X402_PAY_TO": PAY_TO, "X402_NETWORKS": "base", "X402_FACILITATOR_URL": self.facilitator_url,
                "RPC_URL_BASE": self.node.url, "RPC_URL_ETHEREUM": "", "RPC_URL_POLYGON": "",
                "RPC_URL_SOLANA": "", "USDC_DEPOSIT_ADDRESS": PAY_TO, "CHAIN_CONFIRMATIONS": "0",
                "X402_FACILITATOR_TIMEOUT_SECONDS": str(TIMEOUT), "X402_RECONCILE_AFTER_SECONDS": "2",
                "PROMO_GRANT_CENTS": "0"}

    @staticmethod
    def _key(body: dict) -> tuple[str, str]:
        auth = body["paymentPayload"]["payload"]["authorization"]
        return auth["from"].lower(), auth["nonce"].lower()

    def _move(self, body: dict, tx: str) -> None:
        """The first settlement of an authorization: the USDC moves on chain."""
        auth = body["paymentPayload"]["payload"]["authorization"]
        key = self._key(body)
        with self.lock:
            self.moved[key] = int(auth["value"])
            self.node.transfer_with_authorization(auth["from"], auth["to"], int(auth["value"]), auth["nonce"],
                                                  block=self.node.block, tx=tx)
            self.node.block += 1
            mode = self.mode
            if mode == "kill":
                self.mode = "ok"
            if mode in self.injected:
                self.injected[mode] += 1
                self.faults[key] = mode

    def _fault(self, body: dict, answer: dict) -> None:
        """After settling, before answering: hang past the gateway's timeout, or kill it."""
        with self.lock:
            mode = self.faults.pop(self._key(body), "ok") if answer.get("success") else "ok"
        if mode == "hang":
            time.sleep(TIMEOUT * 3)
        elif mode == "kill" and self.kill_workers is not None:
            self.kill_workers()
            time.sleep(TIMEOUT)


def kill_all(gunicorn, note):
    def kill():
        for pid in gunicorn.children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        note("x402: settled, then every worker killed before booking")
    return kill


def accounts(drv, n: int) -> list[str]:
    """Create the payers' accounts (no balance: PROMO_GRANT_CENTS=0) before the clock starts;
    their API keys."""
    import json

    from tests.fault.money_under_fault import flask

    keys = []
    for cid in range(n):
        created = json.loads(flask(drv.env, "accounts", "create", "--email", f"x402-{cid}@example.com"))
        drv.x402_accounts.append(created["account_id"])
        keys.append(created["key"])
    return keys


def client(drv, cid: int, api_key: str) -> None:
    """One payer: its own account and wallet; every call paid by x402; an unknown outcome
    is retried with the same payment and Idempotency-Key."""
    headers = {"Authorization": f"Bearer {api_key}"}
    wallet = EthAccount.create()
    url = f"{drv.url}/v1/module/faulty/call"
    while not drv.stop.is_set():
        key = f"x402-{cid}-{uuid.uuid4().hex}"
        body = {"action": "run", "client": f"x402-{cid}", "key": key}
        try:
            challenge = requests.post(url, json=body, headers=headers, timeout=15)
        except requests.RequestException:
            time.sleep(0.3)
            continue
        if challenge.status_code != 402 or "PAYMENT-REQUIRED" not in challenge.headers:
            time.sleep(0.3)
            continue
        paid = {**headers, "Idempotency-Key": key, "PAYMENT-SIGNATURE": _pay(challenge, wallet)}
        outcome, last, deadline = None, None, time.monotonic() + 120
        while outcome is None and time.monotonic() < deadline:
            try:
                r = requests.post(url, json=body, headers=paid, timeout=15)
                last = r.status_code
            except requests.RequestException as exc:
                r, last = None, type(exc).__name__
            if r is not None and r.status_code in (200, 400, 402, 502, 504):
                outcome = {"status": r.status_code, "body": r.json()}
            else:
                with drv.lock:
                    drv.retries += 1
                time.sleep(0.3)
        with drv.lock:
            drv.results[key] = outcome or {"status": None, "last_seen": last}


def resolve(drv) -> None:
    """Run the x402 reconciliation job now (``flask money resolve-x402``)."""
    from tests.fault.money_under_fault import flask

    resolved = flask(drv.env, "money", "resolve-x402", "--older-than", "0")
    drv.note(f"x402 resolve: {resolved.strip()}")


def check(drv, rails: X402Rails, price_micros: int) -> list[str]:
    """After ``resolve``: every on-chain move booked exactly once, nothing else."""
    problems: list[str] = []
    for fault, mode in (("x402hang", "hang"), ("x402kill", "kill")):
        if fault in drv.args.faults.split(",") and not rails.injected[mode]:
            problems.append(f"x402: the {fault} fault never hit a settlement (run longer)")
    credits = {ref: int(amount) for ref, amount in drv.sql(
        "SELECT ref, amount_micros FROM external_credits WHERE ref LIKE 'x402:%'")}
    expected = {f"x402:base:{payer}:{nonce}": value for (payer, nonce), value in rails.moved.items()}
    for ref, value in expected.items():
        if credits.get(ref) != value:
            problems.append(f"x402: {ref} moved {value} on chain, booked {credits.get(ref)}")
    for ref in set(credits) - set(expected):
        problems.append(f"x402: {ref} booked but never moved on chain")
    stuck = drv.sql("SELECT count(*) FROM x402_authorizations WHERE status = 'reserved'")[0][0]
    if stuck != "0":
        problems.append(f"x402: {stuck} authorizations still reserved")
    for account in drv.x402_accounts:
        booked = int(drv.sql(f"SELECT coalesce(sum(amount_micros), 0) FROM external_credits "
                             f"WHERE account_id = '{account}'")[0][0])
        charged = int(drv.sql(f"SELECT count(*) FROM module_calls WHERE account_id = '{account}' "
                              f"AND status = 'succeeded'")[0][0]) * price_micros
        balance = int(drv.sql(f"SELECT balance_micros FROM accounts WHERE id = '{account}'")[0][0])
        if balance != booked - charged:
            problems.append(f"x402: account {account} balance {balance} != booked {booked} - charged {charged}")
    outcomes: dict[str, int] = {}
    for key, res in drv.results.items():
        if key.startswith("x402-"):
            label = f"{res.get('status')} {(res.get('body') or {}).get('reason') or ''}".strip()
            outcomes[label] = outcomes.get(label, 0) + 1
    drv.x402_summary = {"moved_on_chain": len(expected), "booked": len(credits), "outcomes": outcomes,
                        "injected": rails.injected}
    return problems
