"""The x402 Bazaar discovery extension (``extensions.bazaar``) of what the gateway sells,
built with the ``x402`` package's own helpers (``x402.extensions.bazaar``):

* ``http_body(...)``: a paid JSON ``POST`` resource (a module call, a chat completion):
  ``declare_discovery_extension(body_type="json")`` then the package's resource-server
  enrichment (``bazaar_resource_server_extension.enrich_declaration``) adds the method,
  exactly what the package's HTTP middleware does per route;
* ``mcp_tool(...)``: a paid MCP tool (``declare_mcp_discovery_extension``, transport
  ``streamable-http``);
* ``chat_completion()``: ``POST /v1/chat/completions``'s input/output metadata;
  ``message()``: ``POST /v1/messages``'s (Anthropic's Messages API);
* ``v1_output_schema(ext)``: the same facts in x402 v1's place, a requirement's
  ``outputSchema`` (what ``x402.extensions.bazaar.v1`` reads), for the 402's v1 body.

Each declaration validates with the package's ``validate_discovery_extension`` (its info
against its own schema; tests check every 402 and the discovery list). Plain data; nothing
here reads the database or configuration.
"""
from __future__ import annotations

from types import SimpleNamespace

from x402.extensions.bazaar import (DeclareMcpDiscoveryConfig, OutputConfig, bazaar_resource_server_extension,
                                    declare_discovery_extension, declare_mcp_discovery_extension)

KEY = "bazaar"


def http_body(*, example: dict, input_schema: dict, output_example: dict | None = None,
              output_schema: dict | None = None, method: str = "POST") -> dict:
    """``{"bazaar": …}`` for a JSON-body HTTP resource."""
    ext = declare_discovery_extension(
        input=example, input_schema=input_schema, body_type="json",
        output=OutputConfig(example=output_example, schema=output_schema) if output_example is not None else None)
    enriched = bazaar_resource_server_extension.enrich_declaration(ext[KEY], SimpleNamespace(method=method))
    return {KEY: enriched}


def mcp_tool(*, tool_name: str, input_schema: dict, description: str | None = None,
             example: dict | None = None, output_example: dict | None = None,
             output_schema: dict | None = None) -> dict:
    """``{"bazaar": …}`` for a paid MCP tool (Streamable HTTP)."""
    return declare_mcp_discovery_extension(DeclareMcpDiscoveryConfig(
        tool_name=tool_name, input_schema=input_schema, description=description, transport="streamable-http",
        example=example,
        output=OutputConfig(example=output_example, schema=output_schema) if output_example is not None else None))


def v1_output_schema(ext: dict) -> dict | None:
    """x402 v1's discovery metadata (a requirement's ``outputSchema``: ``{input: {type, method,
    bodyType, bodyFields, discoverable}, output}``) from an HTTP ``{"bazaar": …}``."""
    info = (ext or {}).get(KEY, {}).get("info") or {}
    inp = info.get("input") or {}
    if inp.get("type") != "http":
        return None
    out = {"input": {"type": "http", "method": inp.get("method", "POST"), "discoverable": True,
                     "bodyType": inp.get("bodyType", "json"), "bodyFields": inp.get("body") or {}}}
    if info.get("output"):
        out["output"] = info["output"].get("example")
    return out


CHAT_INPUT_SCHEMA: dict = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "description": "`auto` (the cheapest model that fits) or a model id "
                                                   "of GET /v1/models."},
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role"],
            "properties": {"role": {"type": "string"}, "content": {"type": ["string", "array", "null"]}}}},
        "max_tokens": {"type": "integer", "minimum": 1},
        "stream": {"type": "boolean"},
    },
    "additionalProperties": True,
}

CHAT_OUTPUT_SCHEMA: dict = {
    "type": "object",
    "required": ["id", "object", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"type": "string"}, "model": {"type": "string"},
        "provider": {"type": "string"}, "choices": {"type": "array"},
        "usage": {"type": "object", "description": "OpenAI usage plus cost_micros, cost_usd, savings_pct."},
    },
}


def chat_completion() -> dict:
    """``{"bazaar": …}`` of ``POST /v1/chat/completions`` (OpenAI's request and response)."""
    return http_body(
        example={"model": "auto", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64},
        input_schema=CHAT_INPUT_SCHEMA,
        output_example={"id": "chatcmpl-…", "object": "chat.completion", "model": "…", "provider": "…",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi!"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
                                  "cost_micros": 42, "cost_usd": 0.000042}},
        output_schema=CHAT_OUTPUT_SCHEMA)


MESSAGES_INPUT_SCHEMA: dict = {
    **CHAT_INPUT_SCHEMA, "required": ["model", "max_tokens", "messages"],
    "properties": {**CHAT_INPUT_SCHEMA["properties"],
                   "messages": {"type": "array", "minItems": 1, "items": {
                       "type": "object", "required": ["role", "content"],
                       "properties": {"role": {"enum": ["user", "assistant"]},
                                      "content": {"type": ["string", "array"]}}}},
                   "system": {"type": ["string", "array"]}},
}

MESSAGES_OUTPUT_SCHEMA: dict = {
    "type": "object",
    "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
    "properties": {
        "id": {"type": "string"}, "type": {"type": "string"}, "role": {"type": "string"},
        "model": {"type": "string"}, "content": {"type": "array"}, "stop_reason": {"type": ["string", "null"]},
        "usage": {"type": "object", "description": "Anthropic usage plus cost_micros, cost_usd, savings_pct."},
    },
}


def message() -> dict:
    """``{"bazaar": …}`` of ``POST /v1/messages`` (Anthropic's request and message object)."""
    return http_body(
        example={"model": "auto", "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]},
        input_schema=MESSAGES_INPUT_SCHEMA,
        output_example={"id": "msg_…", "type": "message", "role": "assistant", "model": "…",
                        "content": [{"type": "text", "text": "Hi!"}], "stop_reason": "end_turn",
                        "usage": {"input_tokens": 9, "output_tokens": 3, "cost_micros": 42, "cost_usd": 0.000042}},
        output_schema=MESSAGES_OUTPUT_SCHEMA)
