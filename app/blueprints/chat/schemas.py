"""Schemas of the OpenAI-compatible chat host (SPEC part 2 "Chat completion", endpoint 34)."""
import re

import marshmallow as ma

from app.blueprints.fields import (MAX_JSON_DEPTH, SINGLE_LINE_PATTERN, InputSchema, JsonBoolean, JsonInteger,
                                  JsonNumber, QueryInteger, json_depth)
from app.services.chat.completions import CONTENT_REQUIRED, ROLES


# What ``chat.completions._validate`` accepts in a message and a tool, as JSON Schema for
# the OpenAPI document (exactly: a request valid by it is not refused for its messages or
# tools, and one it refuses is refused; keep in step with _validate).
_TRUTHY = {"not": {"enum": [None, False, 0, "", [], {}]}}
_MESSAGE = {
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": list(ROLES)},
        # anyOf with explicit items (any): openapi-python-client cannot type an array
        # without items inside a union ("Invalid property in union")
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {}}, {"type": "null"}]},
        "tool_calls": {"type": ["array", "null"], "items": {
            "type": "object", "required": ["function"], "properties": {"function": {"type": "object"}}}},
        "is_error": {"type": ["boolean", "null"], "description": (
            "The gateway's, on a `tool` message: true when the tool failed (the Messages API's `tool_result` "
            "`is_error`). Sent to Anthropic providers, never to OpenAI-compatible ones.")},
        "thinking_blocks": {"type": ["array", "null"], "items": {"type": "object"}, "description": (
            "LiteLLM's, on an `assistant` message: the Anthropic `thinking` / `redacted_thinking` blocks of that "
            "turn, sent back to Anthropic providers as they came (first in the turn), never to OpenAI-compatible "
            "ones.")},
    },
    "allOf": [
        {"if": {"required": ["role"], "properties": {"role": {"enum": list(CONTENT_REQUIRED)}}},
         "then": {"required": ["content"], "properties": {"content": {
             "anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1, "items": {}}]}}}},
        {"if": {"required": ["role"], "properties": {"role": {"const": "tool"}}},
         "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": _TRUTHY}}},
    ],
}
_TOOL = {"required": ["function"], "properties": {"function": {
    "type": "object", "required": ["name"], "properties": {"name": _TRUTHY}}}}


class ChatRequestSchema(InputSchema):
    """OpenAI chat-completions request. Fields not listed here (stop, seed, user, …) are
    passed to the upstream unchanged; those listed are checked against OpenAI's own rules
    (an out-of-range ``temperature`` is the caller's 400, not a provider's failure). ``stop``
    routes: more than 4 sequences go only to providers that take them (Anthropic's), else 400
    ``no_matching_model`` with ``param: stop``. Thinking, ``reasoning_effort`` (OpenAI's) or
    ``thinking`` (Anthropic's, as LiteLLM sends it), reaches only models that can think
    (capability ``reasoning``): an OpenAI-compatible provider as ``reasoning_effort``, an Anthropic
    one as ``thinking`` (``low`` 1,024 tokens, ``medium`` 2,048, ``high`` 4,096, below the output
    cap); ``model: auto`` prefers such models; a model that cannot think is asked nothing."""

    class Meta:
        unknown = ma.INCLUDE

    model = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=96), metadata={
        "description": "`auto` (cheapest model that fits the request) or a model id from `GET /v1/models`."})
    messages = ma.fields.List(ma.fields.Dict(metadata=_MESSAGE), required=True,
                              validate=ma.validate.Length(min=1, max=4096),
                              metadata={"description": "OpenAI messages: `role` (system, developer, user, "
                                        "assistant, tool) and `content` (string or content parts); "
                                        "assistant `tool_calls` and tool `tool_call_id` as in OpenAI's API."})
    stream = JsonBoolean(metadata={"description": "Server-sent events in OpenAI's chunk format, "
                                   "ending with `data: [DONE]`; the last chunk before it carries `usage`."})
    max_tokens = JsonInteger(validate=ma.validate.Range(min=1, max=1_000_000), allow_none=True,
                             metadata={"description": "Output cap (above a named model's maximum: 400). "
                                       "Absent: the hold covers `CHAT_DEFAULT_HOLD_OUTPUT_TOKENS` (1024) "
                                       "at the most expensive candidate and the provider is sent what "
                                       "that hold pays for at its prices, at most "
                                       "`CHAT_DEFAULT_MAX_TOKENS` (4096)."})
    max_completion_tokens = JsonInteger(validate=ma.validate.Range(min=1, max=1_000_000), allow_none=True)
    n = JsonInteger(validate=ma.validate.Range(min=1, max=16), allow_none=True,
                    metadata={"description": "Number of choices; the hold covers the output cap for each."})
    tools = ma.fields.List(ma.fields.Dict(metadata=_TOOL), allow_none=True, validate=ma.validate.Length(max=128))
    tool_choice = ma.fields.Raw(allow_none=True)
    response_format = ma.fields.Dict(allow_none=True)
    stream_options = ma.fields.Dict(allow_none=True)
    temperature = JsonNumber(allow_none=True, validate=ma.validate.Range(min=0, max=2),
                             metadata={"description": "Sampling temperature, 0 to 2 (OpenAI's range)."})
    top_p = JsonNumber(allow_none=True, validate=ma.validate.Range(min=0, max=1),
                       metadata={"description": "Nucleus sampling, 0 to 1."})


