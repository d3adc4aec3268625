"""LLM provider adapters: OpenAI-compatible upstreams and Anthropic's Messages API
(translated both ways), over the outbound layer's hot path
(``app.services.platform.http.upstream("chat")``: urllib3's pool directly, keep-alive
connections shared by every thread of the process, timeouts, no redirects, bodies capped
at ``CHAT_MAX_RESPONSE_BYTES``; provider URLs are operator configuration, so private
hosts are allowed, metadata addresses never).
Everything returned is OpenAI-shaped.

Failure classification (used by failover in ``app.services.chat.completions``):

* ``ProviderFailure`` — connection error, timeout, 429, 5xx, or a provider-side 4xx
  (401/403/404/408/409: bad key, unknown upstream model …): try the next candidate.
* ``UpstreamRejected`` — 400/413/422: the request itself is at fault; returned to the
  client, not failed over.
"""
from __future__ import annotations

import time
from dataclasses import replace
from decimal import Decimal
from typing import Iterator

import orjson
import requests
import urllib3
from flask import current_app

from app.services.chat.catalog import Offer, Provider, thinking_asked
from app.services.platform import http

_REJECT_STATUSES = (400, 413, 422)
ANTHROPIC_VERSION = "2023-06-01"


class ProviderFailure(Exception):
    def __init__(self, message: str, *, timeout: bool = False, status: int | None = None,
                 retry_after: float | None = None):
        super().__init__(message)
        self.timeout = timeout
        self.status = status
        self.retry_after = retry_after


