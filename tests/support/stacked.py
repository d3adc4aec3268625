"""The console's phone layout rule, checked on a page's HTML: at 600 px and narrower a
``table.stack`` cell is a two-column grid (its ``data-label``, then its content), so its
content must be ONE grid item. A cell holding text beside an element, or two elements,
puts the second piece under the label, in the label's column (an alert's "$5.00" under
"Condition", an agent's Disable button under "Fund")."""
from __future__ import annotations

from html.parser import HTMLParser

VOID = {"br", "input", "img", "hr", "meta", "link", "wbr"}


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack_depth = 0   # inside a table.stack
        self.cell = None       # (label, [top-level items]) of the open cell
        self.depth = 0         # element depth inside the open cell
        self.bad: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "stack" in (a.get("class") or "").split():
            self.stack_depth += 1
        if self.stack_depth and tag == "td" and "data-label" in a and "actions" not in (a.get("class") or ""):
            self.cell, self.depth = (a["data-label"], []), 0
            return
        if self.cell is not None:
            if self.depth == 0:
                self.cell[1].append(tag)
            if tag not in VOID:
                self.depth += 1

    def handle_endtag(self, tag):
        if self.cell is not None and tag == "td" and self.depth == 0:
            if len(self.cell[1]) > 1:
                self.bad.append(f"{self.cell[0]}: {self.cell[1]}")
            self.cell = None
        elif self.cell is not None and tag not in VOID:
            self.depth -= 1
        if tag == "table" and self.stack_depth:
            self.stack_depth -= 1

    def handle_data(self, data):
        if self.cell is not None and self.depth == 0 and data.strip():
            self.cell[1].append("text")


def split_cells(html: str) -> list[str]:
    """The stacked cells whose content is more than one grid item: ``"label: [items]"``."""
    parser = _Cells()
    parser.feed(html)
    return parser.bad