_MODEL_TEXT = re.compile(SINGLE_LINE_PATTERN)
_INT_MAX = {"max_tokens": 1_000_000, "max_completion_tokens": 1_000_000, "n": 16}
_NUMBER_RANGE = {"temperature": (0, 2), "top_p": (0, 1)}
_OBJECTS = ("response_format", "stream_options")


def plain_chat_request(doc) -> dict | None:
    """``doc`` when ``ChatRequestSchema`` would load it to the same value (a plain, valid
    request: exact JSON types, within every bound of the schema and the input policy), else
    None — then the schema loads it and answers any 400 itself. Keep in step with the
    schema above (tests/api/test_chat_body.py compares the two)."""
    if not isinstance(doc, dict):
        return None
    model, messages = doc.get("model"), doc.get("messages")
    if not (type(model) is str and 1 <= len(model) <= 96 and _MODEL_TEXT.fullmatch(model)):
        return None
    if not (type(messages) is list and 1 <= len(messages) <= 4096 and all(type(m) is dict for m in messages)):
        return None
    if "stream" in doc and type(doc["stream"]) is not bool:
        return None
    for name, top in _INT_MAX.items():
        value = doc.get(name)
        if value is not None and not (type(value) is int and 1 <= value <= top):
            return None
    for name, (low, high) in _NUMBER_RANGE.items():
        value = doc.get(name)
        if value is not None and not (type(value) in (int, float) and low <= value <= high):
            return None
    tools = doc.get("tools")
    if tools is not None and not (type(tools) is list and len(tools) <= 128 and all(type(t) is dict for t in tools)):
        return None
    if any(doc.get(name) is not None and type(doc[name]) is not dict for name in _OBJECTS):
        return None
    return doc if json_depth(doc) <= MAX_JSON_DEPTH else None


class ByokUsageSchema(ma.Schema):
    """The usage fields of a completion served with the caller's own provider key."""

    byok = ma.fields.Boolean(metadata={
        "description": "Present (true) when the caller's own provider key served the completion: `cost_micros` "
                       "is then the platform fee."})
    byok_fee_pct = ma.fields.Float(metadata={"description": "BYOK: the fee's percent of the list cost."})
    provider_cost_micros = ma.fields.Integer(metadata={
        "description": "BYOK: the cost at the model's list price, which the caller's provider bills directly."})


