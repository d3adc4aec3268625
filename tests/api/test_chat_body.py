"""The chat request body's fast path (issue 18 item 4): a plain, valid body is taken as
parsed, without marshmallow; anything else goes through ``ChatRequestSchema`` (same 400
bodies, same coercions). ``plain_chat_request`` may only accept what the schema loads to
the same value."""
from __future__ import annotations

import marshmallow as ma
import pytest

from app.blueprints.chat import schemas
from app.blueprints.chat.schemas import ChatRequestSchema, plain_chat_request
from tests.api.test_chat import acct, chat, fakes, upstreams  # noqa: F401

MSG = [{"role": "user", "content": "hi"}]


def _deep(n):
    doc = "x"
    for _ in range(n):
        doc = [doc]
    return doc


PLAIN = [
    {"model": "auto", "messages": MSG},
    {"model": "m-small", "messages": MSG, "stream": True, "max_tokens": 1, "n": 16, "temperature": 0.2},
    {"model": "m", "messages": MSG, "max_tokens": None, "max_completion_tokens": 1_000_000,
     "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
     "response_format": {"type": "json_object"}, "stream_options": None, "user": "u-1"},
    {"model": "x" * 96, "messages": MSG * 4096, "tools": [], "extra": _deep(30)},
    {"model": "auto", "messages": MSG, "temperature": 2, "top_p": 0}, {"model": "auto", "messages": MSG, "top_p": 1.0},
]
NOT_PLAIN = [
    None, [], "text", {"messages": MSG}, {"model": "auto"}, {"model": "", "messages": MSG},
    {"model": "x" * 97, "messages": MSG}, {"model": "a\nb", "messages": MSG}, {"model": 5, "messages": MSG},
    {"model": "auto", "messages": []}, {"model": "auto", "messages": MSG * 4097},
    {"model": "auto", "messages": ["hi"]}, {"model": "auto", "messages": MSG, "stream": "true"},
    {"model": "auto", "messages": MSG, "stream": None}, {"model": "auto", "messages": MSG, "stream": 1},
    {"model": "auto", "messages": MSG, "max_tokens": 5.0}, {"model": "auto", "messages": MSG, "max_tokens": "5"},
    {"model": "auto", "messages": MSG, "max_tokens": True}, {"model": "auto", "messages": MSG, "max_tokens": 0},
    {"model": "auto", "messages": MSG, "n": 17}, {"model": "auto", "messages": MSG, "tools": {"a": 1}},
    {"model": "auto", "messages": MSG, "tools": [{}] * 129}, {"model": "auto", "messages": MSG, "tools": ["f"]},
    {"model": "auto", "messages": MSG, "response_format": "json"},
    {"model": "auto", "messages": MSG, "extra": _deep(40)},
    {"model": "auto", "messages": MSG, "temperature": 2.5}, {"model": "auto", "messages": MSG, "temperature": -0.1},
    {"model": "auto", "messages": MSG, "temperature": "0.5"}, {"model": "auto", "messages": MSG, "temperature": True},
    {"model": "auto", "messages": MSG, "top_p": 1.5},
]


@pytest.mark.parametrize("doc", PLAIN)
def test_plain_bodies_are_taken_as_the_schema_would_load_them(doc):
    assert plain_chat_request(doc) is doc
    assert ChatRequestSchema().load(doc) == doc


@pytest.mark.parametrize("doc", NOT_PLAIN)
def test_anything_else_goes_to_the_schema(doc):
    assert plain_chat_request(doc) is None


def test_a_plain_request_skips_marshmallow_and_a_bad_one_keeps_its_400(app, client, fakes, acct,  # noqa: F811
                                                                       monkeypatch):
    loads = []
    original = schemas.ChatRequestSchema.load

    def counting(self, *args, **kwargs):
        loads.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(schemas.ChatRequestSchema, "load", counting)
    assert chat(client, acct, model="m-small", max_tokens=100).status_code == 200
    assert loads == []
    r = chat(client, acct, model="m-small", max_tokens="many")
    assert r.status_code == 400 and loads == [1]
    body = r.get_json()
    assert body["error"]["code"] == "invalid_request" and body["error"]["param"] == "max_tokens", body
    assert "max_tokens: Not a valid integer." in body["error"]["message"], body
    with pytest.raises(ma.ValidationError):
        ChatRequestSchema().load({"model": "auto", "messages": MSG, "max_tokens": "many"})


@pytest.mark.parametrize("path, over", [
    ("/v1/chat/completions", {"stream": 0}), ("/v1/chat/completions", {"stream": "true"}),
    ("/v1/chat/completions", {"max_tokens": 5.5}), ("/v1/chat/completions", {"max_tokens": "7"}),
    ("/v1/chat/completions", {"max_completion_tokens": "7"}), ("/v1/chat/completions", {"n": 1.5}),
    ("/v1/messages", {"stream": 1}), ("/v1/messages", {"max_tokens": 5.5}), ("/v1/messages", {"max_tokens": "7"}),
    ("/v1/messages", {"temperature": "0.5"}), ("/v1/messages", {"top_p": "1"}),
])
def test_a_field_of_another_json_type_is_refused_as_the_document_says(client, fakes, acct, path, over):  # noqa: F811
    """The document types these fields (boolean, integer, number); marshmallow's own fields
    read ``0``, ``"true"``, ``5.5`` (as 5) and ``"7"`` and the request went through, charged.
    A fraction-free float stays an integer (JSON Schema: ``5.0`` is one, below)."""
    body = {"model": "m-small", "max_tokens": 10, "messages": MSG, **over}
    r = client.post(path, json=body, headers={"Authorization": f"Bearer {acct.key}"})
    assert r.status_code == 400 and "Not a valid" in r.get_data(as_text=True), r.get_data(as_text=True)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_fraction_free_float_is_still_an_integer(client, fakes, acct, path):  # noqa: F811
    body = {"model": "m-small", "max_tokens": 10.0, "messages": MSG, "temperature": 1}
    assert client.post(path, json=body, headers={"Authorization": f"Bearer {acct.key}"}).status_code == 200


@pytest.mark.parametrize("path, field, value", [
    ("/v1/chat/completions", "temperature", 5), ("/v1/chat/completions", "temperature", -1),
    ("/v1/chat/completions", "top_p", 1.5), ("/v1/messages", "temperature", 1.5), ("/v1/messages", "top_p", 2),
])
def test_sampling_settings_outside_the_apis_ranges_are_the_callers_400(client, fakes, acct, path, field,  # noqa: F811
                                                                        value):
    """OpenAI takes ``temperature`` 0–2 and ``top_p`` 0–1, Anthropic ``temperature`` 0–1:
    outside, the request is refused with a 400 naming the field before anything is held or
    sent. Until 2026-11-29 chat completions passed any value to the provider (whose 400 is a
    provider failure there) and the Messages API took ``temperature`` up to 2."""
    body = {"model": "m-small", "max_tokens": 10, "messages": MSG, field: value}
    r = client.post(path, json=body, headers={"Authorization": f"Bearer {acct.key}"})
    assert r.status_code == 400 and field in r.get_data(as_text=True), r.get_data(as_text=True)
    assert fakes.cheap.bodies == [] and fakes.pricey.bodies == []  # nothing was sent
