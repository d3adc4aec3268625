"""Anthropic's Messages API (``POST /v1/messages``) as a translation layer over the chat
completion service: the Messages request becomes the internal OpenAI-shaped body, the
same ``completions.create_completion`` routes, holds, calls with failover and settles it
(``model: auto`` included), and its answer — JSON or the OpenAI event stream — is
translated back into Anthropic's message object or event stream. Cost fields ride in
``usage`` beside Anthropic's token counts (docs/chat.md "Anthropic Messages API")."""
from __future__ import annotations

from typing import Iterator

import orjson

from app.errors import InvalidRequest
from app.services.chat import completions
from app.services.chat.catalog import ModelNotFound, OutputLimitExceeded, TooManyStopSequences
from app.services.chat.completions import ChatResult
from app.services.chat.providers import cache_mark, tool_use_blocks
from app.services.money import holds

# OpenAI finish_reason → Anthropic stop_reason
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "refusal"}
# the gateway's cost fields, copied from the completion's usage into the message's
COST_FIELDS = ("cost_usd", "cost_micros", "savings_pct", "latency_ms", "estimated", "cost", "byok", "byok_fee_pct",
               "provider_cost_micros")


def _text_of(content, where: str) -> str:
    """The text of a string or of an array of text blocks (``system``, a tool result)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or an array of text blocks.", param=where)
    out = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest(f"{where}.{j}: only text blocks are supported here.", param=f"{where}.{j}")
        out.append(block["text"])
    return "\n\n".join(out)


def _result_content(content, where: str):
    """A ``tool_result``'s content: its text (a string or text blocks), or, when it holds
    images or documents, its text, image and document blocks as content parts
    (``providers`` sends them on)."""
    if not (isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in ("image", "document")
                                              for b in content)):
        return _text_of(content, where)
    parts = []
    for j, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "image":
            parts.append(_image_part(block, f"{where}.{j}"))
        elif isinstance(block, dict) and block.get("type") == "document":
            parts.append(_document_part(block, f"{where}.{j}"))
        elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        else:
            raise InvalidRequest(f"{where}.{j}: only text, image and document blocks are supported here.",
                                 param=f"{where}.{j}")
    return parts


def _is_error(block: dict, where: str) -> bool:
    """A ``tool_result``'s ``is_error`` (the tool failed): a boolean, or absent / null."""
    flag = block.get("is_error")
    if flag is not None and not isinstance(flag, bool):
        raise InvalidRequest(f"{where}.is_error: must be a boolean.", param=f"{where}.is_error")
    return flag is True


def _image_part(block: dict, where: str) -> dict:
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64" and source.get("media_type") and source.get("data"):
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif source.get("type") == "url" and source.get("url"):
        url = source["url"]
    else:
        raise InvalidRequest(f"{where}.source: an image needs a base64 (media_type, data) or url source.",
                             param=f"{where}.source")
    return {"type": "image_url", "image_url": {"url": url}}


def _document_part(block: dict, where: str) -> dict:
    """A ``document`` block as an OpenAI content part: a plain-text source is text (its
    ``title`` and ``context`` before it, as the model reads them), a base64 PDF OpenAI's
    ``file`` part (``providers`` gives an Anthropic provider its ``document`` back). Other
    sources (a URL, content blocks, a file id) have no OpenAI form: 400."""
    for key in ("title", "context"):
        if block.get(key) is not None and not isinstance(block[key], str):
            raise InvalidRequest(f"{where}.{key}: must be a string.", param=f"{where}.{key}")
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "text" and source.get("media_type") == "text/plain" and isinstance(source.get("data"), str):
        head = [block[k] for k in ("title", "context") if isinstance(block.get(k), str) and block[k]]
        return {"type": "text", "text": "\n\n".join([*head, source["data"]]), **cache_mark(block)}
    if source.get("type") == "base64" and source.get("media_type") == "application/pdf" and source.get("data"):
        name = block["title"] if isinstance(block.get("title"), str) and block["title"] else "document.pdf"
        return {"type": "file", "file": {"filename": name, "file_data": f"data:application/pdf;base64,{source['data']}"},
                **cache_mark(block)}
    raise InvalidRequest(f"{where}.source: a document needs a text source (media_type text/plain, data) or a "
                         "base64 PDF (media_type application/pdf, data).", param=f"{where}.source")