class GatewayUsageSchema(ByokUsageSchema):
    """What the gateway adds to a completion's usage (both APIs): the charge, savings, latency."""

    cost_usd = ma.fields.Float(required=True, metadata={"description": "Exact charge in USD (= cost_micros / 1e6)."})
    cost_micros = ma.fields.Integer(required=True, metadata={"description": "Exact charge in micro-dollars."})
    cost = ma.fields.Float(required=True, metadata={
        "description": "= cost_usd, under the name LiteLLM keeps from a stream's final usage (OpenRouter's)."})
    savings_pct = ma.fields.Float(required=True, metadata={
        "description": "round(max(0, (ref − cost) / ref × 100), 2), ref = the same tokens at the reference "
                       "model's primary list price (auto: CHAT_REFERENCE_MODEL; named model: its primary provider); "
                       "for a BYOK completion cost = the provider's list cost + the fee."})
    latency_ms = ma.fields.Integer(required=True, metadata={"description": "Gateway receipt to last upstream byte."})
    estimated = ma.fields.Boolean(required=True, metadata={
        "description": "True when the upstream reported no usage and the tokens are the gateway's estimate."})


class ChatUsageSchema(GatewayUsageSchema):
    prompt_tokens = ma.fields.Integer(required=True)
    completion_tokens = ma.fields.Integer(required=True)
    total_tokens = ma.fields.Integer(required=True)
    prompt_tokens_details = ma.fields.Dict(metadata={
        "description": "When the provider reported cache use: `cached_tokens` (read from its prompt cache, priced "
                       "at the cache-read price) and `cache_write_tokens`; `cache_write_1h_tokens`, those of them "
                       "written to Anthropic's 1-hour cache (priced at the 1-hour write price), when any."})
    completion_tokens_details = ma.fields.Dict(metadata={
        "description": "When the provider reported reasoning: `reasoning_tokens`, included in "
                       "`completion_tokens` and billed at the output price."})


class ChatChoiceSchema(ma.Schema):
    index = ma.fields.Integer(required=True)
    message = ma.fields.Dict(required=True, metadata={"description": "`role`, `content`, and `tool_calls` when the model calls tools; "
                                                      "from an Anthropic provider that thought, LiteLLM's `reasoning_content` "
                                                      "(the thinking's text) and `thinking_blocks` (to send back next turn)."})
    finish_reason = ma.fields.String(allow_none=True)
    stop_reason = ma.fields.String(metadata={
        "description": "When the provider named it (an Anthropic provider, a vLLM-style server): the stop "
                       "sequence that ended the choice (`finish_reason` is `stop`), as vLLM names it."})


class ChatCompletionSchema(ma.Schema):
    id = ma.fields.String(required=True)
    object = ma.fields.String(required=True, metadata={"description": "`chat.completion`"})
    created = ma.fields.Integer(required=True)
    model = ma.fields.String(required=True, metadata={"description": "The model actually used."})
    provider = ma.fields.String(required=True, metadata={"description": "The provider that served it."})
    choices = ma.fields.List(ma.fields.Nested(ChatChoiceSchema), required=True)
    usage = ma.fields.Nested(ChatUsageSchema, required=True)


class ModelPricingSchema(ma.Schema):
    input_usd_per_mtok = ma.fields.String(required=True)
    output_usd_per_mtok = ma.fields.String(required=True)


