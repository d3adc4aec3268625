"""x402 payment requirements: which networks and payee are configured, the ``exact``-scheme
requirements for a price, and the 402 challenge body and headers.
"""
from __future__ import annotations

import base64
import json

from eth_utils import to_checksum_address
from flask import current_app

from app.services.billing import chains

PAYMENT_HEADERS = ("PAYMENT-SIGNATURE", "X-Payment")


ATOMIC_PER_CENT = 10_000  # USDC has 6 decimals: one atomic unit is one micro-dollar


def enabled() -> bool:
    """x402 is on when a pay-to address is configured (always outside production)."""
    return bool(current_app.config.get("X402_PAY_TO"))


def networks() -> list[str]:
    if not enabled():
        return []
    return [n for n in current_app.config["X402_NETWORKS"] if n in chains.EVM_CHAINS]


def pay_to() -> str:
    return to_checksum_address(current_app.config["X402_PAY_TO"])


def is_sandbox(mode: str) -> bool:
    return mode == "test" or not current_app.config.get("X402_FACILITATOR_URL")


def v2_requirement(chain: str, atomic: int) -> dict:  # atomic USDC == micros
    name, version = chains.USDC_EIP712[chain]
    return {"scheme": "exact", "network": chains.CAIP2[chain], "asset": to_checksum_address(chains.usdc_contract(chain)),
            "amount": str(atomic), "payTo": pay_to(),
            "maxTimeoutSeconds": int(current_app.config["X402_MAX_TIMEOUT_SECONDS"]),
            "extra": {"name": name, "version": version}}


def v1_requirement(chain: str, atomic: int, resource_url: str, description: str) -> dict:
    req = v2_requirement(chain, atomic)
    return {"scheme": "exact", "network": chain, "maxAmountRequired": str(atomic), "resource": resource_url,
            "description": description, "mimeType": "application/json", "payTo": req["payTo"],
            "maxTimeoutSeconds": req["maxTimeoutSeconds"], "asset": req["asset"], "extra": req["extra"]}


def requirements(price_cents: int) -> list[dict]:
    """x402 v2 ``accepts``: USDC ``exact`` on every configured network."""
    return [v2_requirement(c, price_cents * ATOMIC_PER_CENT) for c in networks()]


def b64json(obj: dict) -> str:
    return base64.b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode()


def payment_required(price_cents: int, resource_url: str, description: str = "Module call",
                     error: str | None = None) -> tuple[dict, dict]:
    """(body fields, headers) of an x402 payment request: the v1 body (``x402Version``,
    ``accepts``) and the v2 ``PAYMENT-REQUIRED`` header. Merge the body fields into the
    SPEC 402 error body and the headers into its headers. Empty when x402 is off."""
    if not enabled():
        return {}, {}
    atomic = price_cents * ATOMIC_PER_CENT
    v1 = [v1_requirement(c, atomic, resource_url, description) for c in networks()]
    v2 = {"x402Version": 2, "error": error or "Payment required", "accepts": requirements(price_cents),
          "resource": {"url": resource_url, "description": description, "mimeType": "application/json"}}
    return {"x402Version": 1, "accepts": v1}, {"PAYMENT-REQUIRED": b64json(v2)}
