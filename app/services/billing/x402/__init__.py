"""x402 pay-per-call (DESIGN §8): ``requirements`` builds the 402 challenge, ``payload``
decodes and verifies ``X-Payment`` / ``PAYMENT-SIGNATURE`` (EIP-3009), ``settlement``
reserves each authorization once, settles it (through the facilitator for live payments;
locally, as test money, for test-mode ones) and books the credit; ``reconcile`` resolves
what was left in doubt. This package's names are re-exported here, so callers write
``from app.services.billing import x402`` and ``x402.accept(...)``.

x402 is *offered* (``offered()``: ``PAYMENT-REQUIRED``, ``X-Pay-To`` on 402s) only with a
pay-to address and a facilitator (``X402_FACILITATOR_URL``). Sandbox settlement never
credits live money.

What comes from the ``x402`` package (x402==2.25.0): the wire types — ``PaymentRequirements``
/ ``PaymentRequirementsV1`` / ``PaymentRequired`` / ``ResourceInfo`` for the 402,
``PaymentPayload`` / ``PaymentPayloadV1`` and ``ExactEIP3009Payload`` for the payment header,
``VerifyResponse`` / ``SettleResponse`` for the facilitator's answers and the
``PAYMENT-RESPONSE`` header — the header encoders (``x402.http.utils``), and the EIP-3009
EIP-712 hash and EOA signature check. What stays ours, and why:

* the facilitator HTTP call: the package's ``HTTPFacilitatorClientSync`` uses its own
  ``httpx`` client (redirects followed, no address policy), so requests go through
  ``app/services/platform/http.py`` (SSRF policy, ``X402_FACILITATOR_TIMEOUT_SECONDS``) and
  the package's request/response types are serialized and parsed around it; its client
  also raises on a slow answer where we must keep the authorization ``reserved``;
* decoding the header: the package's decoder takes neither base64url nor a size bound;
* the resource-server flow (``x402ResourceServer``): ours reserves each authorization in
  the database before settling and books the credit to the balance before the charge (money.md).
"""
from app.services.billing.x402.payload import (MAX_HEADER_BYTES, FacilitatorUnavailable, InvalidPayment,
                                               PaymentInvalid, SettlementUnavailable, decode, header_from, verify)
from app.services.billing.x402.requirements import (ATOMIC_PER_CENT, PAYMENT_HEADERS, enabled, is_sandbox,
                                                    networks, offered, pay_to, payment_required)
from app.services.billing.x402.settlement import (X402Payment, accept, book, reserve, response_headers,
                                                  settle, verify_and_reserve)
from app.services.billing.x402.reconcile import book_orphans, reconcile

__all__ = ["ATOMIC_PER_CENT", "MAX_HEADER_BYTES", "PAYMENT_HEADERS", "FacilitatorUnavailable", "InvalidPayment",
           "PaymentInvalid", "SettlementUnavailable",
           "X402Payment", "accept", "book", "book_orphans", "decode", "enabled", "header_from",
           "is_sandbox", "networks", "offered", "pay_to", "payment_required", "reconcile", "reserve",
           "response_headers", "settle", "verify", "verify_and_reserve"]