class ModelSchema(ma.Schema):
    id = ma.fields.String(required=True)
    object = ma.fields.String(required=True)
    created = ma.fields.Integer(required=True)
    owned_by = ma.fields.String(required=True, metadata={"description": "Providers serving the model."})
    description = ma.fields.String()
    context_window = ma.fields.Integer()
    max_output_tokens = ma.fields.Integer()
    capabilities = ma.fields.List(ma.fields.String())
    pricing = ma.fields.Nested(ModelPricingSchema, metadata={"description": "Cheapest enabled provider's price."})

    @ma.post_dump
    def _omit_catalog_facts_of_auto(self, data, **kwargs):
        """``auto`` is a routing rule, not a model: it has no window, capabilities or prices."""
        for name in ("context_window", "max_output_tokens", "capabilities", "pricing"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class ModelListSchema(ma.Schema):
    object = ma.fields.String(required=True)
    data = ma.fields.List(ma.fields.Nested(ModelSchema), required=True)


class AnthropicHeadersSchema(InputSchema):
    """``anthropic-version``, which Anthropic's clients send on every request: the model
    routes answer in Anthropic's shape when it is present."""

    class Meta:
        unknown = ma.EXCLUDE

    anthropic_version = ma.fields.String(data_key="anthropic-version", validate=ma.validate.Length(max=64), metadata={
        "description": "Sent by Anthropic's clients (e.g. `2023-06-01`): the answer is Anthropic's model object "
                       "(list: `data`, `has_more`, `first_id`, `last_id`, paged by `limit`, `after_id`, "
                       "`before_id`). Without it, OpenAI's."})


class ModelListArgsSchema(InputSchema):
    """Anthropic's paging of the model list (applied with ``anthropic-version`` only)."""

    class Meta:
        unknown = ma.EXCLUDE

    limit = QueryInteger(load_default=20, validate=ma.validate.Range(min=1, max=1000), metadata={
        "description": "With `anthropic-version`: models per page (Anthropic's default 20)."})
    after_id = ma.fields.String(validate=ma.validate.Length(min=1, max=200), metadata={
        "description": "With `anthropic-version`: the page after this model id (`last_id` of the previous one)."})
    before_id = ma.fields.String(validate=ma.validate.Length(min=1, max=200), metadata={
        "description": "With `anthropic-version`: the page before this model id (`first_id` of the next one)."})


class AnthropicModelSchema(ma.Schema):
    type = ma.fields.Constant("model", required=True, metadata={"type": "string", "enum": ["model"]})
    id = ma.fields.String(required=True)
    display_name = ma.fields.String(required=True, metadata={"description": "The model id."})
    created_at = ma.fields.String(required=True, metadata={
        "format": "date-time", "description": "Release date; the epoch when unknown (always, here)."})
    max_input_tokens = ma.fields.Integer(required=True, allow_none=True, metadata={
        "description": "Context window; null for `auto`."})
    max_tokens = ma.fields.Integer(required=True, allow_none=True, metadata={
        "description": "Most output tokens; null for `auto`."})
    lifecycle = ma.fields.Constant("active", required=True, metadata={
        "type": "string", "enum": ["active"], "description": "Always `active`: a listed model can be called now."})


class AnthropicModelListSchema(ma.Schema):
    data = ma.fields.List(ma.fields.Nested(AnthropicModelSchema), required=True)
    has_more = ma.fields.Boolean(required=True)
    first_id = ma.fields.String(required=True, allow_none=True)
    last_id = ma.fields.String(required=True, allow_none=True)


# --- Anthropic Messages API (POST /v1/messages) -------------------------------------------

# What ``chat.messages`` accepts in a message and in ``system``, as JSON Schema (exactly, as
# _MESSAGE for chat completions: a request valid by it is not refused for its messages or
# system prompt; tests/test_openapi_rules.py compares the two). Blocks: text (either turn),
# image (user: a base64 or url source), tool_use (assistant: id and name), tool_result
# (user: tool_use_id; content text, or text and image blocks).
_TEXT_BLOCK = {"type": "object", "required": ["type", "text"],
               "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_TEXT_BLOCKS = {"type": "array", "items": _TEXT_BLOCK}
_IMAGE_BLOCK = {"type": "object", "required": ["type", "source"], "properties": {
    "type": {"const": "image"},
    "source": {"anyOf": [
        {"type": "object", "required": ["type", "media_type", "data"], "properties": {
            "type": {"const": "base64"}, "media_type": _TRUTHY, "data": _TRUTHY}},
        {"type": "object", "required": ["type", "url"], "properties": {"type": {"const": "url"}, "url": _TRUTHY}}]}}}
_TOOL_USE_BLOCK = {"type": "object", "required": ["type", "id", "name"], "properties": {
    "type": {"const": "tool_use"}, "id": _TRUTHY, "name": _TRUTHY}}
# an earlier turn's reasoning, as Anthropic's clients send it back (assistant turns)
_THINKING_BLOCK = {"type": "object", "required": ["type", "thinking", "signature"], "properties": {
    "type": {"const": "thinking"}, "thinking": {"type": "string"}, "signature": {"type": "string"}}}
_REDACTED_THINKING_BLOCK = {"type": "object", "required": ["type", "data"], "properties": {
    "type": {"const": "redacted_thinking"}, "data": {"type": "string"}}}
# a document (user turns): plain text, or a base64 PDF
_DOCUMENT_BLOCK = {"type": "object", "required": ["type", "source"], "properties": {
    "type": {"const": "document"},
    "source": {"anyOf": [
        {"type": "object", "required": ["type", "media_type", "data"], "properties": {
            "type": {"const": "text"}, "media_type": {"const": "text/plain"}, "data": {"type": "string"}}},
        {"type": "object", "required": ["type", "media_type", "data"], "properties": {
            "type": {"const": "base64"}, "media_type": {"const": "application/pdf"}, "data": _TRUTHY}}]},
    "title": {"type": ["string", "null"]}, "context": {"type": ["string", "null"]}}}
_TOOL_RESULT_BLOCK = {"type": "object", "required": ["type", "tool_use_id"], "properties": {
    "type": {"const": "tool_result"}, "tool_use_id": _TRUTHY,
    "content": {"anyOf": [{"type": "string"}, {"type": "null"},
                          {"type": "array", "items": {"anyOf": [_TEXT_BLOCK, _IMAGE_BLOCK, _DOCUMENT_BLOCK]}}]},
    "is_error": {"type": ["boolean", "null"]}}}
_ANTHROPIC_MESSAGE = {
    "required": ["role", "content"],
    "properties": {"role": {"type": "string", "enum": ["user", "assistant"]},
                   "content": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
                       "type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}}]}},
    "allOf": [
        {"if": {"required": ["role"], "properties": {"role": {"const": "user"}}},
         "then": {"properties": {"content": {"anyOf": [
             {"type": "string", "minLength": 1},
             {"type": "array", "items": {"anyOf": [_TEXT_BLOCK, _IMAGE_BLOCK, _DOCUMENT_BLOCK,
                                                   _TOOL_RESULT_BLOCK]}}]}}}},
        {"if": {"required": ["role"], "properties": {"role": {"const": "assistant"}}},
         "then": {"properties": {"content": {"anyOf": [
             {"type": "string"}, {"type": "array", "items": {"anyOf": [
                 _TEXT_BLOCK, _TOOL_USE_BLOCK, _THINKING_BLOCK, _REDACTED_THINKING_BLOCK]}}]}}}},
    ],
}


class MessagesRequestSchema(InputSchema):
    """Anthropic Messages request. ``content`` blocks: text, image, document and tool_result
    (user), tool_use, thinking and redacted_thinking (assistant). Other fields (top_k, …)
    are ignored."""

    class Meta:
        unknown = ma.INCLUDE

    model = ma.fields.String(required=True, validate=ma.validate.Length(min=1, max=96), metadata={
        "description": "`auto` (cheapest model that fits) or a model id from `GET /v1/models`."})
    max_tokens = JsonInteger(required=True, validate=ma.validate.Range(min=1, max=1_000_000))
    messages = ma.fields.List(ma.fields.Dict(metadata=_ANTHROPIC_MESSAGE),
                              required=True, validate=ma.validate.Length(min=1, max=4096))
    system = ma.fields.Raw(allow_none=True, metadata={"anyOf": [{"type": "string"}, _TEXT_BLOCKS, {"type": "null"}],
                                                      "description": "A string or text blocks."})
    thinking = ma.fields.Dict(allow_none=True, metadata={
        "oneOf": [{"type": "object", "required": ["type", "budget_tokens"], "properties": {
                       "type": {"const": "enabled"},
                       "budget_tokens": {"type": "integer", "minimum": 1024, "maximum": 999_999}}},
                  {"type": "object", "required": ["type"], "properties": {"type": {"const": "disabled"}}},
                  {"type": "null"}],
        "description": "Extended thinking, as Anthropic's: `budget_tokens` at least 1,024 and below `max_tokens` "
                       "(which counts the thinking). A model that can think (capability `reasoning`) is asked to: "
                       "an Anthropic provider gets this `thinking`, an OpenAI-compatible one `reasoning_effort` "
                       "(`low` up to 1,024, `medium` up to 2,048, else `high`); `model: auto` prefers such models. A "
                       "model that cannot think answers without (no error). Thinking tokens are output tokens, "
                       "billed at the output price; an Anthropic provider's thinking blocks come first in `content`."})
    stop_sequences = ma.fields.List(ma.fields.String(), allow_none=True, validate=ma.validate.Length(max=16), metadata={
        "description": "Up to 16. An OpenAI-compatible provider takes at most 4 (OpenAI's `stop`): with more, "
                       "the request goes only to Anthropic providers, and is 400 `no_matching_model` before any "
                       "hold when the model (or `auto`) has none."})
    temperature = JsonNumber(allow_none=True, validate=ma.validate.Range(min=0, max=1),
                             metadata={"description": "0 to 1 (Anthropic's range)."})
    top_p = JsonNumber(allow_none=True, validate=ma.validate.Range(min=0, max=1))
    stream = JsonBoolean(metadata={"description": "Anthropic's server-sent events (`message_start` … "
                                   "`message_stop`); `message_start` counts the prompt, the `message_delta` usage is what was "
                                   "billed, with the cost."})
    tools = ma.fields.List(ma.fields.Dict(metadata={"required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1}, "input_schema": {"type": "object"},
        "type": {"type": ["string", "null"], "enum": ["custom", None], "description": (
            "Custom tools only (absent, null or `custom`): Anthropic's server and client tools (`web_search_…`, "
            "`bash_…`, `text_editor_…` …) run on Anthropic's side or need its built-in definitions, which no "
            "translation carries.")}}}),
        allow_none=True, validate=ma.validate.Length(max=128))
    tool_choice = ma.fields.Dict(allow_none=True)
    metadata = ma.fields.Dict(allow_none=True)
    cache_control = ma.fields.Dict(allow_none=True, metadata={
        "description": "Anthropic's automatic caching: a prompt-cache breakpoint (`{type: ephemeral}`, `ttl` `1h` "
                       "kept) on the last block, for Anthropic providers."})


class CountTokensRequestSchema(MessagesRequestSchema):
    """Anthropic's count-tokens request: the Messages request without ``max_tokens`` and
    the fields that shape only the answer (``stream``, ``stop_sequences``, ``temperature``,
    ``top_p``, ``metadata``, ``cache_control``: caching changes no count). Other fields
    (``thinking`` …) are ignored."""

    class Meta:
        unknown = ma.INCLUDE
        exclude = ("max_tokens", "stream", "stop_sequences", "temperature", "top_p", "metadata",
                   "cache_control", "thinking")


class MessageTokensCountSchema(ma.Schema):
    input_tokens = ma.fields.Integer(required=True, metadata={
        "description": "The gateway's estimate of the prompt's input tokens (system, messages, tools), the one "
                       "a `POST /v1/messages` with this prompt sizes its hold with; providers count slightly "
                       "differently (usage reports theirs)."})


class MessageUsageSchema(GatewayUsageSchema):
    input_tokens = ma.fields.Integer(required=True)
    output_tokens = ma.fields.Integer(required=True)
    cache_creation_input_tokens = ma.fields.Integer(required=True)
    cache_read_input_tokens = ma.fields.Integer(required=True)
    cache_creation = ma.fields.Dict(required=True, metadata={
        "description": "The cache writes by cache duration, as Anthropic reports them: `ephemeral_5m_input_tokens` "
                       "and `ephemeral_1h_input_tokens` (priced at 2× input; `cache_control.ttl: \"1h\"`)."})


class MessageSchema(ma.Schema):
    id = ma.fields.String(required=True, metadata={"description": "`msg_` + the completion id's random part."})
    type = ma.fields.String(required=True, metadata={"description": "`message`"})
    role = ma.fields.String(required=True)
    model = ma.fields.String(required=True, metadata={"description": "The model actually used."})
    content = ma.fields.List(ma.fields.Dict(), required=True, metadata={
        "description": "`text` and `tool_use` blocks, after the `thinking` / `redacted_thinking` blocks of an "
                       "Anthropic provider asked to think."})
    stop_reason = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "`end_turn`, `max_tokens`, `tool_use`, `refusal`, or `stop_sequence` when the provider "
                       "named the stop sequence that matched."})
    stop_sequence = ma.fields.String(required=True, allow_none=True, metadata={
        "description": "The matched stop sequence (with `stop_reason: stop_sequence`), else null."})
    usage = ma.fields.Nested(MessageUsageSchema, required=True)
    provider = ma.fields.String(metadata={"description": "The provider that served it."})
