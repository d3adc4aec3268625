"""LiteLLM as a client of the chat host (issue 39), run with LiteLLM's own interpreter
(it cannot share the app's virtualenv: its botocore pins python-dateutil < 3, the app's
croniter has 4.x): ``<litellm python> tests/e2e/litellm_client.py BASE KEY POOR_KEY``.
Prints one JSON object of what LiteLLM made of each answer; tests/e2e/test_chat_litellm.py
starts the server and checks it."""
from __future__ import annotations

import json
import sys

import litellm


def main(base: str, key: str, poor: str) -> dict:
    out: dict = {}
    hi = [{"role": "user", "content": "hi"}]
    kw = {"model": "openai/auto", "api_base": base + "/v1", "max_retries": 0}
    r = litellm.completion(messages=hi, api_key=key, **kw)
    usage = r.usage
    out["plain"] = {"text": r.choices[0].message.content, "cost": getattr(usage, "cost", None),
                    "cost_micros": getattr(usage, "cost_micros", None),
                    "savings_pct": getattr(usage, "savings_pct", None),
                    "headers": {k: v for k, v in (r._hidden_params.get("additional_headers") or {}).items()
                                if "gateway" in k.lower()}}
    chunks = list(litellm.completion(messages=[{"role": "user", "content": "stream these words"}], api_key=key,
                                     stream=True, stream_options={"include_usage": True}, **kw))
    final = [c for c in chunks if getattr(c, "usage", None)]
    fu = final[-1].usage if final else None
    out["stream"] = {"text": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                     "cost": getattr(fu, "cost", None), "cost_micros": getattr(fu, "cost_micros", None),
                     "savings_pct": getattr(fu, "savings_pct", None)}

    # the token counts LiteLLM computes for a stream, from each API's events: the Messages
    # API's (message_start, then message_delta's cumulative usage) and OpenAI's usage chunk
    for name, model, base_url in (("anthropic_stream", "anthropic/demo-standard", base),
                                  ("openai_stream", "openai/demo-large", base + "/v1")):
        words = [{"role": "user", "content": "count these streamed words please"}]
        got = list(litellm.completion(model=model, api_base=base_url, api_key=key, messages=words, max_tokens=64,
                                      stream=True, stream_options={"include_usage": True}, max_retries=0))
        built = litellm.stream_chunk_builder(got, messages=words)
        out[name] = {"prompt_tokens": built.usage.prompt_tokens, "completion_tokens": built.usage.completion_tokens,
                     "finish_reason": built.choices[0].finish_reason}

    def error(call) -> dict:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - what LiteLLM raised is the finding
            return {"class": type(exc).__name__, "status": getattr(exc, "status_code", None), "text": str(exc)}
        return {"class": None}

    out["401"] = error(lambda: litellm.completion(messages=hi, api_key="svc_live_nope", **kw))
    out["402"] = error(lambda: litellm.completion(messages=hi, api_key=poor, **kw))
    out["404"] = error(lambda: litellm.completion(messages=hi, api_key=key, **{**kw, "model": "openai/nope"}))

    def burst():
        for _ in range(40):
            litellm.completion(messages=hi, api_key=key, **kw)
    out["429"] = error(burst)
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
