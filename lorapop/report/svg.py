"""Inline-SVG plotting for the run report: line charts with optional bands, and a lineage timeline.

Plain strings in, SVG markup out; no plotting library and nothing fetched at view time, so report.html opens from disk
anywhere. Every drawn series sits in a ``<g class="series">`` with a ``<title>`` (the hover label), and every chart
is an ``<svg class="plot">``: the browser test counts drawn geometry under those classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22", "#393b79", "#ad494a", "#637939", "#843c39", "#7b4173", "#3182bd")
DASHES = ("", "6 3", "2 3", "8 3 2 3")

W, H = 600, 270
ML, MR, MT, MB = 58, 14, 30, 38


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


@dataclass
class Series:
    label: str
    points: list[tuple[float, float | None]]  # (x, y); y None breaks the line
    color: str = PALETTE[0]
    dash: str = ""
    band: list[tuple[float, float, float]] = field(default_factory=list)  # (x, low, high), drawn under the line


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.2g}"
    return f"{v:.4g}"


def nice_ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """At most about ``n`` round ticks in [lo, hi]; ``integer`` ticks are whole numbers (steps: a 2-step run shows
    1 and 2, not 1.2, 1.4, ...)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else [0.0]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    mults = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * mag for m in mults if (hi - lo) / (m * mag) <= n)
    if integer:
        step = max(1, round(step))
    t = math.ceil(lo / step - 1e-9) * step
    out = []
    while t <= hi + step * 1e-9:
        out.append(round(t, 12))
        t += step
    return out


