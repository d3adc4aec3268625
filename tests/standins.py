"""Local stand-ins for the payment world: a Stripe API server (enough for the SDK calls
the app makes, plus signed webhook events), an EVM JSON-RPC node (USDC ``balanceOf``,
``eth_getLogs``, ``eth_blockNumber``, receipts, signed USDC ``transfer`` transactions;
Solana token accounts) and an x402 facilitator. Each is a ``tests.support.standin.StandIn``."""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from urllib.parse import parse_qsl

import rlp
from eth_account import Account
from eth_utils import keccak

from app.services.billing.processors import sign_payload
from demo.facilitator import Facilitator
from tests.support.standin import Request, StandIn

STRIPE_METHODS = {
    "pm_card_visa": {"type": "card", "card": {"brand": "visa", "last4": "4242"}},
    "pm_card_chargeDeclined": {"type": "card", "card": {"brand": "visa", "last4": "0002"}},
    "pm_card_authenticationRequired": {"type": "card", "card": {"brand": "visa", "last4": "3184"}},
    "pm_usBankAccount": {"type": "us_bank_account",
                         "us_bank_account": {"bank_name": "STRIPE TEST BANK", "last4": "6789"}},
}


def _nest(pairs: list[tuple[str, str]]) -> dict:
    """Stripe form encoding (``a[b][c]=v``) to nested dicts."""
    out: dict = {}
    for key, value in pairs:
        parts = key.replace("]", "").split("[")
        cur = out
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    return out


class FakeStripe:
    """State of the Stripe stand-in. ``requests`` records (method, path, params)."""

    def __init__(self, webhook_secret: str):
        self.webhook_secret = webhook_secret
        self.requests: list[tuple[str, str, dict]] = []
        self.idempotent: dict[str, tuple[int, dict]] = {}
        self.sessions: dict[str, dict] = {}  # checkout sessions by id (``status``: open, complete, expired)
        self.intents: dict[str, dict] = {}  # payment intents a test made retrievable (GET /v1/payment_intents/id)
        self.lock = threading.Lock()
        self.n = 0

    def _id(self, prefix: str) -> str:
        with self.lock:
            self.n += 1
            return f"{prefix}_test_{self.n:06d}"

    def handle(self, method: str, path: str, params: dict, headers) -> tuple[int, dict]:
        if not (headers.get("Authorization") or "").startswith("Bearer sk_test_"):
            return 401, {"error": {"type": "invalid_request_error", "message": "Invalid API key."}}
        key = headers.get("Idempotency-Key")
        if key and (method, path, key) in self.idempotent:
            return self.idempotent[(method, path, key)]
        self.requests.append((method, path, params))
        out = self._route(method, path, params)
        if key:
            self.idempotent[(method, path, key)] = out
        return out

    def _route(self, method, path, params):
        parts = path.strip("/").split("/")
        if parts[:2] == ["v1", "customers"]:
            cid = parts[2] if len(parts) > 2 else self._id("cus")
            return 200, {"id": cid, "object": "customer", "metadata": params.get("metadata", {})}
        if parts[:2] == ["v1", "payment_methods"] and len(parts) >= 3:
            pm = STRIPE_METHODS.get(parts[2])
            if pm is None:
                return 404, {"error": {"type": "invalid_request_error", "code": "resource_missing",
                                       "param": "payment_method",
                                       "message": f"No such PaymentMethod: '{parts[2]}'"}}
            return 200, {"id": parts[2], "object": "payment_method", **pm}
        if parts[:3] == ["v1", "checkout", "sessions"] and len(parts) > 3:  # retrieve, expire
            session = self.sessions.get(parts[3])
            if session is None:
                return 404, {"error": {"type": "invalid_request_error", "code": "resource_missing",
                                       "message": f"No such checkout.session: '{parts[3]}'"}}
            if parts[4:] == ["expire"]:
                if session["status"] != "open":
                    return 400, {"error": {"type": "invalid_request_error",
                                           "message": f"Only Checkout Sessions with a status in [\"open\"] can "
                                                      f"be expired. This session has status {session['status']}."}}
                session.update(status="expired", url=None)
            return 200, session
        if parts[:3] == ["v1", "checkout", "sessions"]:
            sid = self._id("cs")
            self.sessions[sid] = {"id": sid, "object": "checkout.session",
                                  "url": f"https://checkout.stripe.test/c/pay/{sid}",
                                  "payment_status": "unpaid", "status": "open",
                                  "amount_total": int(params["line_items"]["0"]["price_data"]["unit_amount"]),
                                  "metadata": params.get("metadata", {})}
            return 200, self.sessions[sid]
        if parts[:2] == ["v1", "payment_intents"] and len(parts) == 3 and method == "GET":
            intent = self.intents.get(parts[2])
            if intent is None:
                return 404, {"error": {"type": "invalid_request_error", "code": "resource_missing",
                                       "message": f"No such payment_intent: '{parts[2]}'"}}
            return 200, {"object": "payment_intent", **intent}
        if parts[:2] == ["v1", "transfers"]:  # Connect transfers (payouts)
            if "fail" in params.get("destination", ""):
                return 400, {"error": {"type": "invalid_request_error", "code": "account_invalid",
                                       "param": "destination",
                                       "message": f"No such destination: '{params.get('destination')}'"}}
            return 200, {"id": self._id("tr"), "object": "transfer", "amount": int(params["amount"]),
                         "currency": params["currency"], "destination": params["destination"],
                         "metadata": params.get("metadata", {})}
        if parts[:2] == ["v1", "payment_intents"]:
            pid = self._id("pi")
            pm = params.get("payment_method")
            base = {"id": pid, "object": "payment_intent", "amount": int(params["amount"]),
                    "currency": params["currency"], "metadata": params.get("metadata", {})}
            if pm == "pm_card_chargeDeclined":
                return 402, {"error": {"type": "card_error", "code": "card_declined", "decline_code": "generic_decline",
                                       "message": "Your card was declined.",
                                       "payment_intent": {**base, "status": "requires_payment_method"}}}
            if pm == "pm_card_authenticationRequired" and params.get("off_session") == "true":
                # Stripe's off-session answer for a card that asks for 3-D Secure
                return 402, {"error": {"type": "card_error", "code": "authentication_required",
                                       "decline_code": "authentication_required",
                                       "message": "Your card was declined. This transaction requires authentication.",
                                       "payment_intent": {**base, "status": "requires_payment_method"}}}
            if pm == "pm_usBankAccount":
                return 200, {**base, "status": "processing"}
            return 200, {**base, "status": "succeeded", "amount_received": int(params["amount"])}
        return 404, {"error": {"type": "invalid_request_error", "message": f"Unrecognized request URL {path}"}}

    # --- webhooks ---
    def event(self, etype: str, obj: dict, event_id: str | None = None) -> dict:
        return {"id": event_id or self._id("evt"), "object": "event", "type": etype, "livemode": False,
                "created": int(time.time()), "api_version": "2026-01-01", "data": {"object": obj}}

    def signed(self, event: dict, secret: str | None = None, timestamp: int | None = None) -> tuple[bytes, str]:
        payload = json.dumps(event).encode()
        return payload, sign_payload(payload, secret or self.webhook_secret, timestamp)


