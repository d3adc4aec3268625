"""Prompt token estimates: what a chat request's messages will count as input tokens at a
given upstream model, before the call. They size the hold (``completions._hold_for``:
estimated input tokens × input price + output cap × output price), rank candidate offers
and check context windows; settlement always charges the provider's reported usage.

Three estimators, chosen per upstream model name by :func:`estimator`:

* **OpenAI models** (``gpt-4o*``, ``gpt-4.1*``, ``gpt-4.5*``, ``gpt-5*``, ``o1``/``o3``/``o4``
  families, ``chatgpt-4o*``, ``gpt-oss*`` → ``o200k_base``; ``gpt-4*``, ``gpt-3.5*`` →
  ``cl100k_base``): the real tokenizer (the ``bpe-openai`` package, which embeds OpenAI's
  BPE files, byte-identical to tiktoken's, so nothing is downloaded at run time), counted
  as OpenAI's chat format does: 3 tokens per message plus the tokens of each of its values
  (role, content, tool call id, tool calls' names and arguments), 1 more for a ``name``, and
  3 for the reply's priming. Tool definitions are counted as their JSON text and each image
  part as 85 tokens (a low-detail image); OpenAI does not publish the exact accounting of
  either. The estimate equals OpenAI's ``prompt_tokens`` for text messages.
* **Claude models** (``claude*``): Anthropic publishes no tokenizer. The estimate is the
  ``cl100k_base`` count × :data:`CLAUDE_FACTOR` (1.3), rounded up: Claude's tokenizers
  produce more tokens than cl100k for the same text, and the factor keeps the hold on the
  safe side of that difference.
* **Any other model** (self-hosted, the demo LLM): the rule of thumb of one token per 4
  characters, plus 3 + 4 per message and 85 per image.
* A PDF file part (a Messages API ``document``): 3,000 tokens per page, either way; the
  pages as ``pypdf`` reads the document's page tree (object and cross-reference streams
  included), or as its uncompressed bytes show them, whichever is more (:func:`pdf_pages`).

A text too long for the tokenizer library (over 1,000,000 characters or 200,000 tokens in
one piece) counts as its UTF-8 length in bytes, an upper bound of any byte-level BPE count.
"""
from __future__ import annotations

import base64
import binascii
import functools
import io
import logging
import math
import re
import threading
from decimal import ROUND_CEILING, Decimal
from typing import Any, Iterator

from app.jsonutil import dumps_bytes

O200K, CL100K, CLAUDE, CHARS = "o200k_base", "cl100k_base", "claude", "chars"
CLAUDE_FACTOR = Decimal("1.3")
IMAGE_TOKENS = 85  # one image part (OpenAI's low-detail price; the detail is not known up front)

_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "gpt-oss", "o1", "o3", "o4")
_CL100K_PREFIXES = ("gpt-4", "gpt-3.5", "gpt-35")
_encodings: dict[str, Any] = {}
_lock = threading.Lock()
# what the tokenizer raises beyond its limits; its TokenizerError joins once it is imported
_LIMIT_ERRORS: tuple[type[Exception], ...] = (ValueError,)


def estimator(upstream_model: str) -> str:
    """Which estimator counts prompts for ``upstream_model``: O200K, CL100K, CLAUDE or CHARS.
    A provider prefix (``openai/gpt-4o``) is ignored."""
    name = upstream_model.lower().rsplit("/", 1)[-1]
    if name.startswith(_O200K_PREFIXES):
        return O200K
    if name.startswith(_CL100K_PREFIXES):
        return CL100K
    if name.startswith("claude"):
        return CLAUDE
    return CHARS


def _encoding(name: str):
    enc = _encodings.get(name)
    if enc is None:
        with _lock:  # loading one encoding takes about a second; once per process
            enc = _encodings.get(name)
            if enc is None:
                # imported here, not at the top: the import alone takes about a second
                # (it reads every encoding's special tokens), which every process that
                # loads the app (each `flask` command) would pay without counting a token
                import bpe_openai

                global _LIMIT_ERRORS
                _LIMIT_ERRORS = (bpe_openai.TokenizerError, ValueError)
                enc = _encodings[name] = bpe_openai.get_encoding(name)
    return enc


def load_encodings() -> None:
    """Load both tokenizers now (about 4 s of CPU and ~170 MiB, in the Rust library's heap):
    ``app.preload``, before gunicorn forks."""
    for name in (O200K, CL100K):
        _encoding(name)


def count_text(text: str, encoding: str) -> int:
    """Tokens of ``text`` in ``encoding`` (special-token strings count as plain text)."""
    if not text:
        return 0
    try:
        return len(_encoding(encoding).encode_ordinary(text))
    except _LIMIT_ERRORS:  # beyond the library's limits
        return len(text.encode("utf-8", "surrogatepass"))


