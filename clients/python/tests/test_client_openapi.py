"""Every operation of the client is one the server's OpenAPI document declares: its method
and path, each query parameter, body property and header (``Idempotency-Key``) it sends,
and every required one; and it can send every query parameter and body property the
document declares (the samples give every optional value). Built from
``gateway_client.ops`` with sample values, so an operation added there without a sample
here fails ``test_every_op_is_checked``."""
from __future__ import annotations

import inspect
import re

import pytest

from conftest import _openapi
from gateway_client import ops

FILTERS = {"org_id": "org_1", "key_id": "key_1", "member_id": "acct_1", "module": "text", "model": "auto"}
SAMPLES = {
    "account": (), "modules_list": (), "module_get": ("text",),
    "call": ("text", "uppercase", {"text": "x"}, "gwc_1", lambda r: True),
    "receipt_keys": (),
    "keys_create": ("ci", {"scopes": ["call:write"], "org_id": "org_1", "spend_limit_cents": 5,
                           "spend_limit_period": "day", "expires_at": "2027-01-01T00:00:00Z",
                           "allowed_models": ["auto"], "allowed_modules": ["text"], "rpm_limit": 1,
                           "tpm_limit": 1}),
    "keys_list": ("org_1",), "keys_revoke": ("key_1", "org_1"), "keys_rotate": ("key_1", 60, "org_1"),
    "keys_update": ("key_1", {"spend_limit_cents": 5, "spend_limit_period": "day", "allowed_models": ["auto"],
                              "allowed_modules": ["text"], "rpm_limit": 1, "tpm_limit": 1, "org_id": "org_1"}),
    "usage_current": (FILTERS,), "usage_by_module": (FILTERS,), "usage_daily": (7, FILTERS),
    "usage_export": ("/dev/null", "2026-01-01", "2026-01-02", "csv", FILTERS),
    "alerts_create": ({"name": "a", "metric": "calls", "op": ">", "threshold": 1, "window": "day",
                       "channel": "email", "target": "a@example.com"}, "gwc_1", "org_1"),
    "alerts_list": ("org_1",), "alerts_delete": ("alr_1", "org_1"), "wallet_balance": ("org_1",),
    "wallet_transactions": (10, "c", "org_1"), "wallet_fund": (500, "card", "gwc_1", "org_1"),
    "pay_checkout": (500, "credits", "https://example.com/done", "gwc_1", True, "org_1"), "pay_history": ("org_1",),
    "agent_register": ("bot", "ed25519:x", "https://example.com/hook", "org_1"),
    "agent_fund": ("agt_1", 5, "gwc_1", "org_1"), "agent_disable": ("agt_1", "org_1"),
    "agent_nonce": (), "agent_signin": ("ed25519:x", "n", "base58:s"),
    "agent_siwx_challenge": (), "agent_siwx_signin": ("eyJ9",),
    "invoices_list": (10, "12", "org_1"), "invoice_get": ("inv_1", "org_1"),
    "invoice_pdf": ("inv_1", "/dev/null", "org_1"), "billing_details": ("org_1",),
    "billing_details_set": ({"name": "A", "address": "B", "country": "FR", "tax_id": "T"}, "org_1"), "methods_list": ("org_1",),
    "method_save": ("pm_card_visa", "org_1"), "method_set_default": ("pm_card_visa", "org_1"),
    "method_delete": ("pm_card_visa", "org_1"), "auto_topup_get": ("org_1",),
    "auto_topup_set": (100, 500, 1000, "org_1"), "auto_topup_delete": ("org_1",),
    "payouts_list": ("org_1",), "payout_create": ("org_1", "gwc_1"), "payout_destination": ("org_1",),
    "payout_destination_stripe": ("acct_123456", "org_1"),
    "payout_destination_usdc": ("base", "0x" + "ab" * 20, "org_1"), "payout_destination_delete": ("org_1",),
    "owner_earnings": ("org_1",),
    "build_submit": ("bot-mod", 5, ["go"], "https://example.com/m", "A module"), "builds_list": (),
    "agent_earnings": ("agt_1",), "agent_leaderboard": (5,),
    "orgs_create": ("ACME",), "orgs_list": (), "org_get": ("org_1",), "org_members": ("org_1",),
    "org_member_update": ("org_1", "acct_1", {"role": "admin", "monthly_budget_cents": 100}),
    "org_member_remove": ("org_1", "acct_1"), "org_invite": ("org_1", "a@example.com", "developer"),
    "org_invites": ("org_1",), "org_invite_revoke": ("org_1", "inv_1"), "org_invite_accept": ("tok",),
    "org_audit": ("org_1", 10, "12"), "org_audit_export": ("org_1", "/dev/null"),
    "audit": (10, "12"), "audit_export": ("/dev/null",),
    "provider_keys_list": (), "provider_key_add": ("openai", "sk-test"), "provider_key_delete": ("pk_1",),
    "byok_settings_update": (True, False),
    "alert_events": ("org_1",), "agent_usage": ("agt_1",),
    "checkout_get": ("pay_1", "org_1"), "checkout_cancel": ("pay_1", "org_1"),
    "wallet_connect_message": ("base", "0x" + "ab" * 20, "org_1"),
    "wallet_connect": ("base", "0x" + "ab" * 20, "0x" + "cd" * 65, "n0nce123", "org_1"),
}