# earlier turns' reasoning: carried on the internal assistant message for Anthropic providers
THINKING = ("thinking", "redacted_thinking")


def _thinking(block: dict) -> bool:
    """A ``thinking`` block (its text and ``signature``) or a ``redacted_thinking`` one (``data``)."""
    if block.get("type") == "thinking":
        return isinstance(block.get("thinking"), str) and isinstance(block.get("signature"), str)
    return isinstance(block.get("data"), str)


def _message(i: int, msg, out: list[dict]) -> None:
    """Append the OpenAI messages of Anthropic message ``i`` to ``out``."""
    where = f"messages.{i}"
    if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
        raise InvalidRequest(f"{where}.role: must be user or assistant.", param=f"{where}.role")
    role, content = msg["role"], msg.get("content")
    if isinstance(content, str):
        if not content and role == "user":
            raise InvalidRequest(f"{where}.content: must not be empty.", param=f"{where}.content")
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list) or not content:
        raise InvalidRequest(f"{where}.content: must be a string or a non-empty array of content blocks.",
                             param=f"{where}.content")
    parts, calls, results, thinking = [], [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):  # cache_control: carried (providers)
            parts.append({"type": "text", "text": block["text"], **cache_mark(block)})
        elif kind == "image" and role == "user":
            parts.append({**_image_part(block, at), **cache_mark(block)})
        elif kind == "document" and role == "user":
            parts.append(_document_part(block, at))
        elif kind in THINKING and role == "assistant" and _thinking(block):
            thinking.append({k: block[k] for k in ("type", "thinking", "signature", "data") if k in block})
        elif kind == "tool_use" and role == "assistant" and block.get("id") and block.get("name"):
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": orjson.dumps(block.get("input") or {}).decode()}})
        elif kind == "tool_result" and role == "user" and block.get("tool_use_id"):
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _result_content(block.get("content"), f"{at}.content"),
                            **({"is_error": True} if _is_error(block, at) else {}), **cache_mark(block)})
        else:
            raise InvalidRequest(f"{at}: unsupported content block (text; image, document and tool_result in "
                                 "user turns; tool_use, thinking and redacted_thinking in assistant turns).",
                                 param=f"{at}.type")
    out.extend(results)  # tool results answer the previous assistant turn's calls: first
    if role == "assistant":  # empty text and no calls: an empty turn, as for content ""
        text = "".join(p["text"] for p in parts)
        out.append({"role": "assistant", "content": text or (None if calls else ""),
                    **({"tool_calls": calls} if calls else {}), **({"thinking_blocks": thinking} if thinking else {})})
    elif parts:
        out.append({"role": "user", "content": parts})