def _text_parts(content: Any) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                yield str(part.get("text") or "")


def _images(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if isinstance(p, dict) and p.get("type") in ("image_url", "input_image"))


PDF_PAGE_TOKENS = 3000  # one PDF page: Anthropic's upper figure for a page's text (1,500–3,000), on the safe side
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
_PDF_COUNT = re.compile(rb"/Count\s+(\d{1,6})")  # a page tree's count of the pages below it
# a caller's damaged PDF is no operator's warning: pypdf's own log says only its errors
logging.getLogger("pypdf").setLevel(logging.ERROR)


@functools.lru_cache(maxsize=4)  # a request's estimate runs once per candidate tokenizer
def pdf_pages(data: str) -> int:
    """The pages of a base64 PDF (a data URL or bare base64): what ``pypdf`` reads from its
    page tree — wherever it sits, in compressed object streams too — or, when more (or when
    it cannot read the file), the ``/Type /Page`` objects and the largest ``/Count`` its
    uncompressed bytes show; one at least. The hold is sized on it, so it errs high."""
    try:
        raw = base64.b64decode(data.partition(";base64,")[2] or data, validate=False)
    except (ValueError, binascii.Error):
        raw = b""
    counts = [int(n) for n in _PDF_COUNT.findall(raw)]
    return max(1, len(_PDF_PAGE.findall(raw)), *counts, _pypdf_pages(raw))


def _pypdf_pages(raw: bytes) -> int:
    """The page count ``pypdf`` reads (its own limits on decompression and page-tree cycles
    apply), 0 for what it cannot read (not a PDF, damaged)."""
    from pypdf import PdfReader

    try:
        return len(PdfReader(io.BytesIO(raw), strict=False).pages)
    except Exception:  # noqa: BLE001 - any file pypdf cannot read counts by its bytes
        return 0


def _file_tokens(content: Any) -> int:
    """The estimate of the PDF file parts of ``content`` (OpenAI's ``{"type": "file", "file":
    {"file_data": "data:application/pdf;base64,…"}}``, a Messages API ``document``):
    ``PDF_PAGE_TOKENS`` per page (:func:`pdf_pages`)."""
    if not isinstance(content, list):
        return 0
    total = 0
    for part in content:
        file = part.get("file") if isinstance(part, dict) and part.get("type") == "file" else None
        data = file.get("file_data") if isinstance(file, dict) else None
        if isinstance(data, str):
            total += PDF_PAGE_TOKENS * pdf_pages(data)
    return total


def _values(msg: dict) -> Iterator[str]:
    """The texts of one message that the model reads (role, content, name, tool calls)."""
    yield str(msg.get("role") or "")
    yield from _text_parts(msg.get("content"))
    for key in ("name", "tool_call_id"):
        if msg.get(key):
            yield str(msg[key])
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        yield str(fn.get("name", ""))
        yield str(fn.get("arguments", ""))


def _tools_json(body: dict) -> bytes:
    return dumps_bytes(body["tools"]) if body.get("tools") else b""


def _count_openai(body: dict, encoding: str) -> int:
    total = 3  # every reply is primed with <|start|>assistant<|message|>
    for msg in body["messages"]:
        total += 3 + sum(count_text(v, encoding) for v in _values(msg))
        total += (1 if msg.get("name") else 0) + IMAGE_TOKENS * _images(msg.get("content")) \
            + _file_tokens(msg.get("content"))
    return total + count_text(_tools_json(body).decode(), encoding)


def _count_chars(body: dict) -> int:
    tokens, chars = 3, len(_tools_json(body))
    for msg in body["messages"]:
        content = msg.get("content")
        tokens += 4
        if isinstance(content, list):
            tokens += IMAGE_TOKENS * sum(1 for p in content if isinstance(p, dict) and p.get("type") == "image_url")
            tokens += _file_tokens(content)
        chars += len(" ".join(_text_parts(content)))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            chars += len(str(fn.get("name", ""))) + len(str(fn.get("arguments", "")))
    return tokens + math.ceil(chars / 4)


def estimate_prompt_tokens(body: dict, how: str) -> int:
    """Estimated input tokens of a (validated) chat request ``body`` for the estimator
    ``how`` (see :func:`estimator` and the module docstring)."""
    if how in (O200K, CL100K):
        return _count_openai(body, how)
    if how == CLAUDE:
        return int((_count_openai(body, CL100K) * CLAUDE_FACTOR).to_integral_value(rounding=ROUND_CEILING))
    return _count_chars(body)
