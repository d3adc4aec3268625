"""Demo LLM: a local, deterministic OpenAI-compatible chat server (the embedded default's
``demo_llm`` provider and the sandbox for ``svc_test_`` keys).

Behaviour (deterministic, so tests and demos can predict every byte):

* the reply is ``"Echo: <last user message>"``, ended before its first ``stop`` sequence
  and cut to ``max_tokens`` words; ``n`` choices, each the same reply (each counted);
* with ``response_format`` ``json_object``/``json_schema`` the reply is ``{"echo": "<text>"}``;
* with ``tools`` (and ``tool_choice`` not ``none``) and a user message last, it calls the
  chosen (or first) tool, filling its first parameter with the user text; after a ``tool``
  message it answers ``"Tool result: <content>"``;
* tokens are counted as whitespace-separated words (+3 per message for the prompt);
* with ``reasoning_effort`` (not ``none``) it "thinks" first: ``REASONING_TOKENS`` of the
  effort (32 for one it does not know), counted inside ``completion_tokens`` and reported as
  ``completion_tokens_details.reasoning_tokens`` (as OpenAI reports them), and the reply
  ends with `` (thought: <effort>)``; they count against ``max_completion_tokens`` /
  ``max_tokens`` before the reply's words do;
* ``stream: true`` sends one chunk per word and, when ``stream_options.include_usage``,
  a final usage chunk, then ``data: [DONE]``;
* a body it cannot read (no messages; a text part whose text is not a string …) is a 400
  ``invalid_request_error``, as a provider answers it.

Run: ``python -m demo.llm --port 8790`` (``deploy/run-local.d/20-demo-llm.sh``).
"""
from __future__ import annotations

import json
import time

from demo import JSONHandler, serve_main


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


REASONING_TOKENS = {"minimal": 8, "low": 16, "medium": 32, "high": 64}


def reasoning_tokens(body: dict) -> int:
    """The tokens it thinks for ``body``'s ``reasoning_effort`` (0 without one, or ``none``),
    at most its output cap (``max_completion_tokens`` / ``max_tokens``)."""
    effort = body.get("reasoning_effort")
    if not isinstance(effort, str) or effort == "none":
        return 0
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return min(REASONING_TOKENS.get(effort, 32), int(limit)) if limit else REASONING_TOKENS.get(effort, 32)


def count_prompt(messages: list[dict]) -> int:
    return sum(3 + len(_text(m.get("content")).split()) for m in messages)


def reply(body: dict) -> tuple[dict, int, str]:
    """(assistant message, completion tokens, finish_reason) for a chat request."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    user_text = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if tools and choice != "none" and last.get("role") == "user":
        tool = tools[0]
        if isinstance(choice, dict) and choice.get("function"):
            tool = next((t for t in tools if t["function"]["name"] == choice["function"]["name"]), tool)
        props = list(((tool["function"].get("parameters") or {}).get("properties") or {}))
        args = json.dumps({props[0]: user_text} if props else {})
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_demo_1", "type": "function",
             "function": {"name": tool["function"]["name"], "arguments": args}}]}
        return message, len(args.split()) + 1, "tool_calls"
    text = ("Tool result: " + _text(last.get("content"))) if last.get("role") == "tool" else "Echo: " + user_text
    thought = reasoning_tokens(body)
    if thought:
        text += f" (thought: {body['reasoning_effort']})"
    stops = body.get("stop")
    for stop in [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else ():
        if isinstance(stop, str) and stop and stop in text:  # the reply ends before it
            text = text[: text.index(stop)]
    words = text.split()
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    finish = "stop"
    if limit and len(words) + thought > int(limit):  # the thinking spent first
        words, finish = words[: max(0, int(limit) - thought)], "length"
    text = " ".join(words)
    rf = body.get("response_format") or {}
    if rf.get("type") in ("json_object", "json_schema"):
        text = json.dumps({"echo": text})
    return {"role": "assistant", "content": text}, len(words) + thought, finish


class DemoLLMHandler(JSONHandler):
    protocol_version = "HTTP/1.1"
    server_version = "demo-llm/1.0"
    disable_nagle_algorithm = True  # small keep-alive responses: no 40 ms delayed-ACK stalls
    wbufsize = 64 * 1024  # headers and body leave in one write (flushed per request / chunk)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            return self._json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": 0, "owned_by": "demo"}
                for m in ("demo-mini", "demo-standard", "demo-large")]})
        return self._json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            assert isinstance(body, dict) and isinstance(body.get("messages"), list) and body["messages"]
        except Exception:  # noqa: BLE001
            return self._json(400, {"error": {"message": "messages: a non-empty array is required",
                                              "type": "invalid_request_error"}})
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._json(404, {"error": {"message": "not found", "type": "not_found"}})
        try:
            message, completion, finish = reply(body)
            prompt = count_prompt(body["messages"])
        except Exception as exc:  # noqa: BLE001 - a body it cannot read: a provider's 400, not a dropped connection
            return self._json(400, {"error": {"message": f"unreadable request ({type(exc).__name__}: {exc})",
                                              "type": "invalid_request_error"}})
        n = body.get("n") if isinstance(body.get("n"), int) and body["n"] > 0 else 1
        base = {"id": "chatcmpl-demo", "created": int(time.time()), "model": body.get("model", "demo")}
        usage = {"prompt_tokens": prompt, "completion_tokens": completion * n,
                 "total_tokens": prompt + completion * n}
        if reasoning_tokens(body) and not message.get("tool_calls"):
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens(body) * n}
        if not body.get("stream"):
            return self._json(200, {**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": i, "message": message, "finish_reason": finish} for i in range(n)]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        chunk = {**base, "object": "chat.completion.chunk"}

        def send(obj) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        for n_ in range(n):  # each choice's chunks in turn
            send({**chunk, "choices": [{"index": n_, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]})
            if message.get("tool_calls"):
                send({**chunk, "choices": [{"index": n_, "finish_reason": None, "delta": {"tool_calls": [
                    {"index": 0, **message["tool_calls"][0]}]}}]})
            else:
                words = message["content"].split(" ")
                for i, w in enumerate(words):
                    send({**chunk, "choices": [{"index": n_, "finish_reason": None,
                                                "delta": {"content": w if i == 0 else " " + w}}]})
            send({**chunk, "choices": [{"index": n_, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            send({**chunk, "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main(argv: list[str] | None = None) -> None:
    serve_main(DemoLLMHandler, description=__doc__.splitlines()[0], port=8790, label="demo LLM", path="/v1", argv=argv)


if __name__ == "__main__":
    main()