class UpstreamRejected(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _timeouts(offer: Offer) -> tuple[float, float]:
    cfg = current_app.config
    return (float(cfg["CHAT_CONNECT_TIMEOUT"]), float(offer.provider.timeout or cfg["CHAT_READ_TIMEOUT"]))


def _retry_after(resp: urllib3.BaseHTTPResponse) -> float | None:
    value = resp.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except Exception:  # noqa: BLE001
            return None


def _max_bytes() -> int:
    return int(current_app.config["CHAT_MAX_RESPONSE_BYTES"])


def _error_text(resp: urllib3.BaseHTTPResponse) -> str:
    """The provider's error message (its JSON ``error``), else the start of its body, else
    the reason phrase."""
    try:
        body = http.read_capped(resp, 65536)
    except Exception:  # noqa: BLE001
        return resp.reason or ""
    try:
        data = orjson.loads(body)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            return str(err.get("message") or err.get("type") or err)[:500]
        if err:
            return str(data.get("message") or err)[:500]
    except Exception:  # noqa: BLE001
        pass
    return body.decode("utf-8", "replace")[:200] if body else resp.reason or ""


def check_key(provider: Provider, api_key: str) -> None:
    """One cheap authenticated call to ``provider`` with ``api_key`` (its model list:
    ``GET {base_url}/models`` for OpenAI-compatible APIs, ``GET {base_url}/v1/models`` for
    Anthropic's), on the chat pool: returns when the provider accepts the key; raises
    ``UpstreamRejected`` when it refuses it (401/403), ``ProviderFailure`` when it could not
    tell (unreachable, timeout, 5xx, 429 …)."""
    keyed = replace(provider, api_key=api_key)
    offer = Offer(model_id="", provider=keyed, upstream_model="", input_price=Decimal(0), output_price=Decimal(0))
    if provider.type == "anthropic":
        url, headers = provider.base_url + "/v1/models", _anthropic_headers(offer)
    else:
        url, headers = provider.base_url + "/models", _openai_headers(offer)
    try:
        resp = http.upstream("chat", allow_private_hosts=True).request(
            "GET", url, headers=headers, timeout=_timeouts(offer))
    except http.AddressRefused as exc:
        raise ProviderFailure(f"{provider.id}: address not allowed ({exc})") from None
    except requests.RequestException as exc:
        raise ProviderFailure(f"{provider.id}: unreachable ({type(exc).__name__})",
                              timeout=isinstance(exc, requests.Timeout)) from exc
    status = resp.status
    text = _error_text(resp) if status >= 300 else ""
    http.release(resp)
    if status in (401, 403):
        raise UpstreamRejected(status, text)
    if status >= 300:
        raise ProviderFailure(f"{provider.id}: HTTP {status} {text}".strip(), status=status)


def _post(offer: Offer, url: str, headers: dict, payload: dict) -> urllib3.BaseHTTPResponse:
    """The provider's open (unread) response to a POST; bodies are read capped."""
    try:
        resp = http.upstream("chat", allow_private_hosts=True).request(
            "POST", url, body=orjson.dumps(payload), headers=headers, timeout=_timeouts(offer))
    except http.AddressRefused as exc:
        raise ProviderFailure(f"{offer.provider.id}: address not allowed ({exc})") from None
    except requests.Timeout as exc:
        raise ProviderFailure(f"{offer.provider.id}: timed out", timeout=True) from exc
    except requests.RequestException as exc:
        raise ProviderFailure(f"{offer.provider.id}: connection failed ({type(exc).__name__})") from exc
    status = resp.status
    if status >= 300:
        text = _error_text(resp)
        http.release(resp)
        if status in _REJECT_STATUSES:
            raise UpstreamRejected(status, text)
        raise ProviderFailure(f"{offer.provider.id}: HTTP {status} {text}".strip(),
                              status=status, retry_after=_retry_after(resp),
                              timeout=status in (408, 504))
    return resp


def _read_json(offer: Offer, resp: urllib3.BaseHTTPResponse) -> dict:
    try:
        data = orjson.loads(http.read_capped(resp, _max_bytes()))
    except requests.Timeout as exc:
        raise ProviderFailure(f"{offer.provider.id}: timed out", timeout=True) from exc
    except http.ResponseTooLarge as exc:
        raise ProviderFailure(f"{offer.provider.id}: {exc}") from None
    except (requests.RequestException, orjson.JSONDecodeError) as exc:
        raise ProviderFailure(f"{offer.provider.id}: unreadable response") from exc
    finally:
        http.release(resp)
    if not isinstance(data, dict):
        raise ProviderFailure(f"{offer.provider.id}: unexpected response")
    return data


def sse_events(resp: urllib3.BaseHTTPResponse, offer: Offer) -> Iterator[bytes]:
    """The ``data:`` payloads of a server-sent-event stream (``[DONE]`` included), yielded
    as soon as each line arrives (``read1``: chunked or not, nothing waits for the end).
    A stream longer than ``CHAT_MAX_RESPONSE_BYTES`` fails the provider."""
    buf = b""
    left = _max_bytes()
    try:
        while True:
            data = resp.read1(65536)
            if not data:
                break
            left -= len(data)
            if left < 0:
                raise ProviderFailure(f"{offer.provider.id}: {http.ResponseTooLarge(_max_bytes())}")
            lines = (buf + data).split(b"\n")
            buf = lines.pop()
            for line in lines:
                if line.startswith(b"data:"):
                    yield line[5:].strip()
        if buf.startswith(b"data:"):
            yield buf[5:].strip()
    except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
        raise ProviderFailure(f"{offer.provider.id}: stream timed out", timeout=True) from exc
    except (urllib3.exceptions.HTTPError, OSError, requests.RequestException) as exc:
        raise ProviderFailure(f"{offer.provider.id}: stream broken ({type(exc).__name__})") from exc
    finally:
        http.release(resp)


# --- OpenAI-compatible --------------------------------------------------------------------

def _openai_headers(offer: Offer) -> dict:
    h = {"Content-Type": "application/json", "Accept": "application/json"}
    if offer.provider.api_key:
        h["Authorization"] = f"Bearer {offer.provider.api_key}"
    return h


# What the gateway carries for Anthropic providers only (``to_anthropic``): a tool result's
# ``is_error``, prompt-cache breakpoints (``cache_control``, on a message, a content part or
# a tool), an assistant turn's earlier ``thinking_blocks`` (LiteLLM's name: Anthropic's
# ``thinking`` / ``redacted_thinking`` blocks, signed by Anthropic, meaningless elsewhere).
# Never sent to an OpenAI-compatible provider: strict ones refuse unknown fields. Nor is
# ``reasoning_content``, the thinking's text the gateway answers beside ``thinking_blocks``
# (LiteLLM's name), which a client may send back: the blocks carry it to Anthropic, and
# OpenAI-compatible servers that produce it (DeepSeek) refuse it in a request.
_ANTHROPIC_ONLY = ("is_error", "cache_control", "thinking_blocks", "reasoning_content")


def cache_mark(obj: dict) -> dict:
    """``obj``'s prompt-cache breakpoint to carry along: ``{"cache_control": {"type": …}}``,
    or ``{}``; with ``"ttl": "1h"`` when it asks for Anthropic's 1-hour cache, whose writes
    are priced apart (``Offer.cache_write_1h_price``, 2× input) and sized into the hold
    (``Needs.cache_1h``). Any other ``ttl`` is dropped: the 5-minute cache, Anthropic's default."""
    mark = obj.get("cache_control")
    if not isinstance(mark, dict):
        return {}
    return {"cache_control": {"type": mark.get("type", "ephemeral"), **({"ttl": "1h"} if mark.get("ttl") == "1h" else {})}}


def _anthropic_only(message: dict) -> bool:
    content = message.get("content")
    return any(k in message for k in _ANTHROPIC_ONLY) or (isinstance(content, list) and any(
        isinstance(p, dict) and "cache_control" in p for p in content))


def _for_openai(message: dict) -> dict:
    """``message`` without the fields only an Anthropic provider is sent."""
    out = {k: v for k, v in message.items() if k not in _ANTHROPIC_ONLY}
    if isinstance(out.get("content"), list):
        out["content"] = [{k: v for k, v in p.items() if k != "cache_control"} if isinstance(p, dict) else p
                          for p in out["content"]]
    return out


def _tool_images(message: dict) -> list:
    """The image and file (PDF) parts of a tool message (a Messages API ``tool_result``
    holding images or documents)."""
    content = message.get("content")
    if message.get("role") != "tool" or not isinstance(content, list):
        return []
    return [p for p in content if isinstance(p, dict) and p.get("type") in ("image_url", "file")]


def _openai_messages(messages: list) -> list:
    """``messages`` as an OpenAI-compatible provider takes them: without the Anthropic-only
    fields, and a tool message's images and files (OpenAI's tool messages take text only)
    moved to a user message after that run of tool results, as OpenRouter does (without
    their cache breakpoints, as every part an OpenAI-compatible provider gets)."""
    out, images = [], []
    for m in messages:
        if images and m.get("role") != "tool":
            out.append(_for_openai({"role": "user", "content": images}))
            images = []
        moved = _tool_images(m)
        if moved:
            images += moved
            m = {**m, "content": _joined_text(m["content"])}
        out.append(_for_openai(m) if _anthropic_only(m) else m)
    if images:
        out.append(_for_openai({"role": "user", "content": images}))
    return out


ANTHROPIC_MIN_THINKING = 1024  # Anthropic's least ``thinking.budget_tokens``


def _openai_payload(offer: Offer, body: dict, max_tokens: int, stream: bool) -> dict:
    payload = dict(body)
    payload["model"] = offer.upstream_model
    # thinking: OpenAI's ``reasoning_effort`` (from an Anthropic budget too), to a model that
    # can think only (catalog ``reasoning``), never Anthropic's ``thinking`` object
    effort = thinking_asked(body)[1] if offer.reasoning else None
    payload.pop("thinking", None)
    payload.pop("reasoning_effort", None)
    if effort:
        payload["reasoning_effort"] = effort
    if any(_anthropic_only(m) or _tool_images(m) for m in body["messages"]):
        payload["messages"] = _openai_messages(body["messages"])
    tools = body.get("tools")
    if tools and any(isinstance(t, dict) and "cache_control" in t for t in tools):
        payload["tools"] = [_for_openai(t) if isinstance(t, dict) else t for t in tools]
    # the cap the hold was sized for (``catalog.output_cap``: the request's, at most the
    # model's), under the name the request used: a larger one would let the provider bill
    # more than was held
    # (a reasoning model takes only max_completion_tokens, which counts the reasoning too)
    field = "max_completion_tokens" if body.get("max_completion_tokens") or effort else "max_tokens"
    payload.pop("max_tokens", None)
    payload.pop("max_completion_tokens", None)
    payload[field] = max_tokens
    payload.pop("stream", None)
    payload.pop("stream_options", None)
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return payload


def _openai_complete(offer: Offer, body: dict, max_tokens: int) -> dict:
    resp = _post(offer, offer.provider.base_url + "/chat/completions", _openai_headers(offer),
                 _openai_payload(offer, body, max_tokens, False))
    data = _read_json(offer, resp)
    if not isinstance(data.get("choices"), list):
        raise ProviderFailure(f"{offer.provider.id}: response without choices")
    return data


def _ended_early(offer: Offer) -> ProviderFailure:
    """An event stream that ended before its finish: a close-delimited body whose
    connection closed mid-answer reads as a normal end at the HTTP level, so the events
    decide (no finish_reason and no ``[DONE]``; Anthropic: no ``message_delta`` /
    ``message_stop``). Before the first event it fails over like any failure."""
    return ProviderFailure(f"{offer.provider.id}: stream ended before its finish")


def _openai_stream(offer: Offer, body: dict, max_tokens: int) -> Iterator[dict]:
    resp = _post(offer, offer.provider.base_url + "/chat/completions", _openai_headers(offer),
                 _openai_payload(offer, body, max_tokens, True))
    finished = False
    for data in sse_events(resp, offer):
        if data == b"[DONE]":
            return
        if not data:
            continue
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
            raise ProviderFailure(f"{offer.provider.id}: stream error {str(chunk['error'])[:200]}")
        if isinstance(chunk, dict):
            finished = finished or any(isinstance(c, dict) and c.get("finish_reason")
                                       for c in chunk.get("choices") or ())
            yield chunk
    if not finished:  # no [DONE] and no finish_reason: cut off, not finished
        raise _ended_early(offer)


# --- Anthropic Messages API ---------------------------------------------------------------

# an answer that filled the context window was cut, as one that reached max_tokens
_STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
         "pause_turn": "stop", "refusal": "content_filter", "model_context_window_exceeded": "length"}