def _thinking_param(req: dict) -> dict | None:
    """The request's ``thinking`` as the document states it (``enabled`` with an integer
    ``budget_tokens`` of 1,024 to 999,999, or ``disabled``), below ``max_tokens`` as Anthropic
    requires (the budget is part of the output cap); None when absent."""
    thinking = req.get("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        return thinking
    budget = thinking.get("budget_tokens") if kind == "enabled" else None
    if isinstance(budget, float) and budget.is_integer():
        budget = int(budget)
    if not (isinstance(budget, int) and not isinstance(budget, bool) and 1024 <= budget <= 999_999):
        raise InvalidRequest("thinking: must be {type: enabled, budget_tokens: 1024 to 999999} or {type: disabled}.",
                             param="thinking")
    if req.get("max_tokens") is not None and budget >= req["max_tokens"]:
        raise InvalidRequest("`max_tokens` must be greater than `thinking.budget_tokens`.",
                             param="thinking.budget_tokens")
    return {**thinking, "budget_tokens": budget}


def to_openai(req: dict) -> dict:
    """A Messages request (validated by ``MessagesRequestSchema``) → the completion
    service's OpenAI-shaped body."""
    messages: list[dict] = []
    system = _text_of(req.get("system"), "system")
    if system and isinstance(req["system"], list) and any(cache_mark(b) for b in req["system"]):
        # a cache breakpoint in the system prompt: its blocks as they are (providers.to_anthropic)
        messages.append({"role": "system", "content": [{"type": "text", "text": b["text"], **cache_mark(b)}
                                                       for b in req["system"]]})
    elif system:
        messages.append({"role": "system", "content": system})
    for i, msg in enumerate(req["messages"]):
        _message(i, msg, messages)  # each adds at least one message
    mark = cache_mark(req)  # Anthropic's automatic caching: a breakpoint on the last block (providers)
    if mark:
        messages[-1] = {**messages[-1], **mark}
    body: dict = {"model": req["model"], "messages": messages, "max_tokens": req["max_tokens"]}
    for key in ("temperature", "top_p"):
        if req.get(key) is not None:
            body[key] = req[key]
    if req.get("stop_sequences"):
        body["stop"] = list(req["stop_sequences"])
    thinking = _thinking_param(req)
    if thinking:
        body["thinking"] = thinking
    if req.get("stream"):  # the usage in its own last chunk: message_delta (translate_stream)
        body.update(stream=True, stream_options={"include_usage": True})
    tools = req.get("tools")
    for i, t in enumerate(tools or ()):
        if isinstance(t, dict) and t.get("type") not in (None, "custom"):
            raise InvalidRequest(f"tools.{i}.type: {t['type']!r} is one of Anthropic's server or client tools, which "
                                 "the gateway cannot carry to every provider; only custom tools (name, description, "
                                 "input_schema) are supported.", param=f"tools.{i}.type")
    if tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("input_schema") or {"type": "object", "properties": {}}}, **cache_mark(t)}
            for t in tools if isinstance(t, dict)]
        choice = req.get("tool_choice") or {}
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "any":
            body["tool_choice"] = "required"
        elif kind == "none":
            body["tool_choice"] = "none"
        elif kind == "tool" and choice.get("name"):
            body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        if isinstance(choice, dict) and choice.get("disable_parallel_tool_use") is True and kind != "none":
            body["parallel_tool_calls"] = False  # at most one tool call per answer
    user = (req.get("metadata") or {}).get("user_id") if isinstance(req.get("metadata"), dict) else None
    if user:
        body["user"] = str(user)
    return body


def message_id(completion_id: str) -> str:
    """The message id of a completion: ``msg_`` + the completion id's random part (the
    ``X-Chat-Completion-Id`` header, receipts and usage keep ``chatcmpl-…``)."""
    return "msg_" + completion_id.removeprefix("chatcmpl-")


def _input_of(usage: dict) -> dict:
    """The prompt's counts of an OpenAI usage in Anthropic's names: ``input_tokens``
    excludes the cached and cache-written tokens, as Anthropic counts them; the writes by
    cache duration in ``cache_creation`` (5-minute and 1-hour, as Anthropic reports them)."""
    details = usage.get("prompt_tokens_details") or {}
    read, written = int(details.get("cached_tokens") or 0), int(details.get("cache_write_tokens") or 0)
    hour = int(details.get("cache_write_1h_tokens") or 0)
    return {"input_tokens": max(0, int(usage["prompt_tokens"]) - read - written),
            "cache_creation_input_tokens": written, "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": written - hour, "ephemeral_1h_input_tokens": hour}}


def usage_of(usage: dict) -> dict:
    """The completion's usage in Anthropic's names (reasoning tokens, counted in the output,
    as ``output_tokens_details.thinking_tokens``), plus the gateway's cost fields."""
    out = {**_input_of(usage), "output_tokens": int(usage["completion_tokens"])}
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    if reasoning:
        out["output_tokens_details"] = {"thinking_tokens": int(reasoning)}
    out.update((k, usage[k]) for k in COST_FIELDS if k in usage)
    return out


def _content(message: dict) -> list[dict]:
    content = [b for b in message.get("thinking_blocks") or () if isinstance(b, dict)]  # the reasoning first
    if message.get("content"):
        text = message["content"] if isinstance(message["content"], str) else "".join(
            p.get("text", "") for p in message["content"] if isinstance(p, dict))
        content.append({"type": "text", "text": text})
    return content + tool_use_blocks(message.get("tool_calls"))


