"""The demo x402 facilitator (``demo/facilitator.py``; ``make run``'s, and the tests' stand-in):
it verifies the EIP-3009 signature itself, settles an authorization once (the same request
again answers the same settlement) and refuses a tampered or reused one."""
from __future__ import annotations

from eth_account import Account as EthAccount
from x402 import x402ClientSync
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentRequired, PaymentRequirements

from demo.facilitator import Facilitator

REQ = PaymentRequirements(scheme="exact", network="eip155:8453", asset="0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
                          amount="30000", pay_to="0x000000000000000000000000000000000000F402",
                          max_timeout_seconds=300, extra={"name": "USD Coin", "version": "2"})


def _body(wallet) -> dict:
    client = register_exact_evm_client(x402ClientSync(), EthAccountSigner(wallet))
    payload = client.create_payment_payload(PaymentRequired(accepts=[REQ]))
    return {"x402Version": 2, "paymentPayload": payload.model_dump(by_alias=True, exclude_none=True),
            "paymentRequirements": REQ.model_dump(by_alias=True, exclude_none=True)}


def test_verifies_signature_and_settles_once():
    fac, wallet = Facilitator(), EthAccount.create()
    body = _body(wallet)
    assert fac.verify(body) == {"isValid": True, "payer": wallet.address}
    first = fac.settle(body)
    assert first["success"] and len(first["transaction"]) == 66 and first["payer"] == wallet.address
    assert fac.settle(body) == first  # idempotent: reconciliation may ask again
    reused = {**body, "paymentRequirements": {**body["paymentRequirements"], "maxTimeoutSeconds": 60}}
    assert fac.verify(reused)["invalidReason"] == "invalid_exact_evm_nonce_already_used"
    assert fac.settle(reused)["errorReason"] == "invalid_exact_evm_nonce_already_used"


def test_refuses_tampered_value_and_foreign_signer():
    fac, wallet = Facilitator(), EthAccount.create()
    tampered = _body(wallet)
    tampered["paymentPayload"]["payload"]["authorization"]["value"] = "30001"
    assert fac.verify(tampered)["invalidReason"] == "invalid_exact_evm_payload_authorization_value_mismatch"
    tampered["paymentRequirements"]["amount"] = "30001"
    assert fac.verify(tampered)["invalidReason"] == "invalid_exact_evm_payload_signature"
    forged = _body(wallet)
    forged["paymentPayload"]["payload"]["authorization"]["from"] = EthAccount.create().address
    refused = fac.settle(forged)
    assert not refused["success"] and refused["errorReason"] == "invalid_exact_evm_payload_signature"


def test_the_public_chains_are_production_defaults_only(monkeypatch):
    """The RPC endpoints defaulted to public mainnet nodes in every environment: under
    ``make run`` (and in the tests) x402 reconciliation asked a public node first, which
    failed offline before the facilitator was asked. Outside production no chain is
    configured unless RPC_URL_<CHAIN> names one (make run: its demo chain); production keeps
    the public nodes as its documented defaults."""
    from config import load_config

    for chain in ("BASE", "ETHEREUM", "POLYGON", "SOLANA"):
        monkeypatch.delenv(f"RPC_URL_{chain}", raising=False)
    for env in ("development", "test"):
        assert load_config({"APP_ENV": env})["RPC_URLS"] == {"base": None, "ethereum": None, "polygon": None,
                                                               "solana": None}
    monkeypatch.setenv("RPC_URL_BASE", "http://127.0.0.1:9/rpc")
    assert load_config({"APP_ENV": "development"})["RPC_URLS"]["base"] == "http://127.0.0.1:9/rpc"
    monkeypatch.delenv("RPC_URL_BASE")
    for name, value in (("SECRET_KEY", "s"), ("REDIS_URL", "redis://127.0.0.1:1/0"), ("RECEIPT_SIGNING_KEY", "k")):
        monkeypatch.setenv(name, value)
    assert load_config({"APP_ENV": "production"})["RPC_URLS"] == {
        "base": "https://mainnet.base.org", "ethereum": "https://ethereum-rpc.publicnode.com",
        "polygon": "https://polygon-rpc.com", "solana": "https://api.mainnet-beta.solana.com"}


