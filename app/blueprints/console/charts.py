"""Server-side SVG charts for the console: plain numbers in, shapes out (the template
draws them; no script, no inline style, so the strict CSP holds)."""
from __future__ import annotations

from dataclasses import dataclass

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM = 720, 200, 84, 24


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    label: str  # tooltip text (<title>)


def _nice_max(value: float) -> float:
    """A round axis maximum ≥ value (1, 2, 5 × 10^n)."""
    if value <= 0:
        return 1.0
    step = 1.0
    while step * 10 <= value:
        step *= 10
    while step < 1 and step * 10 <= value:
        step *= 10
    for m in (1, 2, 5, 10):
        if m * step >= value:
            return m * step
    return 10 * step


def bars(days: list[dict], key: str, fmt, *, empty_top: float = 1.0, whole: bool = False) -> dict:
    """Bars of ``days[i][key]`` over the chart area, the axis maximum and its label, and
    sparse x labels (first, middle, last date). ``fmt`` formats a value for labels;
    ``empty_top``: the axis maximum of an empty chart (a chart of $0.000123 keeps its
    own $0.0002 scale: its bar stays visible); ``whole``: a count, so
    both axis labels are whole numbers (a maximum of 1 or 5 becomes 2 or 10: no "0.5")."""
    top = _nice_max(max((float(d[key]) for d in days), default=0.0) or empty_top)
    if whole and (top < 2 or top % 2):
        top = max(2.0, top * 2)
    n = max(len(days), 1)
    slot = (WIDTH - PAD_LEFT) / n
    plot_h = HEIGHT - PAD_BOTTOM - 8
    out = []
    for i, d in enumerate(days):
        h = plot_h * float(d[key]) / top
        out.append(Bar(x=round(PAD_LEFT + i * slot + slot * 0.15, 2), y=round(8 + plot_h - h, 2),
                       w=round(slot * 0.7, 2), h=round(h, 2),
                       label=f"{d['date'].isoformat()}: {fmt(d[key])}"))
    picks = sorted({0, n // 2, n - 1}) if days else []
    xlabels = [{"x": round(PAD_LEFT + i * slot + slot / 2, 2), "text": days[i]["date"].strftime("%b %d"),
                "anchor": "start" if i == 0 and n > 1 else "end" if i == n - 1 and n > 1 else "middle"}
               for i in picks]
    return {"bars": out, "top": fmt(top), "mid": fmt(top / 2), "xlabels": xlabels,
            "width": WIDTH, "height": HEIGHT, "left": PAD_LEFT, "base": HEIGHT - PAD_BOTTOM,
            "midy": 8 + plot_h / 2, "empty": not any(float(d[key]) for d in days)}


def meter(used: float, limit: float, width: int = 300) -> dict:
    """A horizontal usage bar: filled width and whether the limit is passed."""
    frac = 0.0 if limit <= 0 else min(used / limit, 1.0)
    return {"width": width, "fill": round(width * frac, 1), "over": limit > 0 and used >= limit,
            "percent": 0 if limit <= 0 else round(100 * used / limit)}


def count_fmt(n) -> str:
    n = float(n)
    return f"{int(n):,}" if n == int(n) else f"{n:.1f}"
