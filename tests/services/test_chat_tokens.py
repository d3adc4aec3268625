"""Prompt token estimates (app/services/chat/tokens.py): the real OpenAI tokenizers work
offline and count chat messages exactly as OpenAI does; Claude and unknown models get the
documented estimates."""
from __future__ import annotations

import math
import struct
import zlib

import pytest

from app.services.chat import tokens

# OpenAI's published token-counting example (openai-cookbook, "How to count tokens with
# tiktoken"): the API reports 129 prompt tokens for gpt-4 / gpt-3.5-turbo and 124 for gpt-4o.
COOKBOOK = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that translates "
                                  "corporate jargon into plain English."},
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant",
     "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth "
                                                          "to touch base on opportunities for increased leverage."},
    {"role": "system", "name": "example_assistant",
     "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the "
                                "client deliverable."},
]


def test_catalog_models_map_to_their_encodings():
    assert [tokens.estimator(m) for m in ("gpt-4o", "gpt-4o-mini", "gpt-4.1-nano", "o3-mini", "o1",
                                          "openai/gpt-5", "chatgpt-4o-latest")] == [tokens.O200K] * 7
    assert [tokens.estimator(m) for m in ("gpt-4", "gpt-4-turbo", "gpt-3.5-turbo")] == [tokens.CL100K] * 3
    assert tokens.estimator("claude-sonnet-4-20250514") == tokens.CLAUDE
    assert tokens.estimator("demo-mini") == tokens.estimator("llama-3-70b") == tokens.CHARS


