"""The official x402 client (``x402_requests`` + an eth-account test wallet) pays for a
module call against a running gunicorn with a live key, settled through the tests'
stand-in facilitator (``demo/facilitator.py``: it checks the EIP-3009 signature) — no code of
ours on the client side — and a second use of the same payment is refused."""
from __future__ import annotations

import subprocess
import sys
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

import requests
from eth_account import Account as EthAccount
from x402 import x402ClientSync
from x402.http.clients.requests import x402_requests
from x402.http.utils import decode_payment_response_header
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from demo import provider as demo
from tests.conftest import base_config
from tests.support.apps import ROOT, app_env, gunicorn


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def test_official_x402_client_pays_for_a_call(app, make_account, ledger_clean):
    server = make_server("127.0.0.1", 0, demo.app, server_class=demo._ThreadingServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = app_env(base_config())
        env["DEMO_PROVIDER_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
        env["X402_PAY_TO"] = "0x000000000000000000000000000000000000f402"
        assert env["X402_FACILITATOR_URL"]  # the stand-in facilitator (tests/conftest.py base_config)
        subprocess.run([sys.executable, "-m", "flask", "--app", "wsgi", "catalog", "load"],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        acct = make_account(cents=0)
        wallet = EthAccount.create()
        with gunicorn(env, workers=2) as url:
            h = {"Authorization": f"Bearer {acct.key}"}
            body = {"action": "word_count", "text": "pay per call"}
            assert requests.post(url + "/v1/module/text/call", headers=h, json=body).status_code == 402

            x402 = register_exact_evm_client(x402ClientSync(), EthAccountSigner(wallet))
            session = x402_requests(x402)
            r = session.post(url + "/v1/module/text/call", headers=h, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["result"]["words"] == 3
            settle = decode_payment_response_header(r.headers["PAYMENT-RESPONSE"])
            assert settle.success and settle.payer == wallet.address and len(settle.transaction) == 66
            sent = r.request.headers["PAYMENT-SIGNATURE"]

            # the same payment, replayed by hand: refused, nothing charged
            again = requests.post(url + "/v1/module/text/call", json=body,
                                  headers={**h, "PAYMENT-SIGNATURE": sent})
            assert again.status_code == 402
            assert again.json()["error"] == "payment_invalid" and again.json()["reason"] == "replayed"
            assert requests.get(url + "/api/account", headers=h).json()["balance_cents"] == 0
            hist = requests.get(url + "/api/pay/history", headers=h).json()["payments"]
            assert [p["method"] for p in hist] == ["x402"] and hist[0]["status"] == "succeeded"
    finally:
        server.shutdown()
        server.server_close()
    ledger_clean()