def _anthropic_headers(offer: Offer) -> dict:
    h = {"Content-Type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
    if offer.provider.api_key:
        h["x-api-key"] = offer.provider.api_key
    return h


def _image_block(part: dict) -> dict:
    url = (part.get("image_url") or {}).get("url", "") if isinstance(part.get("image_url"), dict) \
        else str(part.get("image_url") or "")
    url = url if isinstance(url, str) else ""  # not a URL: the provider refuses it (400), no crash
    if url.startswith("data:") and ";base64," in url:
        media, _, data = url[5:].partition(";base64,")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def tool_use_blocks(tool_calls: list | None) -> list[dict]:
    """OpenAI ``tool_calls`` as Anthropic ``tool_use`` blocks: the arguments' JSON text
    decoded to the ``input`` object (text that is not JSON kept as ``{"arguments": …}``,
    JSON that is not an object as ``{"value": …}``)."""
    blocks = []
    for call in tool_calls or []:
        fn = call.get("function") or {}
        try:
            args = orjson.loads(fn.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            args = {"arguments": fn.get("arguments")}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                       "input": args if isinstance(args, dict) else {"value": args}})
    return blocks


def _blocks(content) -> list[dict]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            out.append({"type": "text", "text": part.get("text", ""), **cache_mark(part)})
        elif part.get("type") == "image_url":
            out.append({**_image_block(part), **cache_mark(part)})
        elif _pdf_data(part) is not None:
            out.append({"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                       "data": _pdf_data(part)}, **cache_mark(part)})
    return out


def _pdf_data(part: dict) -> str | None:
    """The base64 data of an OpenAI ``file`` part holding a PDF (``file_data`` as a data
    URL), which Anthropic takes as a ``document`` block; None for any other part."""
    file = part.get("file") if part.get("type") == "file" else None
    data = file.get("file_data") if isinstance(file, dict) else None
    if isinstance(data, str) and data.startswith("data:application/pdf;base64,"):
        return data.removeprefix("data:application/pdf;base64,")
    return None


def _thinking_blocks(message: dict) -> list[dict]:
    """An assistant message's earlier reasoning (``thinking_blocks``) as Anthropic's blocks,
    which go first in the turn: ``thinking`` (text and signature) and ``redacted_thinking``."""
    blocks = message.get("thinking_blocks")
    return [b for b in blocks if isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")] \
        if isinstance(blocks, list) else []


def _marked_last(blocks: list[dict], message: dict) -> list[dict]:
    """``blocks`` of ``message``, its message-level ``cache_control`` (a breakpoint after the
    whole message) on the last one: Anthropic takes it on blocks only."""
    mark = cache_mark(message)
    if mark and blocks:
        blocks[-1] = {**blocks[-1], **mark}
    return blocks


def _joined_text(content) -> str:
    """The text parts of ``content`` joined (a system prompt, a tool result): parts whose
    ``text`` is not a string have no text to join."""
    return " ".join(b["text"] for b in _blocks(content) if b["type"] == "text" and isinstance(b["text"], str))


def to_anthropic(body: dict, upstream_model: str, max_tokens: int, reasoning: bool = False) -> dict:
    """OpenAI chat request → Anthropic Messages request. Values the request document leaves
    open (``stop``, ``tool_choice``, content parts) are translated where they have an
    Anthropic form and otherwise passed on for the provider to judge, never a server error.
    ``reasoning``: the model can think; the thinking asked for (``thinking`` or
    ``reasoning_effort``) is then its ``thinking`` budget, below ``max_tokens`` (which counts
    it, as Anthropic requires), and none when less than Anthropic's least budget fits."""
    system: list[str] = []
    system_blocks: list[dict] = []  # the same as text blocks: sent when one is a cache breakpoint
    messages: list[dict] = []

    def add(role: str, blocks: list[dict]):
        if messages and messages[-1]["role"] == role:  # Anthropic wants alternating turns
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for msg in body["messages"]:
        role = msg.get("role")
        if role in ("system", "developer"):
            system.append(_joined_text(msg.get("content")))
            system_blocks.extend(_marked_last([b for b in _blocks(msg.get("content")) if b["type"] == "text"
                                               and isinstance(b["text"], str) and b["text"]], msg))
        elif role == "user":
            add("user", _marked_last(_blocks(msg.get("content")), msg))
        elif role == "assistant":
            add("assistant", _marked_last(_thinking_blocks(msg) + _blocks(msg.get("content"))
                                          + tool_use_blocks(msg.get("tool_calls")), msg))
        elif role == "tool":  # is_error: the tool failed (the Messages API's, kept by the gateway)
            add("user", [{"type": "tool_result", "tool_use_id": msg.get("tool_call_id"),  # images kept
                          "content": _blocks(msg["content"]) if _tool_images(msg) else _joined_text(msg.get("content")),
                          **({"is_error": True} if msg.get("is_error") is True else {}), **cache_mark(msg)}])
    out: dict = {"model": upstream_model, "messages": messages,
                 "max_tokens": max_tokens}  # the held cap (catalog.output_cap), never the raw request's
    if any("cache_control" in b for b in system_blocks):
        out["system"] = system_blocks
    elif system:
        out["system"] = "\n\n".join(s for s in system if s)
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop  # not a list: the provider's 400
    if body.get("tools"):
        out["tools"] = [{"name": t["function"]["name"],
                         "description": t["function"].get("description", ""),
                         "input_schema": t["function"].get("parameters") or {"type": "object", "properties": {}},
                         **cache_mark(t)}
                        for t in body["tools"]  # no type: a function tool (the only kind)
                        if isinstance(t, dict) and t.get("type", "function") == "function"]
        choice = body.get("tool_choice")
        if choice == "required":
            out["tool_choice"] = {"type": "any"}
        elif choice == "auto":
            out["tool_choice"] = {"type": "auto"}
        elif choice == "none":  # the tools stay: a request with tool_use / tool_result blocks must define them
            out["tool_choice"] = {"type": "none"}
        elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
            out["tool_choice"] = {"type": "tool", "name": choice["function"].get("name")}
        if body.get("parallel_tool_calls") is False and out.get("tool_choice", {}).get("type") != "none":
            # OpenAI's "at most one call per answer"; Anthropic states it on the tool choice
            out["tool_choice"] = {**out.get("tool_choice", {"type": "auto"}), "disable_parallel_tool_use": True}
    if body.get("user"):
        out["metadata"] = {"user_id": str(body["user"])[:256]}
    budget = thinking_asked(body)[0] if reasoning else None
    if budget:
        budget = min(budget, max_tokens - 1)
        if budget >= ANTHROPIC_MIN_THINKING:
            out["thinking"] = {"type": "enabled", "budget_tokens": budget}
    return out


def from_anthropic(data: dict) -> dict:
    """Anthropic Messages response → OpenAI chat completion (id/model set by the caller)."""
    text, calls, thinking = [], [], []
    for block in data.get("content") or []:
        if block.get("type") in ("thinking", "redacted_thinking"):
            thinking.append(block)
        elif block.get("type") == "text":
            text.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"),
                                       "arguments": orjson.dumps(block.get("input") or {}).decode()}})
    message: dict = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:  # LiteLLM's names: the reasoning's text, and the blocks to send back next turn
        message["reasoning_content"] = "".join(b.get("thinking", "") for b in thinking if b["type"] == "thinking")
        message["thinking_blocks"] = thinking
    usage = data.get("usage") or {}
    out = {"choices": [{"index": 0, "message": message,
                        "finish_reason": _STOP.get(data.get("stop_reason"), "stop"), **_matched(data)}]}
    if _counted(usage, "input_tokens") and _counted(usage, "output_tokens"):  # else: the flagged estimate
        out["usage"] = {**anthropic_prompt_usage(usage), "completion_tokens": usage["output_tokens"]}
    return out