def _segments(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    segs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if _finite(x) and _finite(y):
            segs[-1].append((float(x), float(y)))
        elif segs[-1]:
            segs.append([])
    return [s for s in segs if s]


def _bounds(series: list[Series], y_range: tuple[float, float] | None):
    xs, ys = [], []
    for s in series:
        for seg in _segments(s.points):
            xs += [p[0] for p in seg]
            ys += [p[1] for p in seg]
        for x, lo, hi in s.band:
            if _finite(x) and _finite(lo) and _finite(hi):
                xs.append(x)
                ys += [lo, hi]
    if not xs:
        return None
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y0, y1 = min(ys), max(ys)
    lo, hi = y_range if y_range is not None else (math.inf, -math.inf)
    if max(y1, hi) == min(y0, lo):
        return x0, x1, y0 - (abs(y0) * 0.1 or 1), y1 + (abs(y1) * 0.1 or 1)
    pad = (max(y1, hi) - min(y0, lo)) * 0.05
    # A given range is kept exactly (rates read best on 0..1); data beyond it widens the axis with a margin.
    return x0, x1, (lo if y0 >= lo else y0 - pad), (hi if y1 <= hi else y1 + pad)


def yardstick_series(ys: dict | None, x0: float, x1: float, top: int = 3) -> list[Series]:
    """Dashed grey lines from ``x0`` to ``x1`` at the scores of the ``top`` best trivial strategies of ``ys`` (a
    :func:`lorapop.train.yardsticks.task_yardsticks` result): what answering without reading the program scores."""
    st = (ys or {}).get("strategies") or {}
    best = sorted(st, key=lambda k: -(st[k].get("score") or 0.0))[:top]
    return [Series(f"always {st[k].get('label', k)}: {st[k]['score']:.3f}", [(x0, st[k]["score"]), (x1, st[k]["score"])],
                   color="#555555", dash=("6 3", "2 3", "8 3 2 3")[i % 3]) for i, k in enumerate(best)]


def no_data(title: str, why: str) -> str:
    return (f'<div class="noplot"><div class="ptitle">{escape(title)}</div>'
            f'<div class="why">no data: {escape(why)}</div></div>')


def line_chart(series: list[Series], title: str, *, xlabel: str = "step", ylabel: str = "",
               y_range: tuple[float, float] | None = None, legend: bool = True, why_empty: str = "") -> str:
    """A figure (SVG + HTML legend), or a visible 'no data' box when no series has a finite point."""
    svg = plot_svg(series, title, xlabel=xlabel, ylabel=ylabel, y_range=y_range)
    if svg is None:
        return no_data(title, why_empty or "no finite values")
    leg = ""
    if legend:
        items = "".join(
            f'<span class="li"><svg width="22" height="10"><line x1="0" x2="22" y1="5" y2="5" stroke="{s.color}" '
            f'stroke-width="2.5"{f" stroke-dasharray={chr(34)}{s.dash}{chr(34)}" if s.dash else ""}/></svg>'
            f'{escape(s.label)}</span>' for s in series if _segments(s.points))
        leg = f'<div class="legend">{items}</div>'
    return f'<figure class="chart">{svg}{leg}</figure>'


def plot_svg(series: list[Series], title: str, *, xlabel: str = "step", ylabel: str = "",
             y_range: tuple[float, float] | None = None) -> str | None:
    """The ``<svg class="plot">`` of :func:`line_chart` alone; None when no series has a finite point."""
    b = _bounds(series, y_range)
    if b is None:
        return None
    x0, x1, y0, y1 = b
    pw, ph = W - ML - MR, H - MT - MB
    sx = lambda x: ML + (x - x0) / (x1 - x0) * pw  # noqa: E731
    sy = lambda y: MT + ph - (y - y0) / (y1 - y0) * ph  # noqa: E731
    out = [f'<svg class="plot" viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg" role="img" '
           f'aria-label="{escape(title)}">',
           f'<text x="{W / 2}" y="18" class="ttl" text-anchor="middle">{escape(title)}</text>']
    for t in nice_ticks(y0, y1):
        y = sy(t)
        out.append(f'<line class="grid" x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{ML - 5}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    for t in nice_ticks(x0, x1, 6, integer=xlabel == "step"):
        x = sx(t)
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{MT}" y2="{MT + ph}"/>'
                   f'<text class="tick" x="{x:.1f}" y="{MT + ph + 14}" text-anchor="middle">{_fmt(t)}</text>')
    out.append(f'<rect class="frame" x="{ML}" y="{MT}" width="{pw}" height="{ph}"/>')
    out.append(f'<text class="axl" x="{ML + pw / 2}" y="{H - 4}" text-anchor="middle">{escape(xlabel)}</text>')
    if ylabel:
        out.append(f'<text class="axl" transform="translate(13 {MT + ph / 2}) rotate(-90)" '
                   f'text-anchor="middle">{escape(ylabel)}</text>')
    for s in series:
        band = [(x, lo, hi) for x, lo, hi in s.band if _finite(x) and _finite(lo) and _finite(hi)]
        if len(band) >= 2:
            top = " L".join(f"{sx(x):.1f} {sy(hi):.1f}" for x, _, hi in band)
            bot = " L".join(f"{sx(x):.1f} {sy(lo):.1f}" for x, lo, _ in reversed(band))
            out.append(f'<path class="band" d="M{top} L{bot} Z" fill="{s.color}"/>')
    for s in series:
        segs = _segments(s.points)
        if not segs:
            continue
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        g = [f'<g class="series"><title>{escape(s.label)}</title>']
        for seg in segs:
            if len(seg) == 1:  # an isolated point has no length as a path
                g.append(f'<circle cx="{sx(seg[0][0]):.1f}" cy="{sy(seg[0][1]):.1f}" r="2.5" fill="{s.color}"/>')
            else:
                d = "M" + " L".join(f"{sx(x):.1f} {sy(y):.1f}" for x, y in seg)
                g.append(f'<path d="{d}" stroke="{s.color}"{dash}/>')
        out.append("".join(g) + "</g>")
    out.append("</svg>")
    return "".join(out)


@dataclass
class Life:
    member: str
    role: str
    start: float
    end: float
    died: bool
    operator: str = ""
    parents: tuple[str, ...] = ()


def lineage_timeline(rows: list[list[Life]], row_labels: list[str], title: str, x_max: float,
                     role_colors: dict[str, str]) -> str:
    """One row per population slot; successive occupants as bars; a replacement draws dashed links from the
    child's parents (at the event step) to the child's bar, labelled with the operator."""
    if not rows:
        return no_data(title, "no members in population.json or metrics.jsonl")
    row_h, top, left, right, tw = 24, 30, 130, 20, 2 * W + 14  # as wide as two charts side by side
    h = top + row_h * len(rows) + 30
    pw = tw - left - right
    x_max = max(x_max, 1.0)
    sx = lambda x: left + max(0.0, min(x, x_max)) / x_max * pw  # noqa: E731
    where = {life.member: (i, life) for i, row in enumerate(rows) for life in row}
    out = [f'<svg class="plot lineage" viewBox="0 0 {tw} {h}" xmlns="http://www.w3.org/2000/svg" role="img" '
           f'aria-label="{escape(title)}">',
           f'<text x="{tw / 2}" y="18" class="ttl" text-anchor="middle">{escape(title)}</text>']
    for t in nice_ticks(0, x_max, 8, integer=True):
        x = sx(t)
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top - 4}" y2="{h - 26}"/>'
                   f'<text class="tick" x="{x:.1f}" y="{h - 12}" text-anchor="middle">{_fmt(t)}</text>')
    for i, (row, label) in enumerate(zip(rows, row_labels)):
        y = top + i * row_h
        out.append(f'<text class="tick" x="{left - 8}" y="{y + 16}" text-anchor="end">{escape(label)}</text>')
        for life in row:
            x0, x1 = sx(life.start), sx(life.end)
            c = role_colors.get(life.role, "#7f7f7f")
            tip = f"{life.member} ({life.role}): steps {_fmt(life.start)}-{_fmt(life.end)}"
            if life.operator:
                tip += f", born by {life.operator} from {', '.join(life.parents) or '?'}"
            if life.died:
                tip += ", replaced"
            out.append(f'<g class="series"><title>{escape(tip)}</title><rect x="{x0:.1f}" y="{y + 4}" '
                       f'width="{max(x1 - x0, 2):.1f}" height="{row_h - 8}" rx="3" fill="{c}" fill-opacity="0.75" '
                       'stroke="#fff" stroke-width="2"/>')
            if x1 - x0 > 8 * len(life.member) + 6:
                out.append(f'<text class="barl" x="{x0 + 4:.1f}" y="{y + 17}">{escape(life.member)}</text>')
            out.append("</g>")
    for row_i, row in enumerate(rows):
        for life in row:
            if not life.operator:
                continue
            cx, cy = sx(life.start), top + row_i * row_h + row_h / 2
            for p in life.parents:
                if p in where:
                    py = top + where[p][0] * row_h + row_h / 2
                    out.append(f'<path class="link" d="M{cx:.1f} {py:.1f} L{cx:.1f} {cy:.1f}"/>'
                               f'<circle cx="{cx:.1f}" cy="{py:.1f}" r="3" class="linkdot"/>')
            out.append(f'<text class="opl" x="{cx + 3:.1f}" y="{cy - 7:.1f}">{escape(life.operator)}</text>')
    out.append("</svg>")
    leg = "".join(f'<span class="li"><svg width="14" height="10"><rect width="14" height="10" fill="{c}"/></svg>'
                  f'{escape(r)}</span>' for r, c in role_colors.items())
    return f'<figure class="chart wide">{"".join(out)}<div class="legend">{leg}</div></figure>'


