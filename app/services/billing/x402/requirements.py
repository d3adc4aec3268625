"""x402 payment requirements: which networks and payee are configured, whether x402 is
offered, the ``exact``-scheme requirements for a price (the ``x402`` package's
``PaymentRequirements`` / ``PaymentRequirementsV1``), and the 402 challenge body and headers
(``PaymentRequired``, encoded by ``x402.http.utils``).
"""
from __future__ import annotations

from eth_utils import to_checksum_address
from flask import current_app
from x402.http.utils import encode_payment_required_header
from x402.schemas import PaymentRequired, PaymentRequirements, ResourceInfo
from x402.schemas.v1 import PaymentRequirementsV1

from app.services.billing import chains

PAYMENT_HEADERS = ("PAYMENT-SIGNATURE", "X-Payment")


ATOMIC_PER_CENT = 10_000  # USDC has 6 decimals: one atomic unit is one micro-dollar


def enabled() -> bool:
    """A pay-to address is configured (always outside production): payment headers are read."""
    return bool(current_app.config.get("X402_PAY_TO"))


def offered() -> bool:
    """x402 is offered in 402 responses (``PAYMENT-REQUIRED``, ``X-Pay-To``): a pay-to address
    and a facilitator (``X402_FACILITATOR_URL``) to settle live payments with. Without a
    facilitator only test-mode payments could settle (sandbox), and test-mode calls never
    answer 402 — so nothing is offered."""
    return enabled() and bool(current_app.config.get("X402_FACILITATOR_URL"))


def networks() -> list[str]:
    if not enabled():
        return []
    return [n for n in current_app.config["X402_NETWORKS"] if n in chains.EVM_CHAINS]


def pay_to() -> str:
    return to_checksum_address(current_app.config["X402_PAY_TO"])


def is_sandbox(mode: str) -> bool:
    """Settled locally, as play money on the test balance: test mode, and only test mode."""
    return mode == "test"


def v2_requirement(chain: str, atomic: int) -> PaymentRequirements:  # atomic USDC == micros
    name, version = chains.USDC_EIP712[chain]
    return PaymentRequirements(
        scheme="exact", network=chains.CAIP2[chain], asset=to_checksum_address(chains.usdc_contract(chain)),
        amount=str(atomic), pay_to=pay_to(), max_timeout_seconds=int(current_app.config["X402_MAX_TIMEOUT_SECONDS"]),
        extra={"name": name, "version": version})


def v1_requirement(chain: str, atomic: int, resource_url: str, description: str) -> PaymentRequirementsV1:
    req = v2_requirement(chain, atomic)
    return PaymentRequirementsV1(
        scheme="exact", network=chain, max_amount_required=str(atomic), resource=resource_url,
        description=description, mime_type="application/json", pay_to=req.pay_to,
        max_timeout_seconds=req.max_timeout_seconds, asset=req.asset, extra=req.extra)


def wire(model) -> dict:
    """An x402 model as it goes on the wire (camelCase, no nulls)."""
    return model.model_dump(by_alias=True, exclude_none=True)


def payment_required(price_cents: int, resource_url: str, description: str = "Module call",
                     error: str | None = None, extensions: dict | None = None) -> tuple[dict, dict]:
    """(body fields, headers) of an x402 payment request: the v1 body (``x402Version``,
    ``accepts``) and the v2 ``PAYMENT-REQUIRED`` header. Merge the body fields into the
    SPEC 402 error body and the headers into its headers. Empty when x402 is not offered.

    ``extensions``: the resource's x402 extensions (``{"bazaar": …}``, ``billing.bazaar``):
    the v2 request's ``extensions``, and x402 v1's form of the Bazaar metadata (each v1
    requirement's ``outputSchema``)."""
    if not offered():
        return {}, {}
    from app.services.billing import bazaar

    atomic = price_cents * ATOMIC_PER_CENT
    v1_schema = bazaar.v1_output_schema(extensions) if extensions else None
    v1 = [wire(v1_requirement(c, atomic, resource_url, description).model_copy(update={"output_schema": v1_schema}))
          for c in networks()]
    v2 = PaymentRequired(error=error or "Payment required", accepts=[v2_requirement(c, atomic) for c in networks()],
                         resource=ResourceInfo(url=resource_url, description=description,
                                               mime_type="application/json"),
                         extensions=extensions or None)
    return {"x402Version": 1, "accepts": v1}, {"PAYMENT-REQUIRED": encode_payment_required_header(v2)}
