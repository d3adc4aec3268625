"""Machine-readable discovery of what the gateway sells, for agents and indexers:

* ``x402_resources()``: every paid module action as an x402 resource, in the shape of the
  Bazaar discovery API's list (``{x402Version, items, pagination}``, an item as
  ``x402.extensions.bazaar.DiscoveryResource.to_dict()`` writes it) with the Bazaar
  extension's metadata (``module_call_extension``, built with ``billing.bazaar``: a JSON
  ``POST`` body ``{"action": …}``, its input schema, the call response's schema — the same
  metadata every module call's 402 carries) and the ``exact``
  payment requirements of its price (``billing.x402.requirements``, as the 402 offers
  them; empty when x402 is not offered). Served at ``GET /.well-known/x402``.
* ``mcp_tool_extension()``: the Bazaar metadata of a paid MCP tool (``type: mcp``), which
  the MCP door's payment request carries.
* ``server_card()``: the MCP server card (SEP-2127's ``server-card.json``) naming the
  ``/mcp`` endpoint, its transport and its bearer header. Served at
  ``GET /.well-known/mcp/server-card.json``.

Plain data from the public catalog; nothing here is secret or charged.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from flask import current_app
from x402.extensions.bazaar.facilitator_client import DiscoveryResource

from app.jsonutil import isoformat
from app.services.billing import bazaar, paywall
from app.services.billing.x402 import requirements
from app.services.gateway import catalog, tools

SERVER_CARD_SCHEMA = "https://static.modelcontextprotocol.io/schemas/v1/server-card.schema.json"
SERVICE_NAME = "Metered API Gateway"


def _body_schema(action: str) -> dict:
    return {"type": "object", "properties": {"action": {"type": "string", "const": action}},
            "required": ["action"], "additionalProperties": True}


def _example(slug: str, price_cents: int) -> dict:
    return {"ok": True, "module": slug, "call_id": "call_…", "cost_cents": int(price_cents), "result": {},
            "receipt": {"hash": "…", "sig": "…", "kid": "k_…", "alg": "ed25519"}}


def module_call_extension(slug: str, action: str, price_cents: int) -> dict:
    """The Bazaar extension (``{"bazaar": …}``) of ``POST /v1/module/{slug}/call`` for one
    action: a JSON body ``{"action": …}`` and the call response (the 402 and ``/.well-known/x402``)."""
    return bazaar.http_body(example={"action": action}, input_schema=_body_schema(action),
                            output_example=_example(slug, price_cents), output_schema=tools.OUTPUT_SCHEMA)


def mcp_tool_extension(slug: str, action: str, price_cents: int, description: str | None = None) -> dict:
    """The Bazaar extension of the MCP tool ``<slug>__<action>`` (the MCP payment request)."""
    return bazaar.mcp_tool(tool_name=tools.tool_name(slug, action), input_schema=tools.INPUT_SCHEMA,
                           description=description, output_example=_example(slug, price_cents),
                           output_schema=tools.OUTPUT_SCHEMA)


def _resource(module, action, offered: bool) -> dict:
    price = int(action.price_cents)
    atomic = price * requirements.ATOMIC_PER_CENT
    accepts = [requirements.wire(requirements.v2_requirement(c, atomic)) for c in requirements.networks()] \
        if offered else []
    ext = module_call_extension(module.slug, action.name, price)
    item = DiscoveryResource(
        resource=paywall.resource_url(f"/v1/module/{module.slug}/call"), type="http", x402_version=2,
        accepts=accepts, last_updated=isoformat(module.updated_at) if module.updated_at else "",
        description=tools.describe(module, action)["description"], mime_type="application/json",
        service_name=SERVICE_NAME, tags=[module.slug], extensions=ext).to_dict()
    item.update({"action": action.name, "priceCents": price, "mcpTool": tools.tool_name(module.slug, action.name)})
    return item


def x402_resources() -> dict:
    """Every paid (price > 0) live action of every approved module, by slug then action."""
    offered = requirements.offered()
    items = [_resource(m, a, offered) for m in catalog.list_modules()
             for a in tools.active_actions(m) if int(a.price_cents) > 0]
    return {"x402Version": 2, "items": items,
            "pagination": {"limit": len(items), "offset": 0, "total": len(items)},
            "mcp": {"url": mcp_url(), "serverCard": paywall.resource_url("/.well-known/mcp/server-card.json")}}


def mcp_url() -> str:
    return paywall.resource_url("/mcp")


def _reverse_dns(base_url: str) -> str:
    host = (urlsplit(base_url).hostname or "localhost").strip(".")
    labels = [p for p in host.split(".") if p]
    return ".".join(reversed(labels)) if not host.replace(".", "").isdigit() else host


def server_card() -> dict:
    """The MCP server card of this gateway's ``/mcp`` endpoint."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

    base = current_app.config["BASE_URL"]
    return {
        "$schema": SERVER_CARD_SCHEMA,
        "name": f"{_reverse_dns(base)}/{tools.SERVER_NAME}",
        "title": SERVICE_NAME,
        "description": "The module catalog as MCP tools, charged per call from a prepaid balance "
                       "or paid per call by x402 (x402.mcp's _meta x402/payment), each result with a "
                       "signed receipt.",
        "version": "1.0.0",
        "websiteUrl": base,
        "remotes": [{
            "type": "streamable-http", "url": mcp_url(),
            "supportedProtocolVersions": [*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS],
            "headers": [{"name": "Authorization", "isRequired": True, "isSecret": True,
                         "description": "Bearer svc_live_… / svc_test_… API key or svc_sess_… agent session "
                                        "(scope call:write to call tools)."}],
        }],
        "_meta": {"gateway/instructions": tools.INSTRUCTIONS,
                  "gateway/x402-discovery": paywall.resource_url("/.well-known/x402"),
                  "gateway/modules": paywall.resource_url("/api/modules"),
                  "gateway/receipt-keys": paywall.resource_url(tools.RECEIPT_KEYS_PATH),
                  "gateway/docs": paywall.resource_url("/docs")},
    }