# parameters the document declares that do not apply to what an operation asks for
NOT_APPLICABLE = {"org_audit_export": {"limit", "cursor"}, "audit_export": {"limit", "cursor"}}  # csv: no paging


def _operation(spec: dict, method: str, path: str) -> dict:
    for template, item in spec["paths"].items():
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path) and method.lower() in item:
            return {**item[method.lower()], "parameters": item.get("parameters", []) +
                    item[method.lower()].get("parameters", [])}
    raise AssertionError(f"{method} {path} is not in the OpenAPI document")


def _body_schema(spec: dict, operation: dict) -> dict:
    schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    ref = schema.get("$ref")
    return spec["components"]["schemas"][ref.rsplit("/", 1)[1]] if ref else schema


def _op_functions() -> set[str]:
    return {name for name, fn in inspect.getmembers(ops, inspect.isfunction)
            if fn.__module__ == ops.__name__ and not name.startswith("_") and name != "when"}


def test_every_op_is_checked():
    assert _op_functions() == set(SAMPLES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_op_matches_the_openapi_document(name):
    spec = _openapi()
    op = getattr(ops, name)(*SAMPLES[name])
    operation = _operation(spec, op.method, op.path)
    declared = {(p["in"], p["name"].lower()): p for p in operation["parameters"]}
    for key in op.params or {}:
        assert ("query", key) in declared, f"{name}: query parameter {key!r} is not documented"
    headers = {h.lower() for h in op.headers} - {"accept"}
    for header in headers:
        assert ("header", header) in declared, f"{name}: header {header!r} is not documented"
    assert ("header", "idempotency-key") not in declared or "idempotency-key" in headers, \
        f"{name}: the route honours an Idempotency-Key the client does not send"
    for (where, key), param in declared.items():
        if param.get("required") and where in ("query", "header"):
            assert key in {k.lower() for k in (op.params or {})} | headers, f"{name}: required {key!r} not sent"
    body = _body_schema(spec, operation)
    if op.json is None:
        assert not operation.get("requestBody", {}).get("required"), f"{name}: the body is required"
    else:
        assert body, f"{name}: sends a body the route does not take"
        open_body = body.get("additionalProperties") is True  # a module call: the module's own fields
        unknown = set() if open_body else set(op.json) - set(body.get("properties", {}))
        missing = set(body.get("required", [])) - set(op.json)
        assert not unknown and not missing, f"{name}: body fields not documented {unknown}, required missing {missing}"
    assert op.auth == bool(operation.get("security")), f"{name}: auth={op.auth} but security is {operation.get('security')}"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_op_can_send_every_documented_parameter(name):
    """(before: no ``org_id`` for payments, wallet, alerts and agents, no usage filters: an
    organisation's member could not read its balance or payments through the client)"""
    spec = _openapi()
    op = getattr(ops, name)(*SAMPLES[name])
    operation = _operation(spec, op.method, op.path)
    documented = {p["name"] for p in operation["parameters"] if p["in"] == "query"}
    if op.path.startswith("/v1/module/"):  # the module's own fields, any
        return
    documented |= set(_body_schema(spec, operation).get("properties", {}))
    assert documented - set(op.params or {}) - set(op.json or {}) - NOT_APPLICABLE.get(name, set()) == set(), name
