"""The Messages API's other content blocks: an earlier turn's ``thinking`` /
``redacted_thinking`` (what the anthropic SDK's clients send back with the history) and
``document`` (plain text, base64 PDF). They were refused with 400, so a conversation with
Claude's reasoning in it, or a document, could not go through the gateway. Figures as in
tests/api/test_chat.py (m-claude: Anthropic provider with vision; m-big: OpenAI-compatible,
vision; m-small: no vision)."""
from __future__ import annotations

import base64

from sqlalchemy import select

from app.extensions import db
from app.models import ChatCompletion
from app.services.chat import tokens
from tests.api.test_chat import acct, figures, START, fakes, upstreams  # noqa: F401

THINK = {"type": "thinking", "thinking": "The user wants the weather.", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "opaque"}
TOOLS = [{"name": "weather", "input_schema": {"type": "object", "properties": {}}}]
TURNS = [{"role": "user", "content": "weather?"},
         {"role": "assistant", "content": [THINK, REDACTED, {"type": "text", "text": "Checking."},
                                           {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]


def _message(client, acct, **body):  # noqa: F811
    return client.post("/v1/messages", headers={"x-api-key": acct.key}, json={"max_tokens": 64, **body})


def test_thinking_blocks_of_earlier_turns_are_taken(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """An Anthropic provider gets them back where they were, first in the assistant turn
    (Anthropic checks their signatures, or strips them when thinking is off); an
    OpenAI-compatible one, to which Claude's signed reasoning means nothing, never sees them."""
    for model in ("m-claude", "m-big"):
        r = _message(client, acct, model=model, tools=TOOLS, messages=TURNS)
        assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[0]["messages"][1]["content"] == [
        THINK, REDACTED, {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]
    sent = fakes.pricey.bodies[0]["messages"][1]
    assert "thinking" not in str(sent) and "opaque" not in str(sent), sent
    assert sent["content"] == "Checking." and sent["tool_calls"][0]["id"] == "toolu_1"
    # /v1/chat/completions takes them as LiteLLM sends them: thinking_blocks on the assistant message
    r = client.post("/v1/chat/completions", headers=acct.headers, json={
        "model": "m-claude", "max_tokens": 64, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello.", "thinking_blocks": [THINK]},
            {"role": "user", "content": "again"}]})
    assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[1]["messages"][1]["content"] == [THINK, {"type": "text", "text": "Hello."}]
    # in a user turn, or without its signature, it is refused as Anthropic refuses it
    for turn in ({"role": "user", "content": [THINK]},
                 {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}):
        r = _message(client, acct, model="m-claude", messages=[{"role": "user", "content": "hi"}, turn])
        assert r.status_code == 400 and r.get_json()["error"]["type"] == "invalid_request_error", r.get_json()
    assert fakes.claude.calls == 2
    ledger_clean()


def test_a_plain_text_document_is_text_for_every_provider(app, client, fakes, acct, ledger_clean):  # noqa: F811
    doc = {"type": "document", "title": "Notes", "context": "From the wiki.",
           "source": {"type": "text", "media_type": "text/plain", "data": "The sky is blue."}}
    for model in ("m-claude", "m-small"):
        r = _message(client, acct, model=model, messages=[
            {"role": "user", "content": [doc, {"type": "text", "text": "What colour?"}]}])
        assert r.status_code == 200, r.get_json()
    text = "Notes\n\nFrom the wiki.\n\nThe sky is blue."
    assert fakes.claude.bodies[0]["messages"][0]["content"] == [{"type": "text", "text": text},
                                                               {"type": "text", "text": "What colour?"}]
    assert fakes.cheap.bodies[0]["messages"][0]["content"] == [{"type": "text", "text": text},
                                                              {"type": "text", "text": "What colour?"}]
    ledger_clean()


def test_a_pdf_document_reaches_each_provider_in_its_own_form(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """A base64 PDF is an Anthropic provider's ``document`` and an OpenAI-compatible one's
    ``file`` part (OpenAI's chat form of a PDF); it needs a model that reads images (vision),
    and its hold counts 3,000 tokens a page. A URL source has no OpenAI form: refused."""
    pdf = base64.b64encode(b"%PDF-1.4 1 0 obj <</Type /Page>> 2 0 obj <</Type /Page>> <</Type /Pages>>").decode()
    doc = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
           "cache_control": {"type": "ephemeral"}}
    turns = [{"role": "user", "content": [doc, {"type": "text", "text": "Summarise."}]}]
    for model in ("m-claude", "m-big"):
        r = _message(client, acct, model=model, messages=turns)
        assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[0]["messages"][0]["content"][0] == {
        "type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
        "cache_control": {"type": "ephemeral"}}
    assert fakes.pricey.bodies[0]["messages"][0]["content"][0] == {
        "type": "file", "file": {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{pdf}"}}
    with app.app_context():
        hold = db.session.execute(select(ChatCompletion.hold_micros).order_by(ChatCompletion.created_at.desc())
                                  ).scalars().first()
        db.session.remove()
    assert hold >= 2 * tokens.PDF_PAGE_TOKENS * 5  # two pages at m-big's input price
    r = _message(client, acct, model="m-small", messages=turns)
    assert r.status_code == 400 and r.get_json()["error"]["code"] == "no_matching_model", r.get_json()
    before = figures(app, acct.id)["balance"]
    r = _message(client, acct, model="m-claude", messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]}])
    assert r.status_code == 400 and r.get_json()["type"] == "error", r.get_json()
    assert fakes.claude.calls == 1 and figures(app, acct.id)["balance"] == before
    ledger_clean()


def test_a_server_tool_is_refused_not_passed_off_as_a_custom_one(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """Anthropic's server tools (``web_search_…``) run on Anthropic's side and its client
    tools (``bash_…``, ``text_editor_…``) need its built-in definitions: the translation made
    each a custom function tool with an empty schema, so the model was offered a ``web_search``
    it could only ask the client to run. Refused clearly (the document says so); a custom
    tool's ``type: "custom"`` is taken."""
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    r = _message(client, acct, model="m-claude", tools=[search], messages=[{"role": "user", "content": "news?"}])
    assert r.status_code == 400 and r.get_json()["error"]["type"] == "invalid_request_error", r.get_json()
    assert "web_search_20250305" in r.get_json()["error"]["message"] and fakes.claude.calls == 0
    r = _message(client, acct, model="m-claude", tools=[{**TOOLS[0], "type": "custom"}],
                 messages=[{"role": "user", "content": "weather?"}])
    assert r.status_code == 200 and fakes.claude.bodies[0]["tools"][0]["name"] == "weather", r.get_json()
    ledger_clean()


def test_top_level_cache_control_marks_the_last_block(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """Anthropic's automatic caching: a request-level ``cache_control`` (the anthropic SDK's
    ``messages.create(cache_control=…)``) puts the breakpoint on the last cacheable block. It
    was ignored, so such a conversation was never cached through the gateway and paid the full
    input price each turn. It now goes on the last block for an Anthropic provider (its
    ``ttl`` kept as for any mark, the hold sized for it), never to an OpenAI-compatible one."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    for model in ("m-claude", "m-big"):
        r = _message(client, acct, model=model, tools=TOOLS, cache_control=hour, messages=TURNS)
        assert r.status_code == 200, r.get_json()
    assert fakes.claude.bodies[0]["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny", "cache_control": hour}]
    assert "cache_control" not in str(fakes.pricey.bodies[0])
    r = _message(client, acct, model="m-claude", cache_control={"type": "ephemeral"},
                 messages=[{"role": "user", "content": "hi"}])
    assert fakes.claude.bodies[1]["messages"][0]["content"] == [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]
    ledger_clean()


def test_a_tool_result_may_hold_documents(app, client, fakes, acct, ledger_clean):  # noqa: F811
    """A tool that reads a file answers with a ``document`` in its ``tool_result`` (Claude
    Code's Read of a PDF): refused with 400. An Anthropic provider gets it in the
    ``tool_result``; an OpenAI-compatible one, whose tool messages take text only, gets the
    PDF as a ``file`` part in a user message right after the tool results (as images)."""
    pdf = base64.b64encode(b"%PDF-1.4 <</Type /Page>>").decode()
    doc = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
           "cache_control": {"type": "ephemeral"}}
    turns = [TURNS[0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                           "content": [{"type": "text", "text": "the report"}, doc]}]}]
    for model in ("m-claude", "m-big"):
        r = _message(client, acct, model=model, tools=TOOLS, messages=turns)
        assert r.status_code == 200, r.get_json()
    pdf_block = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
                 "cache_control": {"type": "ephemeral"}}
    assert fakes.claude.bodies[0]["messages"][2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "the report"}, pdf_block]}]
    sent = fakes.pricey.bodies[0]["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "the report"}
    assert sent[3] == {"role": "user", "content": [
        {"type": "file", "file": {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{pdf}"}}]}
    ledger_clean()
