"""Small inline-SVG charts for the HTML report: no JavaScript, no network, no plotting library.

Each function returns one ``<svg>`` element as a string, with every label escaped, ready to be
placed in a page. Charts: horizontal bars with error bars (speedup per shape), a scatter with a
best-so-far step line (search progress), a log-log roofline, and grouped bars (compare pages).
"""

from __future__ import annotations

import hashlib
import math
from html import escape
from typing import Iterable, Sequence

from kernelforge.report.records import ProgressPoint

#: Colours of candidate origins (also used by the HTML legend).
ORIGIN_COLOURS = {
    "baseline": "#6b7280",
    "auto": "#1d4ed8",
    "optuna": "#2563eb",
    "grid": "#0d9488",
    "llm": "#ea580c",
    "manual": "#9333ea",
}
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"


def origin_colour(origin: str) -> str:
    """The colour of a candidate origin (dark grey for an unknown one)."""
    return ORIGIN_COLOURS.get(origin, "#111827")


def si(value: float, unit: str = "") -> str:
    """A number with an SI prefix: 4.3e12 -> "4.3 T" (+ unit)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g} {unit}".strip()
    exp = int(math.floor(math.log10(abs(value)) / 3))
    exp = max(-4, min(5, exp))
    prefix = {-4: "p", -3: "n", -2: "u", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P"}[exp]
    scaled = value / 10 ** (3 * exp)
    text = f"{scaled:.3g}"
    return f"{text} {prefix}{unit}".strip()


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    value = start
    while value <= hi + step * 1e-9:
        if value >= lo - step * 1e-9:
            ticks.append(round(value, 12))
        value += step
    return ticks


CHAR_PX = 8.0  # a generous width of one character at 12px (sans-serif renders 6-7.5): labels are cut to stay inside the chart


def fit(text: str, px: float, char_px: float = CHAR_PX) -> str:
    """``text`` cut with an ellipsis to about ``px`` pixels (the full text stays in the chart's title)."""
    most = max(1, int(px / char_px))
    return text if len(text) <= most else text[:max(1, most - 1)] + "\u2026"


def _heading(x: float, y: float, title: str, width: int) -> str:
    """The chart's bold title line, cut to the chart's width."""
    return f'<text x="{x}" y="{y}" font-weight="600">{escape(fit(title, width - x - 8, 7.6))}</text>'


def _open(width: int, height: int, label: str) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" style="{FONT};font-size:12px">',
            f"<title>{escape(label)}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']


def speedup_bars(rows: Sequence[tuple[str, float | None, float | None, float | None, str]], title: str,
                 width: int = 900) -> str:
    """Horizontal bars of speedup per shape with p20-p80 error bars and a line at 1x (the baseline).

    ``rows``: (label, speedup, p20, p80, colour); a None speedup draws "no result".
    """
    label_w = min(300, 16 + CHAR_PX * max((len(r[0]) for r in rows), default=10))
    bar_h, gap, top, bottom = 22, 8, 30, 40
    height = top + bottom + len(rows) * (bar_h + gap)
    plot_w = width - label_w - 70
    values = [v for r in rows for v in r[1:4] if v is not None]
    hi = max([1.0, *values]) * 1.1
    ticks = nice_ticks(0.0, hi, 5)
    hi = max(hi, ticks[-1])

    def x(v: float) -> float:
        return label_w + plot_w * v / hi

    out = _open(width, height, title)
    out.append(_heading(8, 16, title, width))
    axis_y = top + len(rows) * (bar_h + gap)
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{top - 4}" x2="{x(t):.1f}" y2="{axis_y}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#374151">{t:g}x</text>')
    for i, (label, value, low, high, colour) in enumerate(rows):
        y = top + i * (bar_h + gap)
        out.append(f'<text x="{label_w - 8}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(fit(label, label_w - 12))}</text>')
        if value is None:
            out.append(f'<text x="{label_w + 4}" y="{y + bar_h * 0.7:.1f}" fill="#9ca3af">no result</text>')
            continue
        tip = f"{label}: {value:.3f}x" + (f" (p20-p80 {low:.3f}-{high:.3f})" if low is not None and high is not None else "")
        out.append(f'<rect x="{label_w}" y="{y}" width="{max(0.5, x(value) - label_w):.1f}" height="{bar_h}" '
                   f'fill="{colour}" fill-opacity="0.75"><title>{escape(tip)}</title></rect>')
        if low is not None and high is not None:
            cy = y + bar_h / 2
            out.append(f'<line x1="{x(low):.1f}" y1="{cy}" x2="{x(high):.1f}" y2="{cy}" stroke="#111827" stroke-width="1.5"/>')
            for v in (low, high):
                out.append(f'<line x1="{x(v):.1f}" y1="{cy - 6}" x2="{x(v):.1f}" y2="{cy + 6}" stroke="#111827" stroke-width="1.5"/>')
        end = max(x(value), x(high) if high is not None else 0)
        out.append(f'<text x="{end + 6:.1f}" y="{y + bar_h * 0.7:.1f}" fill="#111827">{value:.3f}x</text>')
    out.append(f'<line x1="{x(1.0):.1f}" y1="{top - 4}" x2="{x(1.0):.1f}" y2="{axis_y + 4}" stroke="#dc2626" '
               'stroke-width="1.5" stroke-dasharray="5,3"/>')
    out.append(f'<text x="{x(1.0):.1f}" y="{axis_y + 30}" text-anchor="middle" fill="#dc2626" font-size="11">'
               'baseline</text>')
    out.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + plot_w}" y2="{axis_y}" stroke="#6b7280"/>')
    out.append("</svg>")
    return "\n".join(out)