def _stopped(choice: dict, stops: tuple = ()) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``) of an OpenAI choice: the stop sequence that ended
    it when the provider named it (``choice.stop_reason``, vLLM's name, which
    ``providers`` gives Anthropic's ``stop_sequence``) and it is one of the request's
    ``stops`` (another upstream's ``stop_reason`` may mean something else), else the finish
    reason's."""
    seq = choice.get("stop_reason")
    if choice.get("finish_reason") == "stop" and isinstance(seq, str) and seq in stops:
        return "stop_sequence", seq
    return STOP_REASONS.get(choice.get("finish_reason"), "end_turn"), None


def from_openai(body: dict, stops: tuple = ()) -> dict:
    """A ``chat.completion`` → Anthropic's message object (``stops``: the request's
    ``stop_sequences``)."""
    choice = (body.get("choices") or [{}])[0]
    stop_reason, stop_sequence = _stopped(choice, stops)
    return {"id": message_id(body["id"]), "type": "message", "role": "assistant", "model": body["model"],
            "content": _content(choice.get("message") or {}),
            "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": usage_of(body["usage"]), "provider": body.get("provider")}


def _event(kind: str, data: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def translate_stream(events: Iterator[bytes], completion_id: str, model: str,
                     stops: tuple = (), prompt: dict | None = None) -> Iterator[bytes]:
    """The completion's OpenAI event stream → Anthropic's: ``message_start`` (its usage: the
    prompt's counts as known when the stream opened, ``prompt`` — the provider's, or the
    gateway's estimate when the provider counts only at the end — no output yet), ``ping``,
    per content block ``content_block_start`` / ``content_block_delta`` (``thinking_delta``
    and ``signature_delta`` of an Anthropic provider's thinking, ``text_delta``,
    ``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (stop reason,
    usage with cost) and ``message_stop``; a provider break mid-stream is an ``error``
    event before them, and that ``message_delta`` then names no stop reason (``null``, as
    Anthropic's ``message_start`` does): the answer did not end, it was cut. Closing this generator closes the completion's (the client went
    away: it settles what was generated)."""
    block = None  # (index, kind, tool index) of the open content block
    index = -1
    stop, sequence = "end_turn", None
    try:
        yield _event("message_start", {"message": {
            "id": message_id(completion_id), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**_input_of(prompt or {"prompt_tokens": 0}), "output_tokens": 0}}})
        yield _event("ping", {})
        for raw in events:
            if not raw.startswith(b"data: {"):
                continue  # data: [DONE]
            chunk = orjson.loads(raw[6:])
            if "error" in chunk:
                err = chunk["error"] or {}
                yield _event("error", {"error": {"type": "api_error", "message": err.get("message", ""),
                                                 "code": err.get("code")}})
                stop, sequence = None, None
                continue
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                for tb in delta.get("thinking_blocks") or ():  # Anthropic's reasoning, first in the answer
                    if not isinstance(tb, dict):
                        continue
                    # a thinking block goes on until its signature; a redacted one is whole at its start
                    if tb.get("type") == "redacted_thinking" or block is None or block[1] != "thinking" or block[2]:
                        if block is not None:
                            yield _event("content_block_stop", {"index": block[0]})
                        index += 1
                        start = {"type": "redacted_thinking", "data": tb.get("data", "")} \
                            if tb.get("type") == "redacted_thinking" else {"type": "thinking", "thinking": "", "signature": ""}
                        block = (index, start["type"], False)
                        yield _event("content_block_start", {"index": index, "content_block": start})
                    if tb.get("type") == "thinking" and tb.get("thinking"):
                        yield _event("content_block_delta", {"index": index, "delta": {
                            "type": "thinking_delta", "thinking": tb["thinking"]}})
                    if tb.get("type") == "thinking" and tb.get("signature"):
                        yield _event("content_block_delta", {"index": index, "delta": {
                            "type": "signature_delta", "signature": tb["signature"]}})
                        block = (index, "thinking", True)  # signed: the block is complete
                if delta.get("content"):
                    if block is None or block[1] != "text":
                        if block is not None:
                            yield _event("content_block_stop", {"index": block[0]})
                        index += 1
                        block = (index, "text", None)
                        yield _event("content_block_start", {"index": index,
                                                             "content_block": {"type": "text", "text": ""}})
                    yield _event("content_block_delta", {"index": index, "delta": {
                        "type": "text_delta", "text": delta["content"]}})
                for call in delta.get("tool_calls") or []:
                    fn = call.get("function") or {}
                    if block is None or block[1] != "tool_use" or block[2] != call.get("index"):
                        if block is not None:
                            yield _event("content_block_stop", {"index": block[0]})
                        index += 1
                        block = (index, "tool_use", call.get("index"))
                        yield _event("content_block_start", {"index": index, "content_block": {
                            "type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": {}}})
                    if fn.get("arguments"):
                        yield _event("content_block_delta", {"index": index, "delta": {
                            "type": "input_json_delta", "partial_json": fn["arguments"]}})
                if choice.get("finish_reason"):
                    stop, sequence = _stopped(choice, stops)
            if chunk.get("usage") and not chunk.get("choices"):  # the final usage chunk
                if block is not None:
                    yield _event("content_block_stop", {"index": block[0]})
                    block = None
                yield _event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": sequence},
                                               "usage": usage_of(chunk["usage"])})
                yield _event("message_stop", {})
    finally:
        close = getattr(events, "close", None)
        if close:
            close()


