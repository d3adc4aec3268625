"""Automatic x402 payment of a 402 ``payment_required`` answer with the official ``x402``
package (``pip install 'gateway-client[x402]'``) and an ``eth_account`` account.

The payer reads the payment request of the 402 (the ``PAYMENT-REQUIRED`` header, or the
x402 v1 body), signs an ``exact`` EVM payment with the account and returns the headers
to resend the call with (``PAYMENT-SIGNATURE`` for v2). The call is resent once, with
the same Idempotency-Key.
"""
from __future__ import annotations

import base64
import json
from typing import Any, Mapping

from gateway_client.errors import PaymentFailed, PaymentRequired


def _x402() -> Any:
    try:
        import x402
        from x402.http import x402_http_client
        from x402.mechanisms.evm.exact import register
        from x402.mechanisms.evm import signers
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise PaymentFailed("x402 auto-pay needs the x402 extra: pip install 'gateway-client[x402]'") from exc
    return x402, x402_http_client, register, signers


def _required(http_client: Any, exc: PaymentRequired) -> Any:
    headers = {k.upper(): v for k, v in exc.headers.items()}
    try:
        return http_client.get_payment_required_response(lambda n: headers.get(n.upper()), exc.body)
    except ValueError as err:
        raise PaymentFailed(f"the 402 carries no usable x402 payment request: {err}") from err


class _Payer:
    """An x402 client paying as ``account``: the sync or the async one of the SDK."""

    _SUFFIX = ""  # the SDK names its sync classes x402ClientSync, x402HTTPClientSync

    def __init__(self, account: Any) -> None:
        x402, http, register, signers = _x402()
        client = register.register_exact_evm_client(getattr(x402, "x402Client" + self._SUFFIX)(),
                                                    signers.EthAccountSigner(account))
        self._http = getattr(http, "x402HTTPClient" + self._SUFFIX)(client)
        self.address: str = account.address


class SyncPayer(_Payer):
    """Pays 402s for the sync client."""

    _SUFFIX = "Sync"

    def headers_for(self, exc: PaymentRequired) -> dict[str, str]:
        payload = self._http.create_payment_payload(_required(self._http, exc))
        return dict(self._http.encode_payment_signature_header(payload))


class AsyncPayer(_Payer):
    """Pays 402s for the async client."""

    async def headers_for(self, exc: PaymentRequired) -> dict[str, str]:
        payload = await self._http.create_payment_payload(_required(self._http, exc))
        return dict(self._http.encode_payment_signature_header(payload))


def settlement(headers: Mapping[str, str]) -> dict[str, Any] | None:
    """The x402 settlement of a paid call (``PAYMENT-RESPONSE`` / ``X-PAYMENT-RESPONSE``:
    base64 JSON), or None."""
    value = headers.get("payment-response") or headers.get("x-payment-response")
    if not value:
        return None
    try:
        data = json.loads(base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_"
                                            if "-" in value or "_" in value else None))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
