"""Reading an error body in any of the service's shapes (DESIGN §4): the gateway's
``{error: code, message}``, OpenAI's ``{error: {code, message}}`` on the chat host's
OpenAI routes and Anthropic's ``{type: error, error: {code, message}}`` on /v1/messages."""
from __future__ import annotations


def error_code(body: dict):
    err = body.get("error")
    return err.get("code") if isinstance(err, dict) else err


def error_message(body: dict):
    err = body.get("error")
    return err.get("message") if isinstance(err, dict) else body.get("message")
