"""The chat host: which requests it answers and which error convention they get.

The chat routes (``/v1/chat/completions``, ``/v1/models``, ``/v1/messages`` and
``/v1/messages/count_tokens``) answer only on
``CHAT_HOST`` when it is set, on any host otherwise. Their errors speak the convention of
the provider API they imitate (DESIGN §4, docs/decisions.md "Errors on the chat host"):
OpenAI's on the OpenAI routes, Anthropic's on ``/v1/messages``; everything else keeps the
gateway's shape, except the MCP endpoint (``/mcp``, any host), whose errors are JSON-RPC
error responses that MCP clients read (docs/mcp.md "Errors"). ``error_style`` is the one
place that decides it, for the Flask routes, the thin WSGI entry and the OpenAPI document
alike.
"""
from __future__ import annotations

GATEWAY, OPENAI, ANTHROPIC, MCP = "gateway", "openai", "anthropic", "mcp"
MCP_PATH = "/mcp"
MODULE_PREFIX = "/v1/module/"  # the module gateway's calls, in the gateway's error shape


def on_chat_host(host: str | None, wanted: str | None) -> bool:
    """Whether a request to ``host`` (the Host header, port included or not) may reach the
    chat routes when the chat host is ``wanted`` (``CHAT_HOST``): always when it is unset,
    else only on that host name."""
    if not wanted:
        return True
    host = (host or "").lower()
    if not host.endswith("]"):  # strip the port (not inside an IPv6 literal)
        host = host.rsplit(":", 1)[0] if ":" in host else host
    # a fully qualified name's trailing dot names the same host (RFC 1034 §3.1)
    return host.rstrip(".") == wanted.lower().rstrip(".")


def path_style(path: str) -> str:
    """The error convention of a path (the OpenAPI document's view: there the chat routes
    are the chat host's): ``ANTHROPIC`` for ``/v1/messages``, ``MCP`` for ``/mcp``,
    ``GATEWAY`` for the module gateway (``/v1/module/…``) and anything outside ``/v1/``,
    ``OPENAI`` for the rest of ``/v1/``: ``/v1/chat/…``, ``/v1/models…`` and the paths
    OpenAI's clients call beside them that the chat host does not serve (``/v1/embeddings``,
    ``/v1/responses`` …), whose 404 their SDKs then read."""
    if path == MCP_PATH:
        return MCP
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return ANTHROPIC
    if path.startswith("/v1/") and not (path + "/").startswith(MODULE_PREFIX):
        return OPENAI
    return GATEWAY


def error_style(path: str, host: str | None, chat_host: str | None) -> str:
    """The error convention of a request to ``path`` on ``host``: a chat path's own on the
    chat host (any host when ``chat_host`` is unset), the gateway's elsewhere (off the chat
    host a chat path is the gateway's plain 404); ``MCP`` for ``/mcp`` on any host."""
    style = path_style(path)
    if style in (OPENAI, ANTHROPIC) and not on_chat_host(host, chat_host):
        return GATEWAY
    return style
