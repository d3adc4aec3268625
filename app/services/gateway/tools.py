"""The module catalog as agent tools: one tool per live action of an approved module, for
the MCP door (``app/blueprints/mcp``), the discovery documents and the public listing.

* **Name**: ``<slug>__<action>`` (two underscores), e.g. ``weather__current``. A slug is
  ``[a-z0-9-]`` and never holds ``_``, so the first ``__`` splits a name back without
  ambiguity whatever the action is called (``[A-Za-z0-9_-]``, ``catalog.ACTION_RE``). The
  characters are the narrowest set every MCP client and model API accepts (no dot: the
  catalog and agent builds refuse actions with one);
  a slug and an action of 64 characters each give 130, over MCP's advised 128: such a
  pair is still listed (the catalog allows it), documented in docs/mcp.md.
* **Input schema**: the catalog stores no parameter schema for an action (its YAML has
  ``name, description, price_cents, method, path, timeout_seconds``), so the schema is
  the one every action accepts: a JSON object whose properties are forwarded to the
  provider as the call body, without ``action`` (the tool name carries it). The action's
  description, which names its parameters in the demo catalog, is the tool description.
* **Price and receipt facts**: ``_meta`` keys under ``gateway/`` (price in cents, what
  is charged when, where the receipt keys are published).

Plain data only (dicts), read from the catalog's public listing; nothing is charged here.
"""
from __future__ import annotations

from app.services.gateway import catalog

SERVER_NAME = "metered-api-gateway"
INSTRUCTIONS = (
    "Each tool is one action of a module of the gateway's catalog, named <module>__<action>. "
    "A call is charged the price in the tool's _meta (gateway/price) from the account's prepaid "
    "balance; the result's structuredContent is the gateway's call response with a signed receipt. "
    "When the balance cannot cover a call, the tool error carries an x402 payment request "
    "(x402Version 2, accepts); pay it by calling again with the payment payload in "
    "_meta[\"x402/payment\"]: the settlement comes back in _meta[\"x402/payment-response\"]. "
    "Send _meta {\"gateway/idempotency-key\": \"...\"} (or the Idempotency-Key header) to retry safely.")
SEPARATOR = "__"
META_PREFIX = "gateway/"
RECEIPT_KEYS_PATH = "/api/receipts/keys"

# Every action takes a JSON object; ``action`` is the tool's own and may not be re-sent
# with another value (the door refuses it).
INPUT_SCHEMA: dict = {
    "type": "object",
    "description": "The call body: every property is forwarded as JSON to the module's provider "
                   "(see the tool description for what it reads).",
    "additionalProperties": True,
}

# What ``structuredContent`` holds on success: the gateway's call response, exactly as
# ``POST /v1/module/{slug}/call`` answers it (``ModuleCallResponseSchema``).
OUTPUT_SCHEMA: dict = {
    "type": "object",
    "required": ["ok", "module", "call_id", "cost_cents", "result", "receipt"],
    "properties": {
        "ok": {"type": "boolean", "description": "false when the provider answered 4xx (still charged)."},
        "module": {"type": "string"},
        "call_id": {"type": "string"},
        "cost_cents": {"type": "integer"},
        "result": {"type": "object", "description": "The provider's JSON object (other JSON as {data})."},
        "receipt": {
            "type": "object", "required": ["hash", "sig"],
            "description": "ed25519 receipt over the call's facts; keys at " + RECEIPT_KEYS_PATH + ".",
            "properties": {k: {"type": "string"} for k in
                           ("hash", "sig", "kid", "alg", "ts", "account_id", "action", "mode")},
        },
    },
}


def tool_name(slug: str, action: str) -> str:
    return f"{slug}{SEPARATOR}{action}"


def parse_tool_name(name) -> tuple[str, str] | None:
    """``(slug, action)`` of a tool name, or None when it cannot name one."""
    if not isinstance(name, str):
        return None
    slug, sep, action = name.partition(SEPARATOR)
    if not sep or not catalog.SLUG_RE.match(slug) or not catalog.ACTION_RE.match(action):
        return None
    return slug, action


def active_actions(module) -> list:
    return sorted((a for a in module.actions if a.active), key=lambda a: a.name)


def tool_names(module) -> list[str]:
    """The tool names of a catalog ``Module`` (its live actions), sorted."""
    return [tool_name(module.slug, a.name) for a in active_actions(module)]


def price_meta(price_cents: int) -> dict:
    return {"price_cents": price_cents, "currency": "USD",
            "charged": "per call, before forwarding; refunded when the provider fails or times out; "
                       "a provider 4xx answer is charged; svc_test_ keys are never charged"}


def describe(module, action) -> dict:
    """One tool as plain data (the MCP ``Tool`` fields, camelCase as on the wire)."""
    desc = (action.description or "").strip() or f"Action {action.name} of {module.name}."
    mdesc = module.listed_description.strip()
    price = int(action.price_cents)
    return {
        "name": tool_name(module.slug, action.name),
        "title": f"{module.name}: {action.name}",
        "description": f"{desc} ({module.name}{': ' + mdesc if mdesc else ''}) "
                       f"Price: {price} cent(s) per call; the result carries a signed receipt.",
        "inputSchema": INPUT_SCHEMA,
        "outputSchema": OUTPUT_SCHEMA,
        "annotations": {"title": f"{module.name}: {action.name}", "openWorldHint": True},
        "_meta": {
            META_PREFIX + "module": module.slug,
            META_PREFIX + "action": action.name,
            META_PREFIX + "price": price_meta(price),
            META_PREFIX + "receipt": {"alg": "ed25519", "keys": RECEIPT_KEYS_PATH,
                                      "in": "structuredContent.receipt"},
            META_PREFIX + "http": {"method": "POST", "path": f"/v1/module/{module.slug}/call",
                                   "body": {"action": action.name}},
        },
    }


def list_tools(mode: str = "live") -> list[dict]:
    """Every live action of every approved module as a tool, by module slug then action; in
    test mode only the modules with a sandbox (a test key's call of another is refused,
    ``gateway.calls.call``)."""
    return [describe(m, a) for m in catalog.list_modules() if mode != "test" or m.sandbox_url
            for a in active_actions(m)]
