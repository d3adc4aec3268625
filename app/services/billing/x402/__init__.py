"""x402 pay-per-call (DESIGN §8): ``requirements`` builds the 402 challenge, ``payload``
decodes and verifies ``X-Payment`` / ``PAYMENT-SIGNATURE`` (EIP-3009, eth-account),
``settlement`` reserves each authorization once, settles it (facilitator, or locally in
sandbox mode) and books the credit. This package's names are re-exported here, so callers
write ``from app.services.billing import x402`` and ``x402.accept(...)``.
"""
from app.services.billing.x402.payload import (MAX_HEADER_BYTES, InvalidPayment, PaymentInvalid, decode,
                                               header_from, verify)
from app.services.billing.x402.requirements import (ATOMIC_PER_CENT, PAYMENT_HEADERS, enabled, is_sandbox,
                                                    networks, pay_to, payment_required, requirements)
from app.services.billing.x402.settlement import (X402Payment, accept, book, fund_call, reserve, response_headers,
                                                  settle, verify_and_reserve)
from app.services.billing.x402.reconcile import book_orphans, reconcile

__all__ = ["ATOMIC_PER_CENT", "MAX_HEADER_BYTES", "PAYMENT_HEADERS", "InvalidPayment", "PaymentInvalid",
           "X402Payment", "accept", "book", "book_orphans", "decode", "enabled", "fund_call", "header_from",
           "is_sandbox", "networks", "pay_to", "payment_required", "reconcile", "requirements", "reserve",
           "response_headers", "settle", "verify", "verify_and_reserve"]