def test_the_tokenizers_are_openais_and_need_no_network():
    """Known token ids (tiktoken's README: cl100k "tiktoken is great!"); the encodings are
    embedded in the package, so loading them opens no connection (the test suite has none)."""
    assert tokens._encoding(tokens.CL100K).encode_ordinary("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert tokens._encoding(tokens.O200K).encode_ordinary("hello world") == [24912, 2375]
    assert tokens.count_text("<|endoftext|>", tokens.CL100K) > 1  # a user's text is never a special token


def test_openai_message_accounting_equals_openais_count():
    """The stated bound for OpenAI models: 0 tokens off OpenAI's own count for text messages."""
    assert tokens.estimate_prompt_tokens({"messages": COOKBOOK}, tokens.CL100K) == 129
    assert tokens.estimate_prompt_tokens({"messages": COOKBOOK}, tokens.O200K) == 124


def test_estimate_within_bound_of_the_tokenizer_count():
    """For any body: content tokens ≤ estimate ≤ content tokens + 3 per message + role and
    name tokens + 3; tool calls and definitions are counted too."""
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    body = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Wie wird das Wetter in Zürich? 🌦"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Zürich"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12 °C, Regen"}], "tools": tools}
    for enc in (tokens.O200K, tokens.CL100K):
        content = sum(tokens.count_text(t, enc) for t in ("Wie wird das Wetter in Zürich? 🌦", "weather",
                                                           '{"city":"Zürich"}', "12 °C, Regen"))
        tool_defs = tokens.count_text('[{"type":"function","function":{"name":"weather","parameters":'
                                      '{"type":"object"}}}]', enc)
        overhead = 3 * 3 + 3 + sum(tokens.count_text(r, enc) for r in ("user", "assistant", "tool", "c1"))
        assert tokens.estimate_prompt_tokens(body, enc) == content + tool_defs + overhead
        assert overhead <= 3 * 3 + 3 + 8


def test_claude_and_unknown_models_use_the_documented_estimates():
    body = {"messages": COOKBOOK}
    assert tokens.estimate_prompt_tokens(body, tokens.CLAUDE) == math.ceil(129 * 1.3)
    chars = sum(len(m["content"]) for m in COOKBOOK)
    assert tokens.estimate_prompt_tokens(body, tokens.CHARS) == 3 + 4 * len(COOKBOOK) + math.ceil(chars / 4)


def test_text_beyond_the_library_limits_counts_its_bytes():
    huge = "ab" * 600_000  # 1.2 M characters: more than the tokenizer takes in one piece
    assert tokens.count_text(huge, tokens.O200K) == len(huge)


@pytest.mark.parametrize("answer,chars", [
    ({"content": "Hello"}, 5),
    ({"content": None, "tool_calls": [{"function": {"name": "get", "arguments": "{}"}}]}, 5),
    ({"content": [{"type": "text", "text": "Hi"}, {"type": "image"}]}, 2),  # content parts: their text
    ({"content": 5}, 0),                                                     # not text: nothing, no error
    ({"content": None, "tool_calls": [{"function": {"name": 7, "arguments": {"a": 1}}}]}, 0),
    ({"content": "ab", "tool_calls": ["x", {"function": "y"}, None]}, 2),
    ({"content": "ab", "tool_calls": "not a list"}, 2),
])
def test_the_output_estimate_counts_the_text_of_any_answer_shape(answer, chars):
    """``completions._chars`` (the output estimate when a provider reports no usage) took
    ``len()`` of whatever the provider answered: a number as content or a tool call name
    that is no string raised TypeError after the provider had answered (500, hold
    released). It counts text, and anything else as nothing."""
    from app.services.chat.completions import _chars

    assert _chars(answer) == chars


def test_a_pdf_counts_its_pages():
    """A PDF file part (a Messages API ``document``) counted nothing, so a hold for a long
    document was a few tokens and the charge was capped at it: 3,000 tokens a page, the pages
    from the page objects or the page tree's ``/Count``."""
    import base64

    from app.services.chat import tokens

    def body(pdf: bytes) -> dict:
        data = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
        return {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_data": data}}]}]}

    empty = tokens.estimate_prompt_tokens({"messages": [{"role": "user", "content": []}]}, tokens.CHARS)
    two = body(b"%PDF-1.4 <</Type /Page>> <</Type /Page >> <</Type /Pages /Kids [] /Count 2>>")
    assert tokens.estimate_prompt_tokens(two, tokens.CHARS) == empty + 2 * tokens.PDF_PAGE_TOKENS
    assert tokens.estimate_prompt_tokens(body(b"%PDF-1.7 <</Type /Pages /Count 40>>"), tokens.CHARS) \
        == empty + 40 * tokens.PDF_PAGE_TOKENS
    assert tokens.estimate_prompt_tokens(body(b"%PDF-1.7 compressed"), tokens.O200K) \
        == tokens.estimate_prompt_tokens({"messages": [{"role": "user", "content": []}]}, tokens.O200K) \
        + tokens.PDF_PAGE_TOKENS


def objstm_pdf(pages: int) -> bytes:
    """A PDF 1.5 whose catalog, page tree and pages all sit in one compressed object stream
    (found through a compressed cross-reference stream): no ``/Type /Page`` or ``/Count`` in its bytes."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages))
    objs = [b"<</Type /Catalog /Pages 2 0 R>>", f"<</Type /Pages /Kids [{kids}] /Count {pages}>>".encode()]
    objs += [b"<</Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]>>"] * pages
    n = len(objs)
    offsets, body = [], b""
    for o in objs:
        offsets.append(len(body))
        body += o + b" "
    header = " ".join(f"{1 + i} {off}" for i, off in enumerate(offsets)).encode() + b" "
    stm = zlib.compress(header + body)
    out = b"%PDF-1.5\n%\xe2\xe3\xcf\xd3\n"
    stm_num, xref_num = n + 1, n + 2
    stm_off = len(out)
    out += f"{stm_num} 0 obj\n<</Type /ObjStm /N {n} /First {len(header)} /Filter /FlateDecode /Length {len(stm)}>>\nstream\n".encode() + stm + b"\nendstream\nendobj\n"
    xref_off = len(out)
    rows = [struct.pack(">BIH", 0, 0, 65535)]
    rows += [struct.pack(">BIH", 2, stm_num, i) for i in range(n)]
    rows += [struct.pack(">BIH", 1, stm_off, 0), struct.pack(">BIH", 1, xref_off, 0)]
    data = zlib.compress(b"".join(rows))
    out += (f"{xref_num} 0 obj\n<</Type /XRef /Size {xref_num + 1} /W [1 4 2] /Root 1 0 R /Filter /FlateDecode"
            f" /Length {len(data)}>>\nstream\n").encode() + data + b"\nendstream\nendobj\n"
    out += f"startxref\n{xref_off}\n%%EOF\n".encode()
    return out


def test_a_pdf_whose_page_tree_is_in_object_streams_counts_its_pages():
    """A PDF 1.5+ keeps its catalog, page tree and pages in compressed object streams (found
    through a cross-reference stream), as most writers do today: its bytes show no
    ``/Type /Page`` and no ``/Count``, and it was estimated at one page, so a long document's
    charge was capped at a one-page hold. pypdf reads its page tree."""
    import base64

    from app.services.chat import tokens

    raw = objstm_pdf(12)
    assert b"/Type /Page" not in raw and b"/Count" not in raw
    data = "data:application/pdf;base64," + base64.b64encode(raw).decode()
    part = {"type": "file", "file": {"file_data": data}}
    empty = tokens.estimate_prompt_tokens({"messages": [{"role": "user", "content": []}]}, tokens.CHARS)
    assert tokens.estimate_prompt_tokens({"messages": [{"role": "user", "content": [part]}]}, tokens.CHARS) \
        == empty + 12 * tokens.PDF_PAGE_TOKENS
    assert tokens.pdf_pages(base64.b64encode(raw).decode()) == 12  # bare base64 too
