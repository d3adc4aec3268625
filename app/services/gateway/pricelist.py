"""The price list the console's "Models and prices" page shows (issue 40 item 3), read from
the catalogs the gateway routes by: the chat models (prices per million tokens of each
enabled provider, cache prices (the 1-hour cache write's as billed), context window, capabilities, ``auto``-eligible), what
``model: auto`` picks for typical requests (the rule of ``chat.catalog.candidates``: the
cheapest enabled offer of the ``auto``-eligible models that fit the request, ``catalog.fits``:
capabilities, maximum output, context window), and the modules with each action's price and MCP tool name."""
from __future__ import annotations

from app.services.chat import catalog as chat_catalog
from app.services.gateway import catalog, tools

# Typical requests ``auto`` is asked to serve: (what, capabilities needed, prompt tokens,
# completion tokens). The pick is the cheapest at these sizes, as ``candidates`` ranks them.
AUTO_CASES = (
    ("Plain text", frozenset(), 1_000, 500),
    ("Tool calling", frozenset({"tools"}), 1_000, 500),
    ("Images (vision)", frozenset({"vision"}), 1_000, 500),
    ("JSON output", frozenset({"json_mode"}), 1_000, 500),
    ("Streaming", frozenset({"streaming"}), 1_000, 500),
    ("A long prompt", frozenset(), 100_000, 1_000),
)


def chat_models() -> list[dict]:
    """Every available chat model, catalog order: id, description, context window, max
    output, capabilities, auto-eligible, and one row per enabled offer (provider, input,
    output, cache read and cache write prices in dollars per million tokens; the 1-hour
    cache's write price as billing uses it, None where the provider has no such cache)."""
    out = []
    for m in chat_catalog.list_models():
        out.append({"id": m.id, "description": m.description, "context_window": m.context_window,
                    "max_output_tokens": m.max_output_tokens, "capabilities": sorted(m.capabilities),
                    "auto": m.auto,
                    "offers": [{"provider": o.provider.id, "input": o.input_price, "output": o.output_price,
                                "cache_read": o.cache_read_price, "cache_write": o.cache_write_price,
                                "cache_write_1h": o.cache_write_1h_usd}
                               for o in m.enabled_offers()]})
    return out


def auto_picks() -> list[dict]:
    """For each of ``AUTO_CASES``: its sizes, the model ``auto`` picks and its cost in
    micro-dollars at that size (None when no auto-eligible model serves it)."""
    models = [m for m in chat_catalog.catalog().auto_models if m.enabled_offers()]
    picks = []
    for what, needs, prompt, completion in AUTO_CASES:
        best = None
        for i, m in enumerate(models):
            if not chat_catalog.fits(m, chat_catalog.Needs(prompt_tokens=prompt, max_tokens=completion,
                                                           capabilities=needs)):
                continue
            for o in m.enabled_offers():
                cost = o.cost_micros(prompt, completion)
                if best is None or (cost, i) < best[:2]:
                    best = (cost, i, m.id)
        picks.append({"what": what, "prompt_tokens": prompt, "completion_tokens": completion,
                      "model": best and best[2], "cost_micros": best and best[0]})
    return picks


def modules() -> list[dict]:
    """The approved modules, by slug: each live action with its price and MCP tool name."""
    return [{"slug": m.slug, "name": m.name, "description": m.listed_description,
             "actions": [{"name": a.name, "price_cents": int(a.price_cents),
                          "tool": tools.tool_name(m.slug, a.name)} for a in tools.active_actions(m)]}
            for m in catalog.list_modules()]