# The report's chart styles, for an SVG that stands alone (a committed figure, an image in a README).
SVG_CSS = (".ttl{font:600 13px sans-serif}.tick{font:10px sans-serif;fill:#555}.axl{font:11px sans-serif;fill:#333}"
           ".grid{stroke:#e6e6e6;stroke-width:1}.frame{fill:none;stroke:#999;stroke-width:1}"
           ".series path{fill:none;stroke-width:1.8}.band{fill-opacity:.15;stroke:none}.lg{font:12px sans-serif}")


def figure_svg(plots: list[tuple[str, str | None]], cols: int, legend: list[Series] | None = None,
               title: str = "") -> str:
    """One standalone SVG of ``(title, plot)`` panels on a grid of ``cols`` columns (a plot from :func:`plot_svg`;
    None draws the titled panel empty, so the grid keeps its places), with an optional title and a legend drawn
    from ``legend``'s labels, colours and dashes, wrapped onto as many lines as the figure's width needs."""
    rows = -(-len(plots) // cols) if plots else 0
    width = cols * W
    places, x, line = [], ML, 0  # (line, x) of each legend entry
    for s in legend or []:
        step = 36 + 7 * len(s.label)
        if x > ML and x + step - 10 > width:
            x, line = ML, line + 1
        places.append((line, x))
        x += step
    top = (24 if title else 0) + (22 + 18 * line if legend else 0)
    height = top + rows * H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
           f"<style>{SVG_CSS}</style>", f'<rect width="{width}" height="{height}" fill="#fff"/>']
    if title:
        out.append(f'<text x="{width / 2}" y="17" class="ttl" text-anchor="middle">{escape(title)}</text>')
    for s, (line, x) in zip(legend or [], places):
        y = (24 if title else 0) + 12 + 18 * line
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(f'<line x1="{x}" x2="{x + 22}" y1="{y}" y2="{y}" stroke="{s.color}" stroke-width="2.5"{dash}/>'
                   f'<text class="lg" x="{x + 26}" y="{y + 4}">{escape(s.label)}</text>')
    for i, (name, p) in enumerate(plots):
        px, py = (i % cols) * W, top + (i // cols) * H
        if p is None:
            p = (f'<svg class="plot"><text x="{W / 2}" y="18" class="ttl" text-anchor="middle">{escape(name)}</text>'
                 f'<text x="{W / 2}" y="{H / 2}" class="axl" text-anchor="middle">no data</text></svg>')
        out.append(p.replace('<svg class="plot"', f'<svg class="plot" x="{px}" y="{py}" width="{W}" height="{H}"', 1))
    out.append("</svg>")
    return "\n".join(out)
