"""Documentation links: every relative link in README.md, docs/*.md and bench/*.md (the
bench's README and its run diary) resolves to a file
or directory of the repository, and every ``#anchor`` to a heading of the target document
(GitHub's heading slugs). External links (http, https, mailto) are not fetched."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are not links)."""
    return _CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return _LINK.findall(_prose(path.read_text(encoding="utf-8")))


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of ``path`` that does not resolve inside ``root``, as
    ``target (reason)``."""
    out = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            out.append(f"{target} (no such file)")
            continue
        try:
            dest.relative_to(root)
        except ValueError:
            out.append(f"{target} (outside the repository)")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target} (no heading #{anchor} in {dest.relative_to(root)})")
    return out


def test_docs_exist():
    assert (ROOT / "README.md").is_file()
    assert len([p for p in DOCS if p.parent.name == "docs"]) >= 5


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    assert broken_links(doc) == []


def test_checker_reports_broken_links(tmp_path):
    """The checker itself: a missing file, a missing anchor and a link out of the tree are
    reported; code spans, external links and good links are not."""
    (tmp_path / "other.md").write_text("# Other\n\n## A section: `x`\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\n"
        "[ok](other.md) [ok anchor](other.md#a-section-x) [self](#title) [web](https://example.com)\n"
        "`[in code](missing.md)`\n\n```\n[in fence](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad self](#nope)\n",
        encoding="utf-8")
    (tmp_path / "repo" / "docs").mkdir(parents=True)
    (tmp_path / "repo" / "docs" / "up.md").write_text("[out](../../outside.md)\n", encoding="utf-8")
    assert broken_links(doc, tmp_path) == ["missing.md (no such file)",
                                           "other.md#nope (no heading #nope in other.md)",
                                           "#nope (no heading #nope in doc.md)"]
    (tmp_path / "outside.md").write_text("# Out\n", encoding="utf-8")
    assert broken_links(tmp_path / "repo" / "docs" / "up.md", tmp_path / "repo") == [
        "../../outside.md (outside the repository)"]


def test_slug_matches_github():
    assert slug("Trace 1: `POST /v1/module/{slug}/call`") == "trace-1-post-v1moduleslugcall"
    assert slug("Try it locally: `make serve`") == "try-it-locally-make-serve"
    assert slug("Newsletter (double opt-in, RFC 8058)") == "newsletter-double-opt-in-rfc-8058"