@contextmanager
def stripe_server(webhook_secret: str = "whsec_test_standin"):
    state = FakeStripe(webhook_secret)
    server = StandIn()

    @server.route("*", "*")
    def _any(req: Request):
        body = req.body.decode()
        params = _nest(parse_qsl(body or req.target.partition("?")[2], keep_blank_values=True))
        status, out = state.handle(req.method, req.path, params, req.headers)
        return status, out, {"Request-Id": "req_standin"}

    with server as url:
        state.url = url
        yield state


class RpcError(Exception):
    """A JSON-RPC error answer of the stand-in node (``-32000``, the message)."""


class FakeChain:
    """An EVM node: USDC balances, Transfer logs, receipts, a block height; Solana too.

    Signed transactions (``eth_sendRawTransaction``, legacy EIP-155, decoded with rlp, the
    sender recovered with eth-account): only a USDC ``transfer`` on ``chain_id`` with the
    sender's next nonce (a later nonce waits in a pool until the gap is filled), and, when
    ``payout_wallet`` is set, signed by it. Each is mined at once in a new block: it moves the USDC (a ``Transfer`` log, receipt status 1), or, when
    the sender holds too little or ``revert_next`` is > 0, reverts (status 0, nothing moves,
    the nonce is used), as the USDC contract does. The same transaction sent again answers
    its hash and changes nothing. ``sent`` lists the transactions mined."""

    TRANSFER = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"

    def __init__(self, usdc: str):
        self.usdc = usdc.lower()
        self.balances: dict[str, int] = {}
        self.spl: dict[str, int] = {}
        self.logs: list[dict] = []
        self.receipts: dict[str, int] = {}
        self.receipt_logs: dict[str, list[dict]] = {}
        self.used_authorizations: set[tuple[str, str]] = set()  # EIP-3009 (authorizer, nonce)
        self.block = 1000
        self.calls: list[str] = []
        self.fail = False
        self.chain_id = 8453
        self.gas_price = 1_000_000_000
        self.nonces: dict[str, int] = {}        # sender (lower-case) -> transactions mined
        self.receipt_blocks: dict[str, int] = {}
        self.sent: list[dict] = []              # {tx, from, to, value, nonce, status}
        self.payout_wallet: str | None = None
        self.revert_next = 0
        self.queued: dict[tuple[str, int], str] = {}  # (sender, nonce) -> raw transaction past a gap

    def transfer(self, sender: str, to: str, value: int, block: int, tx: str, log_index: int = 0,
                 status: int = 1, removed: bool = False, token: str | None = None) -> dict:
        entry = {"address": (token or self.usdc), "blockNumber": hex(block), "transactionHash": tx,
                 "logIndex": hex(log_index), "removed": removed, "data": hex(value),
                 "topics": [self.TRANSFER, "0x" + sender.lower()[2:].rjust(64, "0"),
                            "0x" + to.lower()[2:].rjust(64, "0")]}
        self.logs.append(entry)
        self.receipts[tx] = status
        return entry

    AUTHORIZATION_USED = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"

    def transfer_with_authorization(self, sender: str, to: str, value: int, nonce: str, block: int, tx: str,
                                    log_index: int = 1) -> dict:
        """What a facilitator's ``transferWithAuthorization`` leaves on chain: the Transfer log,
        an ``AuthorizationUsed`` log in its receipt, and the authorization marked used."""
        entry = self.transfer(sender, to, value, block, tx, log_index)
        self.receipt_logs[tx] = [{"address": self.usdc, "logIndex": hex(log_index - 1), "data": "0x",
                                  "topics": [self.AUTHORIZATION_USED, "0x" + sender.lower()[2:].rjust(64, "0"),
                                             nonce.lower()]}, entry]
        self.used_authorizations.add((sender.lower(), nonce.lower()))
        return entry

    def rpc(self, method: str, params: list):
        self.calls.append(method)
        if self.fail:
            raise RuntimeError("node down")
        if method == "eth_blockNumber":
            return hex(self.block)
        if method == "eth_call":
            call = params[0]
            if call["data"].startswith("0xe94a0102"):  # EIP-3009 authorizationState(address,bytes32)
                key = ("0x" + call["data"][10:74][-40:], "0x" + call["data"][74:138])
                return "0x" + format(int(key in self.used_authorizations), "064x")
            assert call["to"].lower() == self.usdc and call["data"].startswith("0x70a08231")
            addr = "0x" + call["data"][-40:]
            return "0x" + format(self.balances.get(addr.lower(), 0), "064x")
        if method == "eth_getLogs":
            f = params[0]
            lo, hi = int(f["fromBlock"], 16), int(f["toBlock"], 16)
            out = []
            for entry in self.logs:
                if entry["address"] != f["address"].lower() or not lo <= int(entry["blockNumber"], 16) <= hi:
                    continue
                if any(t is not None and t.lower() != entry["topics"][i] for i, t in enumerate(f["topics"])):
                    continue
                out.append(entry)
            return out
        if method == "eth_getTransactionReceipt":
            status = self.receipts.get(params[0])
            return None if status is None else {"transactionHash": params[0], "status": hex(status),
                                                "blockNumber": hex(self.receipt_blocks.get(params[0], self.block)),
                                                "logs": self.receipt_logs.get(params[0], [])}
        if method == "eth_chainId":
            return hex(self.chain_id)
        if method == "eth_gasPrice":
            return hex(self.gas_price)
        if method == "eth_getTransactionCount":
            return hex(self.nonces.get(params[0].lower(), 0))
        if method == "eth_sendRawTransaction":
            return self.send_raw(params[0])
        if method == "getTokenAccountsByOwner":
            amount = self.spl.get(params[0], 0)
            return {"value": [{"account": {"data": {"parsed": {"info": {"tokenAmount": {"amount": str(amount)}}}}}}]}
        raise KeyError(method)


    def send_raw(self, raw_hex: str) -> str:
        raw = bytes.fromhex(raw_hex[2:] if raw_hex.startswith("0x") else raw_hex)
        tx = "0x" + keccak(raw).hex()
        if tx in self.receipts:
            return tx  # already mined: the same answer, nothing moves again
        try:
            nonce, _price, _gas, to, _value, data, v, _r, _s = rlp.decode(raw)
            sender = Account.recover_transaction(raw).lower()
        except Exception as exc:  # noqa: BLE001 - what a node says about bytes it cannot read
            raise RpcError(f"invalid transaction: {exc}") from None
        if (int.from_bytes(v, "big") - 35) // 2 != self.chain_id:
            raise RpcError("invalid chain id for signer")
        if "0x" + to.hex() != self.usdc or data[:4].hex() != "a9059cbb" or len(data) != 68:
            raise RpcError("the stand-in only mines USDC transfer(address,uint256)")
        if self.payout_wallet is not None and sender != self.payout_wallet.lower():
            raise RpcError(f"{sender} is not the payout wallet")
        nonce = int.from_bytes(nonce, "big")
        expected = self.nonces.get(sender, 0)
        if nonce < expected:
            raise RpcError(f"nonce too low: next nonce {expected}, tx nonce {nonce}")
        if nonce > expected:  # waits in the pool until the nonces before it are mined
            self.queued[(sender, nonce)] = raw_hex
            return tx
        to_addr, value = "0x" + data[16:36].hex(), int.from_bytes(data[36:68], "big")
        self.block += 1
        self.nonces[sender] = expected + 1
        ok = self.balances.get(sender, 0) >= value and self.revert_next <= 0
        if ok:
            self.balances[sender] -= value
            self.balances[to_addr] = self.balances.get(to_addr, 0) + value
            self.receipt_logs[tx] = [self.transfer(sender, to_addr, value, self.block, tx)]
        else:
            self.revert_next = max(self.revert_next - 1, 0)
            self.receipts[tx] = 0
        self.receipt_blocks[tx] = self.block
        self.sent.append({"tx": tx, "from": sender, "to": to_addr, "value": value, "nonce": nonce,
                          "status": int(ok)})
        waiting = self.queued.pop((sender, nonce + 1), None)
        if waiting is not None:
            self.send_raw(waiting)
        return tx


