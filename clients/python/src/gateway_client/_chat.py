"""Settings of the ``openai.OpenAI`` client returned by ``chat_client()``: the chat host's
``/v1`` (``chat_base_url``, else ``GATEWAY_CHAT_URL``, else the gateway's own ``/v1``),
the caller's credential and the client's User-Agent. No chat types are reimplemented."""
from __future__ import annotations

import os
from typing import Any

from gateway_client._core import USER_AGENT


def chat_settings(base_url: str, chat_base_url: str | None, token: str | None,
                  options: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI client's arguments: ``options`` (the caller's own) win, and their
    ``default_headers`` are added to the client's User-Agent."""
    chat = (chat_base_url or os.environ.get("GATEWAY_CHAT_URL") or base_url).rstrip("/")
    if not chat.endswith("/v1"):
        chat += "/v1"
    headers = {"User-Agent": USER_AGENT, **(options.get("default_headers") or {})}
    return {"base_url": chat, "api_key": token or "", **options, "default_headers": headers}