def progress_chart(points: Sequence[ProgressPoint], best: Sequence[tuple[int, float]], title: str, width: int = 900,
                   height: int = 300) -> str:
    """Speedup of every evaluation in order (points coloured by origin, failures as crosses on the
    floor) and the best-so-far speedup as a step line.

    ``points``: one per evaluation (``speedup`` None for a failed candidate).
    ``best``: (index, best speedup so far) after each evaluation.
    """
    left, right, top, bottom = 56, 20, 30, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [p.speedup for p in points if p.speedup is not None] + [b for _, b in best] + [1.0]
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or 0.1
    lo, hi = max(0.0, lo - pad), hi + pad
    ticks = nice_ticks(lo, hi, 5)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    n = max(1, max((p.index for p in points), default=0))

    def x(i: float) -> float:
        return left + plot_w * (i / n if n else 0.5)

    def y(v: float) -> float:
        return top + plot_h * (1 - (v - lo) / (hi - lo))

    out = _open(width, height, title)
    out.append(_heading(8, 18, title, width))
    for t in ticks:
        out.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{left + plot_w}" y2="{y(t):.1f}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end" fill="#374151">{t:g}x</text>')
    for t in nice_ticks(0, n, min(10, n)):
        if float(t).is_integer():
            out.append(f'<text x="{x(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle" fill="#374151">{int(t)}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" fill="#374151">'
               'evaluation (in the order they were stored)</text>')
    out.append(f'<line x1="{left}" y1="{y(1.0):.1f}" x2="{left + plot_w}" y2="{y(1.0):.1f}" stroke="#dc2626" '
               'stroke-dasharray="5,3"/>')
    if best:
        path = [f"M{x(best[0][0]):.1f},{y(best[0][1]):.1f}"]
        for (i0, v0), (i1, v1) in zip(best, best[1:]):
            path.append(f"L{x(i1):.1f},{y(v0):.1f}L{x(i1):.1f},{y(v1):.1f}")
        out.append(f'<path d="{"".join(path)}" fill="none" stroke="#111827" stroke-width="2"/>')
    for p in points:
        colour = origin_colour(p.origin)
        tip = escape(p.label)
        if p.speedup is None:
            cx, cy = x(p.index), top + plot_h - 4
            out.append(f'<path d="M{cx - 4:.1f},{cy - 4:.1f}L{cx + 4:.1f},{cy + 4:.1f}M{cx - 4:.1f},{cy + 4:.1f}'
                       f'L{cx + 4:.1f},{cy - 4:.1f}" stroke="{colour}" stroke-width="2"><title>{tip}</title></path>')
        else:
            out.append(f'<circle cx="{x(p.index):.1f}" cy="{y(p.speedup):.1f}" r="5" fill="{colour}" '
                       f'stroke="#ffffff"><title>{tip}</title></circle>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#6b7280"/>')
    out.append("</svg>")
    return "\n".join(out)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Decades; with 1-2-5 steps when the range spans fewer than three decades."""
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    steps = (1, 2, 5) if math.log10(hi / lo) < 3 else (1,)
    return [m * 10.0 ** e for e in decades for m in steps]


def roofline_chart(points: Sequence[dict], ceilings: Iterable[tuple[str, float, float, str]], title: str,
                   width: int = 760, height: int = 420, unit_note: str = "") -> str:
    """Log-log roofline: achieved FLOP/s against arithmetic intensity (FLOP/byte).

    ``points``: dicts with ``intensity``, ``flops_rate``, ``kind`` ("baseline" or "winner"),
    ``label`` and ``number`` (printed beside the point; the table lists the shape for each number).
    ``ceilings``: (name, bandwidth B/s, peak FLOP/s, dash pattern or "") drawn as min(peak, bw x I).
    An empty ``ceilings`` draws the points only (no hardware ceiling applies).
    """
    ceilings = list(ceilings)
    left, right, top, bottom = 70, 150, 30, 46
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [p["intensity"] for p in points if p.get("intensity")]
    ys = [p["flops_rate"] for p in points if p.get("flops_rate")]
    for _, bw, peak, _ in ceilings:
        xs.append(peak / bw)
        ys.append(peak)
    if not xs or not ys:
        return ""
    x_lo, x_hi = min(xs) / 3, max(xs) * 3
    y_lo = min(ys + [bw * x_lo for _, bw, _, _ in ceilings]) / 3
    y_hi = max(ys) * 3
    lx0, lx1, ly0, ly1 = (math.log10(v) for v in (x_lo, x_hi, y_lo, y_hi))

    def x(v: float) -> float:
        return left + plot_w * (math.log10(v) - lx0) / (lx1 - lx0)

    def y(v: float) -> float:
        return top + plot_h * (1 - (math.log10(v) - ly0) / (ly1 - ly0))

    out = _open(width, height, title)
    out.append(_heading(8, 18, title, width))
    for t in _log_ticks(x_lo, x_hi):
        if x_lo <= t <= x_hi:
            out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{top + plot_h}" stroke="#e5e7eb"/>')
            out.append(f'<text x="{x(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle" fill="#374151">{t:g}</text>')
    for t in _log_ticks(y_lo, y_hi):
        if y_lo <= t <= y_hi:
            out.append(f'<line x1="{left}" y1="{y(t):.1f}" x2="{left + plot_w}" y2="{y(t):.1f}" stroke="#e5e7eb"/>')
            out.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end" fill="#374151">{si(t)}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle" fill="#374151">'
               'arithmetic intensity (FLOP / byte, stored counts)</text>')
    out.append(f'<text transform="translate(14,{top + plot_h / 2}) rotate(-90)" text-anchor="middle" fill="#374151">'
               f'{escape(fit("achieved FLOP/s" + unit_note, plot_h))}</text>')
    clip = "clip" + hashlib.sha1(title.encode("utf-8")).hexdigest()[:10]  # unique per page
    out.append(f'<clipPath id="{clip}"><rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/></clipPath>')
    for i, (name, bw, peak, dash) in enumerate(ceilings):
        ridge = peak / bw
        pts = [(x_lo, bw * x_lo), (ridge, peak), (x_hi, peak)] if ridge > x_lo else [(x_lo, peak), (x_hi, peak)]
        d = "M" + "L".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts if a <= x_hi)
        style = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<path d="{d}" fill="none" stroke="#b91c1c" stroke-width="2"{style} clip-path="url(#{clip})">'
                   f'<title>{escape(name)}</title></path>')
        ly = top + 14 + 16 * i
        out.append(f'<line x1="{left + plot_w + 10}" y1="{ly - 4}" x2="{left + plot_w + 34}" y2="{ly - 4}" '
                   f'stroke="#b91c1c" stroke-width="2"{style}/>')
        out.append(f'<text x="{left + plot_w + 38}" y="{ly}" font-size="11">{escape(fit(name, right - 42, 6.5))}</text>')
    legend_y = top + 14 + 16 * len(ceilings) + 8
    for j, (kind, colour) in enumerate((("baseline", "#6b7280"), ("winner", "#2563eb"))):
        ly = legend_y + 16 * j
        out.append(f'<circle cx="{left + plot_w + 22}" cy="{ly - 4}" r="5" fill="{colour}"/>')
        out.append(f'<text x="{left + plot_w + 38}" y="{ly}" font-size="11">{kind}</text>')
    for p in points:
        if not p.get("intensity") or not p.get("flops_rate"):
            continue
        colour = "#6b7280" if p["kind"] == "baseline" else "#2563eb"
        if p.get("suspect"):
            colour = "#dc2626"
        cx, cy = x(p["intensity"]), y(p["flops_rate"])
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colour}" fill-opacity="0.85" stroke="#ffffff">'
                   f'<title>{escape(p.get("label", ""))}</title></circle>')
        if p.get("number") is not None:
            dx = 7 if p["kind"] == "winner" else -7
            anchor = "start" if p["kind"] == "winner" else "end"
            out.append(f'<text x="{cx + dx:.1f}" y="{cy - 6:.1f}" text-anchor="{anchor}" font-size="10" '
                       f'fill="{colour}">{p["number"]}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#6b7280"/>')
    out.append("</svg>")
    return "\n".join(out)


def grouped_bars(labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float | None]]], title: str,
                 width: int = 760) -> str:
    """Horizontal grouped bars (one group per label, one bar per series) with a line at 1x.

    ``series``: (name, colour, values aligned with ``labels``).
    """
    label_w = min(300, 16 + CHAR_PX * max((len(label) for label in labels), default=10))
    bar_h, gap, top, bottom = 14, 10, 40, 34
    group_h = bar_h * len(series) + gap
    height = top + bottom + len(labels) * group_h
    plot_w = width - label_w - 70
    values = [v for _, _, vs in series for v in vs if v is not None]
    hi = max([1.0, *values]) * 1.1
    ticks = nice_ticks(0.0, hi, 5)
    hi = max(hi, ticks[-1])

    def x(v: float) -> float:
        return label_w + plot_w * v / hi

    out = _open(width, height, title)
    out.append(_heading(8, 16, title, width))
    for k, (name, colour, _) in enumerate(series):
        out.append(f'<rect x="{label_w + 150 * k}" y="24" width="12" height="10" fill="{colour}"/>')
        out.append(f'<text x="{label_w + 150 * k + 16}" y="33" font-size="11">{escape(name[:22])}</text>')
    axis_y = top + len(labels) * group_h
    for t in ticks:
        out.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{axis_y}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#374151">{t:g}x</text>')
    for i, label in enumerate(labels):
        y0 = top + i * group_h
        out.append(f'<text x="{label_w - 8}" y="{y0 + bar_h * len(series) / 2 + 4:.1f}" text-anchor="end">{escape(fit(label, label_w - 12))}</text>')
        for k, (name, colour, vs) in enumerate(series):
            v = vs[i]
            y = y0 + k * bar_h
            if v is None:
                out.append(f'<text x="{label_w + 4}" y="{y + bar_h - 3}" font-size="10" fill="#9ca3af">-</text>')
                continue
            out.append(f'<rect x="{label_w}" y="{y}" width="{max(0.5, x(v) - label_w):.1f}" height="{bar_h - 2}" '
                       f'fill="{colour}"><title>{escape(f"{name}: {label}: {v:.3f}x")}</title></rect>')
            out.append(f'<text x="{x(v) + 4:.1f}" y="{y + bar_h - 4}" font-size="10">{v:.3f}x</text>')
    out.append(f'<line x1="{x(1.0):.1f}" y1="{top - 2}" x2="{x(1.0):.1f}" y2="{axis_y}" stroke="#dc2626" '
               'stroke-dasharray="5,3"/>')
    out.append("</svg>")
    return "\n".join(out)