def _matched(stopped: dict) -> dict:
    """The stop sequence that ended an Anthropic message (its ``stop_reason:
    "stop_sequence"``), as vLLM names it in an OpenAI choice: ``{"stop_reason": <sequence>}``
    (``messages.py`` turns it back into Anthropic's); ``{}`` for any other end."""
    seq = stopped.get("stop_sequence")
    return {"stop_reason": seq} if stopped.get("stop_reason") == "stop_sequence" and isinstance(seq, str) else {}


def _counted(usage, name: str) -> bool:
    """Whether the provider reported ``name`` as a token count (an integer): usage without
    one of the counts is no usage (the gateway's estimate, flagged), never a count of 0."""
    value = usage.get(name) if isinstance(usage, dict) else None
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_INPUT_COUNTS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _input_counts(usage) -> dict:
    """The input token counts an Anthropic usage object reports (integers only), and its
    ``cache_creation`` (the cache writes by duration) when it has one."""
    out = {k: usage[k] for k in _INPUT_COUNTS if _counted(usage, k)}
    if isinstance(usage, dict) and isinstance(usage.get("cache_creation"), dict):
        out["cache_creation"] = usage["cache_creation"]
    return out


def anthropic_prompt_usage(usage: dict) -> dict:
    """Anthropic input usage in OpenAI's shape: ``prompt_tokens`` counts every input token;
    ``prompt_tokens_details`` says how many were read from the prompt cache
    (``cached_tokens``, OpenAI's name) and written to it (``cache_write_tokens``), and of
    those how many to the 1-hour cache (``cache_write_1h_tokens``, from Anthropic's
    ``cache_creation.ephemeral_1h_input_tokens``; priced apart)."""
    read, write = int(usage.get("cache_read_input_tokens") or 0), int(usage.get("cache_creation_input_tokens") or 0)
    creation = usage.get("cache_creation") if isinstance(usage.get("cache_creation"), dict) else {}
    hour = creation.get("ephemeral_1h_input_tokens")
    hour = min(hour, write) if _counted(creation, "ephemeral_1h_input_tokens") else 0
    out = {"prompt_tokens": int(usage.get("input_tokens") or 0) + read + write}
    if read or write:
        out["prompt_tokens_details"] = {"cached_tokens": read, "cache_write_tokens": write,
                                        **({"cache_write_1h_tokens": hour} if hour else {})}
    return out


