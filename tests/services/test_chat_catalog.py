"""Chat catalog loading, pricing, savings, cool-down and the Anthropic translation."""
from __future__ import annotations

from decimal import Decimal

import pytest

from app.services.chat import catalog as chat_catalog
from app.services.chat import cooldown as chat_cooldown
from app.services.chat import providers as llm_providers
from app.services.chat.catalog import CatalogError, load_catalog, price_micros, savings_pct


def test_shipped_catalog_loads_and_only_keyed_providers_are_enabled():
    cat = load_catalog("catalog/models*.yaml", {"openai": {"base_url": None, "api_key": None}})
    assert {"demo-mini", "gpt-4o", "claude-sonnet-4"} <= set(cat.models)
    assert cat.providers["demo_llm"].enabled and not cat.providers["openai"].enabled
    keyed = load_catalog("catalog/models*.yaml", {"anthropic": {"base_url": None, "api_key": "k"}})
    assert keyed.providers["anthropic"].enabled
    assert keyed.models["gpt-4o"].primary.input_price == Decimal("2.50")


@pytest.mark.parametrize("doc, message", [
    ("models: [{id: a, context_window: 10, providers: [{provider: nope}]}]", "unknown provider"),
    ("providers: {p: {type: grpc}}", "type must be"),
    ("providers: {p: {type: openai}}\nmodels: [{id: auto, context_window: 1, providers: []}]", "other than 'auto'"),
    ("providers: {p: {type: openai}}\nmodels: [{id: a, context_window: 1, providers: "
     "[{provider: p, input_usd_per_mtok: '-1', output_usd_per_mtok: 1}]}]", "non-negative"),
    ("providers: {p: {type: openai}}\nmodels: [{id: a, context_window: 1, capabilities: [telepathy], "
     "providers: [{provider: p, input_usd_per_mtok: 1, output_usd_per_mtok: 1}]}]", "unknown capabilities"),
])
def test_malformed_catalogs_are_refused(tmp_path, doc, message):
    (tmp_path / "models.yaml").write_text(doc)
    with pytest.raises(CatalogError, match=message):
        load_catalog(str(tmp_path / "models*.yaml"), {})


def test_prices_are_exact_micros_and_savings_never_negative():
    assert price_micros(Decimal("0.15"), Decimal("0.60"), 1_000, 500) == 450
    assert price_micros(Decimal("0.10"), Decimal("0.40"), 5, 3) == 2  # 1.7 → 2 (half up)
    assert price_micros(Decimal("0.10"), Decimal("0.40"), 1, 1) == 1  # 0.5 → 1
    assert savings_pct(200, 600) == 66.67 and savings_pct(700, 600) == 0.0 and savings_pct(5, 0) == 0.0


def test_prompt_estimate_and_needs():
    needs = chat_catalog.analyse({"model": "auto", "stream": True, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "abcd" * 10},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
        "response_format": {"type": "json_object"}})
    assert needs.capabilities == {"vision", "json_mode", "streaming"}
    assert needs.prompt_tokens == 3 + 4 + 85 + 10


@pytest.mark.parametrize("redis", [False, True])
def test_cooldown_after_repeated_failures_and_retry_after(app, monkeypatch, redis):
    import os

    if redis and not os.environ.get("REDIS_URL"):
        pytest.skip("needs Redis")
    if not redis:
        monkeypatch.setitem(app.config, "REDIS_URL", None)
    monkeypatch.setitem(app.config, "CHAT_COOLDOWN_FAILURES", 2)
    chat_cooldown.reset()
    with app.app_context():
        chat_cooldown.record_failure("p1")
        assert chat_cooldown.cooling(["p1", "p2"]) == set()
        chat_cooldown.record_failure("p1")
        assert chat_cooldown.cooling(["p1", "p2"]) == {"p1"}
        chat_cooldown.record_failure("p2", retry_after=5)
        assert chat_cooldown.cooling(["p1", "p2"]) == {"p1", "p2"}
    chat_cooldown.reset()