def test_the_demo_chain_knows_what_the_demo_facilitator_settled(app, monkeypatch):
    """``make run``'s chain is the demo facilitator's (``POST /rpc``): an authorization it
    settled is used there (EIP-3009 ``authorizationState``), so x402 reconciliation books it
    from the local chain; it holds no USDC and no transfers."""
    import threading
    from http.server import ThreadingHTTPServer

    from demo.facilitator import FacilitatorHandler
    from app.services.billing import chains

    handler = type("Handler", (FacilitatorHandler,), {"facilitator": Facilitator()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setitem(app.config, "RPC_URLS", {"base": f"http://127.0.0.1:{server.server_port}/rpc",
                                                     "ethereum": None, "polygon": None, "solana": None})
        wallet = EthAccount.create()
        body = _body(wallet)
        nonce = body["paymentPayload"]["payload"]["authorization"]["nonce"]
        with app.app_context():
            assert chains.authorization_state("base", wallet.address, nonce) is False
            assert handler.facilitator.settle(body)["success"]
            assert chains.authorization_state("base", wallet.address, nonce) is True
            assert chains.usdc_balance("base", wallet.address) == 0
            assert chains.block_number("base") > 0 and chains.chain_id("base") == 8453
    finally:
        server.shutdown()


def test_make_run_points_the_chain_at_its_demo_facilitator(tmp_path):
    """deploy/run-local.d/30-demo-facilitator.sh: with no X402_FACILITATOR_URL it starts the
    demo facilitator and names it and its chain (RPC_URL_BASE); a configured chain is kept,
    and with a configured facilitator (no demo one) no chain is named."""
    import os
    import subprocess
    from pathlib import Path

    part = Path(__file__).resolve().parents[1] / "deploy" / "run-local.d" / "30-demo-facilitator.sh"
    (tmp_path / "instance").mkdir()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "python").chmod(0o755)

    def run(**env):
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RPC_URL_", "X402_"))}
        out = subprocess.run(["bash", "-c", f'BIN={tmp_path}/bin; pids=(); source {part}; wait; '
                              'echo "${X402_FACILITATOR_URL:-}|${RPC_URL_BASE:-}"'],
                             env={**base, "DEMO_FACILITATOR_PORT": "8939", **env}, cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()

    assert run() == "http://127.0.0.1:8939|http://127.0.0.1:8939/rpc"
    assert run(RPC_URL_BASE="http://node.example/rpc") == "http://127.0.0.1:8939|http://node.example/rpc"
    assert run(X402_FACILITATOR_URL="http://fac.example") == "http://fac.example|"


def test_a_flask_command_finds_what_make_run_chose(tmp_path, monkeypatch):
    """``make run`` writes the settings it chose (the demo facilitator and chain, the demo
    ports, DATABASE_URL …) to ``instance/run-local.env`` while it runs; a ``flask`` command
    typed in another shell (``flask money resolve-x402``) reads what its environment does
    not set, in development only: it had no X402_FACILITATOR_URL and resolved nothing."""
    import os

    from config import load_config

    # a shell that sets none of them (`make test` exports PORT, as `make run` does)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("X402_", "RPC_URL_", "INSTANCE_PATH")) and k not in ("PORT", "BASE_URL")}
    env["INSTANCE_PATH"] = str(tmp_path)
    monkeypatch.setattr(os, "environ", env)
    (tmp_path / "run-local.env").write_text("X402_FACILITATOR_URL=http://127.0.0.1:8939\n"
                                            "RPC_URL_BASE=http://127.0.0.1:8939/rpc\nPORT=8938\n# a comment\n")
    assert load_config({"APP_ENV": "test"})["X402_FACILITATOR_URL"] is None  # never in the tests
    cfg = load_config({"APP_ENV": "development"})
    assert cfg["X402_FACILITATOR_URL"] == "http://127.0.0.1:8939"
    assert cfg["RPC_URLS"]["base"] == "http://127.0.0.1:8939/rpc" and cfg["BASE_URL"] == "http://127.0.0.1:8938"
    env.pop("X402_FACILITATOR_URL")
    env["X402_FACILITATOR_URL"] = "http://fac.example"  # what the shell sets wins
    assert load_config({"APP_ENV": "development"})["X402_FACILITATOR_URL"] == "http://fac.example"