def _anthropic_complete(offer: Offer, body: dict, max_tokens: int) -> dict:
    resp = _post(offer, offer.provider.base_url + "/v1/messages", _anthropic_headers(offer),
                 to_anthropic(body, offer.upstream_model, max_tokens, offer.reasoning))
    data = _read_json(offer, resp)
    if data.get("type") == "error":
        raise ProviderFailure(f"{offer.provider.id}: {str(data.get('error'))[:200]}")
    return from_anthropic(data)


def _anthropic_stream(offer: Offer, body: dict, max_tokens: int) -> Iterator[dict]:
    """Anthropic stream events → OpenAI chunks (``choices[0].delta``); usage last."""
    payload = to_anthropic(body, offer.upstream_model, max_tokens, offer.reasoning)
    payload["stream"] = True
    resp = _post(offer, offer.provider.base_url + "/v1/messages", _anthropic_headers(offer),
                 payload)
    prompt = completion = None
    counted: dict = {}  # the input counts so far: message_start's, restated by message_delta's
    tool_index: dict[int, int] = {}
    finish = None
    matched: dict = {}
    for data in sse_events(resp, offer):
        try:
            ev = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        kind = ev.get("type")
        if kind == "message_start":
            counted = _input_counts((ev.get("message") or {}).get("usage"))
            prompt = anthropic_prompt_usage(counted) if "input_tokens" in counted else None
            # the prompt's count rides along (no output count yet): a stream cut before
            # message_delta is charged the prompt Anthropic counted (completions._usage ``cut``)
            yield {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "finish_reason": None}], **({"usage": prompt} if prompt else {})}
        elif kind == "content_block_start":
            block = ev.get("content_block") or {}
            if block.get("type") == "redacted_thinking":  # whole at its start; thinking comes in deltas
                yield {"choices": [{"index": 0, "finish_reason": None, "delta": {"thinking_blocks": [
                    {"type": "redacted_thinking", "data": block.get("data", "")}]}}]}
            elif block.get("type") == "tool_use":
                n = tool_index[ev.get("index", 0)] = len(tool_index)
                yield {"choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                    {"index": n, "id": block.get("id"), "type": "function",
                     "function": {"name": block.get("name"), "arguments": ""}}]}}]}
        elif kind == "content_block_delta":
            delta = ev.get("delta") or {}
            if delta.get("type") == "text_delta":
                yield {"choices": [{"index": 0, "delta": {"content": delta.get("text", "")},
                                    "finish_reason": None}]}
            elif delta.get("type") in ("thinking_delta", "signature_delta"):
                # LiteLLM's names: the reasoning's text, and the block to send back (its text,
                # then its signature, which ends it)
                text, signature = delta.get("thinking", ""), delta.get("signature", "")
                yield {"choices": [{"index": 0, "finish_reason": None, "delta": {
                    **({"reasoning_content": text} if text else {}),
                    "thinking_blocks": [{"type": "thinking", "thinking": text, "signature": signature}]}}]}
            elif delta.get("type") == "input_json_delta":
                n = tool_index.get(ev.get("index", 0), 0)
                yield {"choices": [{"index": 0, "finish_reason": None, "delta": {"tool_calls": [
                    {"index": n, "function": {"arguments": delta.get("partial_json", "")}}]}}]}
        elif kind == "message_delta":
            finish = _STOP.get((ev.get("delta") or {}).get("stop_reason"), "stop")
            matched = _matched(ev.get("delta") or {})
            u = ev.get("usage") or {}
            if _counted(u, "output_tokens"):
                completion = u["output_tokens"]
            # its counts are cumulative: input counts it restates replace message_start's (the
            # ones it leaves out stand), as the anthropic SDK's accumulator reads them
            counted.update(_input_counts(u))
            if "input_tokens" in counted:
                prompt = anthropic_prompt_usage(counted)
        elif kind == "error":
            raise ProviderFailure(f"{offer.provider.id}: stream error {str(ev.get('error'))[:200]}")
        elif kind == "message_stop":
            break
    if finish is None:  # no message_delta (stop reason): cut off, not finished
        raise _ended_early(offer)
    yield {"choices": [{"index": 0, "delta": {}, "finish_reason": finish, **matched}]}
    if prompt is not None and completion is not None:
        yield {"choices": [], "usage": {**prompt, "completion_tokens": completion}}


def complete(offer: Offer, body: dict, max_tokens: int) -> dict:
    """One non-streaming completion at ``offer`` (OpenAI-shaped dict)."""
    if offer.provider.type == "anthropic":
        return _anthropic_complete(offer, body, max_tokens)
    return _openai_complete(offer, body, max_tokens)


def stream(offer: Offer, body: dict, max_tokens: int) -> Iterator[dict]:
    """A streaming completion at ``offer``: OpenAI chunk dicts; raises ``ProviderFailure``
    or ``UpstreamRejected`` from the first ``next()`` when the upstream refuses."""
    if offer.provider.type == "anthropic":
        return _anthropic_stream(offer, body, max_tokens)
    return _openai_stream(offer, body, max_tokens)
