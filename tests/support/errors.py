"""Reading an error body in any of the service's shapes (DESIGN §4): the gateway's
``{error: code, message}``, OpenAI's ``{error: {code, message}}`` on the chat host's
OpenAI routes, Anthropic's ``{type: error, error: {code, message}}`` on /v1/messages and a JSON-RPC
error ``{jsonrpc, id, error: {code, message, data: <the gateway's body>}}`` on /mcp."""
from __future__ import annotations


def error_code(body: dict):
    """The error code of any of the API's error shapes: the gateway's, OpenAI's, Anthropic's,
    and ``/mcp``'s JSON-RPC error (the gateway's body is its ``data``)."""
    err = body.get("error")
    if body.get("jsonrpc") == "2.0" and isinstance(err, dict) and isinstance(err.get("data"), dict):
        return error_code(err["data"])
    return err.get("code") if isinstance(err, dict) else err


def error_message(body: dict):
    err = body.get("error")
    return err.get("message") if isinstance(err, dict) else body.get("message")