def test_cooldown_view_is_read_from_redis_at_most_every_refresh(app, monkeypatch):
    """Another worker's cool-down (a key in Redis) is seen once this worker's view is
    older than CHAT_COOLDOWN_REFRESH; in between, no Redis round trip is made."""
    import os

    if not os.environ.get("REDIS_URL"):
        pytest.skip("needs Redis")
    from app.extensions import get_redis

    chat_cooldown.reset()
    monkeypatch.setitem(app.config, "CHAT_COOLDOWN_REFRESH", 3600)
    with app.app_context():
        r = get_redis()
        assert chat_cooldown.cooling(["p1"]) == set()
        r.set(chat_cooldown._key("cool", "p1"), "1", px=60_000)  # another worker cools p1 down
        reads = []
        monkeypatch.setattr(type(r), "mget", lambda self, *a, **k: reads.append(a) or [None])
        assert chat_cooldown.cooling(["p1"]) == set() and reads == []  # the view is fresh
        monkeypatch.undo()
        monkeypatch.setitem(app.config, "CHAT_COOLDOWN_REFRESH", 0)
        assert chat_cooldown.cooling(["p1"]) == {"p1"}  # refreshed: seen
    chat_cooldown.reset()


def test_anthropic_translation_of_a_tool_conversation():
    body = {"model": "x", "max_tokens": 50, "stop": "END", "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "w", "arguments": '{"c": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "user", "content": [{"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}]}]}
    # the cap the hold was sized for (catalog.output_cap: the request's 50, at most the
    # model's) goes upstream, never the raw request's value
    out = llm_providers.to_anthropic(body, "claude-x", 40)
    assert out["system"] == "sys" and out["max_tokens"] == 40 and out["stop_sequences"] == ["END"]
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {"c": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
            {"type": "text", "text": "and"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}]}]
    back = llm_providers.from_anthropic({"content": [{"type": "text", "text": "ok"}], "stop_reason": "max_tokens",
                                         "usage": {"input_tokens": 7, "output_tokens": 3}})
    assert back == {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                 "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


def test_an_image_url_that_is_not_a_string_is_left_to_the_anthropic_provider():
    """Schema-valid (a content part's values are open): the translation must not fail with
    500 (``5.startswith``); the provider refuses the empty URL itself."""
    out = llm_providers.to_anthropic({"model": "x", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]}, "claude-x", 10)
    assert out["messages"] == [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": ""}}]}]


def test_a_tool_without_type_is_a_function_tool_for_an_anthropic_provider_too():
    """The request document takes a tool without ``type`` (``function`` is the only kind) and
    OpenAI-shaped providers get it as it is: the Anthropic translation dropped it (and sent
    ``tool_choice: any`` with no tools)."""
    out = llm_providers.to_anthropic({"model": "x", "messages": [{"role": "user", "content": "hi"}],
                                      "tools": [{"function": {"name": "f", "parameters": {"type": "object"}}}],
                                      "tool_choice": "required"}, "claude-x", 10)
    assert out["tools"] == [{"name": "f", "description": "", "input_schema": {"type": "object"}}]
    assert out["tool_choice"] == {"type": "any"}


def test_tool_calls_become_tool_use_blocks_alike_upstream_and_on_v1_messages():
    """One translation of OpenAI ``tool_calls`` into Anthropic ``tool_use`` blocks serves the
    request sent upstream (``to_anthropic``) and the ``/v1/messages`` answer (``_content``)."""
    from app.services.chat import messages

    calls = [{"id": "t1", "function": {"name": "w", "arguments": '{"c": 1}'}},
             {"id": "t2", "function": {"name": "x", "arguments": "not json"}},
             {"id": "t3", "function": {"name": "y", "arguments": "[1, 2]"}},
             {"id": "t4", "function": {"name": "z"}}]
    blocks = [{"type": "tool_use", "id": "t1", "name": "w", "input": {"c": 1}},
              {"type": "tool_use", "id": "t2", "name": "x", "input": {"arguments": "not json"}},
              {"type": "tool_use", "id": "t3", "name": "y", "input": {"value": [1, 2]}},
              {"type": "tool_use", "id": "t4", "name": "z", "input": {}}]
    assert llm_providers.tool_use_blocks(calls) == blocks and llm_providers.tool_use_blocks(None) == []
    up = llm_providers.to_anthropic({"model": "x", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "let me see", "tool_calls": calls}]},
        "claude-x", 40)
    assert up["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "let me see"}, *blocks]}
    assert messages._content({"content": "let me see", "tool_calls": calls}) == \
        [{"type": "text", "text": "let me see"}, *blocks]


_SNAPSHOT_YAML = """providers:
  p: {type: openai, base_url: "http://127.0.0.1:9"}
models:
  - id: %s
    context_window: 100
    providers: [{provider: p, input_usd_per_mtok: "1", output_usd_per_mtok: "2"}]
"""


def test_catalog_snapshot_is_re_read_when_its_files_change(app, monkeypatch, tmp_path):
    import os

    path = tmp_path / "models-x.yaml"
    path.write_text(_SNAPSHOT_YAML % "m-a")
    monkeypatch.setitem(app.config, "CHAT_CATALOG", str(tmp_path / "models*.yaml"))
    monkeypatch.setitem(app.config, "CHAT_PROVIDERS", {})
    monkeypatch.setitem(app.config, "CHAT_CATALOG_CHECK_SECONDS", 3600)

    def edit(text: str, step: int) -> None:
        path.write_text(text)
        mtime = os.stat(path).st_mtime_ns + step * 10**9  # a later modification time, surely
        os.utime(path, ns=(mtime, mtime))

    with app.app_context():
        app.extensions.pop("chat_catalog", None)
        first = chat_catalog.catalog()
        assert list(first.models) == ["m-a"] and [m.id for m in first.auto_models] == ["m-a"]
        assert [o.provider.id for o in first.models["m-a"].enabled_offers()] == ["p"]
        edit(_SNAPSHOT_YAML % "m-b", 1)
        assert chat_catalog.catalog() is first  # not checked again yet: no file system work
        monkeypatch.setitem(app.config, "CHAT_CATALOG_CHECK_SECONDS", 0)
        second = chat_catalog.catalog()
        assert list(second.models) == ["m-b"]
        assert chat_catalog.catalog() is second  # unchanged files: the same snapshot
        edit("models: [{id: broken}]", 2)
        assert chat_catalog.catalog() is second  # an edit that does not load keeps the last good one
        app.extensions.pop("chat_catalog", None)


def test_a_stream_cut_by_an_error_names_no_stop_reason_on_v1_messages():
    """After the error event the closing message_delta (which carries the charge) said
    stop_reason "end_turn", passing the cut answer off as complete to a raw SSE reader."""
    import orjson

    from app.services.chat import messages

    upstream = [b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}',
                b'data: {"error":{"message":"provider stream interrupted","code":"provider_error"}}',
                b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}',
                b"data: [DONE]"]
    out = list(messages.translate_stream(iter(upstream), "chatcmpl_x", "m"))
    kinds = [e.split(b"\n", 1)[0] for e in out]
    assert b"event: error" in kinds
    delta = next(e for e in out if e.startswith(b"event: message_delta"))
    data = orjson.loads(delta.split(b"data: ", 1)[1])
    assert data["delta"]["stop_reason"] is None