# the fields of a count-tokens request that the prompt is made of (the rest shape the answer)
COUNTED = ("model", "messages", "system", "tools", "tool_choice")


def count_tokens(account_id: str, mode: str, req: dict, controls=None, byok: bool = False) -> dict:
    """``POST /v1/messages/count_tokens`` (a request ``CountTokensRequestSchema`` validated):
    ``{"input_tokens": N}``, the gateway's estimate of the translated prompt, the one a
    ``/v1/messages`` call with it would size its hold with (``completions.prompt_estimate``:
    the same refusals, nothing held, charged or counted in the key's rpm or tpm)."""
    body = to_openai({**{k: req[k] for k in COUNTED if k in req}, "max_tokens": None})
    return {"input_tokens": completions.prompt_estimate(account_id, mode, body, controls=controls, byok=byok)}


def create_message(account_id: str, mode: str, req: dict, key_id: str | None = None,
                   actor: str | None = None, controls=None, byok: bool = False,
                   payment: str | None = None) -> ChatResult:
    """``POST /v1/messages``: translate, run the completion service (``controls``, ``byok``,
    ``payment`` — an x402 payment header paying the hold — as ``create_completion`` takes
    them; a 402's x402 request names ``/v1/messages``), translate back. A ``max_tokens`` above
    the model's maximum is refused in Anthropic's words."""
    try:
        result = completions.create_completion(account_id, mode, to_openai(req), key_id=key_id, actor=actor,
                                               payment=payment, controls=controls, byok=byok,
                                               route=holds.MESSAGES)
    except (OutputLimitExceeded, TooManyStopSequences) as exc:
        raise exc.for_messages() from None
    stops = tuple(req.get("stop_sequences") or ())
    if result.events is None:
        return ChatResult(body=from_openai(result.body, stops), headers=result.headers)
    completion_id, model = result.headers["X-Chat-Completion-Id"], result.headers["X-Chat-Model"]
    return ChatResult(events=lambda: translate_stream(result.events(), completion_id, model, stops, result.prompt),
                      headers=result.headers)


# --- Anthropic's model list (GET /v1/models with `anthropic-version`) -----------------------

EPOCH = "1970-01-01T00:00:00Z"  # release date unknown: the value Anthropic's API documents for it


def anthropic_model(entry: completions.ModelInfo) -> dict:
    """One model in Anthropic's shape (its SDK's ``ModelInfo``): the catalog's window and
    output cap as ``max_input_tokens`` / ``max_tokens``, the id as display name."""
    return {"type": "model", "id": entry.id, "display_name": entry.id, "created_at": EPOCH,
            "max_input_tokens": entry.context_window, "max_tokens": entry.max_output_tokens,
            "lifecycle": "active"}  # listed: callable now


def anthropic_models(entries: list, limit: int = 20, after_id: str | None = None,
                     before_id: str | None = None) -> dict:
    """A page of ``entries`` as Anthropic's list: ``limit`` models after ``after_id`` (or the
    last ``limit`` before ``before_id``), ``has_more``, ``first_id`` and ``last_id``, which
    its SDK pages with. An id that is not listed is 404 ``model_not_found``, as
    ``GET /v1/models/{id}`` answers it (never an empty page mistaken for the end)."""
    ids = [e.id for e in entries]
    for name, cursor in (("after_id", after_id), ("before_id", before_id)):
        if cursor is not None and cursor not in ids:
            raise ModelNotFound(f"{name}: {cursor!r} is not a model of this list.")
    if before_id is not None:
        end = ids.index(before_id)
        start = max(0, end - limit)
        page, more = entries[start:end], start > 0
    else:
        start = ids.index(after_id) + 1 if after_id is not None else 0
        page, more = entries[start:start + limit], start + limit < len(entries)
    return {"data": [anthropic_model(e) for e in page], "has_more": more,
            "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None}
