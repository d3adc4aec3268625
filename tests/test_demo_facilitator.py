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