def test_shipped_anthropic_offers_price_the_prompt_cache_as_anthropic_bills_it():
    """cache_control reaches Anthropic providers since 2026-11-29, so Claude answers with
    cache writes (billed 1.25 × input for the 5-minute cache) and reads (0.1 × input). The
    hosted catalog named no cache prices, so both were charged at the input price: every
    cache write cost the platform a quarter more than it charged, every cached read cost the
    customer ten times what Anthropic bills."""
    cat = load_catalog("catalog/models*.yaml", {"anthropic": {"base_url": None, "api_key": "k"}})
    offers = [o for m in cat.models.values() for o in m.offers if o.provider.type == "anthropic"]
    assert offers
    for o in offers:
        assert o.cache_write_price == o.input_price * Decimal("1.25"), o.upstream_model
        assert o.cache_read_price == o.input_price / 10, o.upstream_model


def test_shipped_openai_offers_price_cached_reads_as_openai_bills_them():
    """OpenAI caches long prompts by itself and bills the cached part at half the input
    price (``prompt_tokens_details.cached_tokens``); the hosted catalog named no cache-read
    price, so those tokens were charged at the full input price (review of 2026-11-29)."""
    cat = load_catalog("catalog/models*.yaml", {"openai": {"base_url": None, "api_key": "k"}})
    offers = [o for m in cat.models.values() for o in m.offers if o.provider.type == "openai"
              and o.provider.id == "openai"]
    assert offers
    for o in offers:
        assert o.cache_read_price == o.input_price / 2, o.upstream_model
