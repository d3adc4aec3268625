"""Issue 42 item 12 (in part): a schema-valid, well-formed request is never a 400. A state
of the account that the request cannot change — no saved payment method, no connected
wallet — is a 409 on ``POST /api/wallet/fund``, and the document lists it."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("method,code", [("card", "no_payment_method"), ("ach", "no_payment_method"),
                                         ("usdc", "wallet_not_connected")])
def test_wallet_fund_state_conflicts_are_409(client, account, method, code):
    r = client.post("/api/wallet/fund", json={"amount_cents": 500, "method": method}, headers=account.headers)
    assert r.status_code == 409 and r.get_json()["error"] == code, r.get_json()


def test_the_document_lists_the_409(client):
    doc = client.get("/openapi.json").get_json()
    assert "409" in doc["paths"]["/api/wallet/fund"]["post"]["responses"]
    assert doc["x-error-codes"]["no_payment_method"]["status"] == 409
    assert doc["x-error-codes"]["wallet_not_connected"]["status"] == 409