def use_chain(monkeypatch, app, url: str, *, solana: str | None = None, **config) -> None:
    """Point the app at a chain stand-in: ``base`` (and ``solana`` when given) at ``url``,
    the other chains off, and the other ``config`` keys set for the test."""
    monkeypatch.setitem(app.config, "RPC_URLS", {"base": url, "ethereum": None, "polygon": None, "solana": solana})
    for key, value in config.items():
        monkeypatch.setitem(app.config, key, value)


@contextmanager
def chain_server(usdc: str):
    state = FakeChain(usdc)
    server = StandIn()

    @server.route("POST", "*")
    def _rpc(req: Request):
        call = req.json()
        try:
            return 200, {"jsonrpc": "2.0", "id": call["id"], "result": state.rpc(call["method"], call["params"])}
        except KeyError:
            return 200, {"jsonrpc": "2.0", "id": call["id"], "error": {"code": -32601, "message": "method not found"}}
        except RpcError as exc:
            return 200, {"jsonrpc": "2.0", "id": call["id"], "error": {"code": -32000, "message": str(exc)}}
        except Exception:  # noqa: BLE001 - the node is "down"
            return 500, {"error": "down"}

    with server as url:
        state.url = url
        yield state


class FakeFacilitator:
    """The one stand-in x402 facilitator: the demo facilitator (``demo/facilitator.py``:
    verifies the EIP-3009 signature locally, settles each authorization once and answers a
    transaction hash) served by a ``StandIn``, with test knobs: ``verify`` / ``settle``
    (a dict) replace its answer; ``verify_status`` / ``settle_status`` their HTTP status
    (default 200);
    ``settle_delay`` seconds before ``/settle`` answers (after
    settling); ``on_settle(body, transaction)`` runs when an authorization is first settled
    (e.g. to move the USDC on a stand-in chain); ``after_settle(body, answer)`` runs after
    each settlement, before the answer is sent (e.g. to hang or to kill the caller)."""

    def __init__(self):
        self.facilitator = Facilitator()
        self.verify: dict | None = None
        self.settle: dict | None = None
        self.verify_status = 200
        self.settle_status = 200
        self.calls: list[tuple[str, dict]] = []
        self.settle_delay = 0.0
        self.on_settle = None
        self.after_settle = None
        self.url: str | None = None
        self._server: StandIn | None = None

    def answer(self, req: Request):
        body = req.json()
        self.calls.append((req.target, body))
        if req.target.endswith("/verify"):
            return self.verify_status, self.verify if self.verify is not None else self.facilitator.verify(body)
        answer = self.settle if self.settle is not None else self.facilitator.settle(body, self.on_settle)
        if self.settle_delay:
            time.sleep(self.settle_delay)
        if self.after_settle is not None:
            self.after_settle(body, answer)
        return self.settle_status, answer

    def start(self) -> str:
        server = StandIn()
        server.route("POST", "*")(self.answer)
        self.url = server.start()
        self._server = server
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()


@contextmanager
def facilitator_server():
    """A ``FakeFacilitator`` on a free port (``.url``) for the block."""
    state = FakeFacilitator()
    state.start()
    try:
        yield state
    finally:
        state.stop()


_SHARED: FakeFacilitator | None = None


def shared_facilitator_url() -> str:
    """The URL of one ``FakeFacilitator`` serving the whole test process (started on first
    use): the suite's default ``X402_FACILITATOR_URL`` (tests/conftest.py ``base_config``),
    also given to the servers the tests start."""
    global _SHARED
    if _SHARED is None:
        _SHARED = FakeFacilitator()
        _SHARED.start()
    return _SHARED.url
