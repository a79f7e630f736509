"""Inline SVG line charts: no JavaScript, no fonts or files to fetch.

A chart is lines (x, y arrays), shaded bands (x, low, high) and vertical markers
(onset, detection, resolution). Each line is thinned to at most ``MAX_POINTS``
points, so a page stays small whatever the number of samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

import numpy as np

MAX_POINTS = 600
W, H = 860, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 40, 34
CHAR_W = 6.6        # width of one 11 px tick-label character, a little over the widest digit
Y_LABEL_X = 13      # the rotated y-axis label's centre line; its text reaches ~7 px right


@dataclass
class Line:
    x: np.ndarray
    y: np.ndarray
    label: str
    color: str = "#555"
    width: float = 1.5
    dash: str = ""
    legend: bool = True
    dots: bool = False          # also mark each point (few points, e.g. incident updates)


@dataclass
class Band:
    x: np.ndarray
    low: np.ndarray
    high: np.ndarray
    label: str
    color: str = "#9bb7d4"


@dataclass
class Marker:
    x: float
    label: str
    color: str = "#444"


@dataclass
class Chart:
    title: str
    x_label: str
    y_label: str
    lines: list[Line] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    step: bool = False          # draw lines as steps (a value holds until the next)
    y_max: float | None = None  # clip above (a warm-up spike would flatten the rest)


def _thin(x: np.ndarray, *ys: np.ndarray) -> tuple[np.ndarray, ...]:
    """At most MAX_POINTS points: the min and max of each bucket, so spikes survive."""
    n = len(x)
    if n <= MAX_POINTS:
        return (x, *ys)
    buckets = MAX_POINTS // 2
    edges = np.linspace(0, n, buckets + 1).astype(int)
    keep: list[int] = []
    ref = ys[0]
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if b <= a:
            continue
        seg = ref[a:b]
        if np.all(np.isnan(seg)):
            keep.append(a)
            continue
        lo, hi = a + int(np.nanargmin(seg)), a + int(np.nanargmax(seg))
        keep.extend(sorted({lo, hi}))
    idx = np.array(keep)
    return (x[idx], *(y[idx] for y in ys))


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _fmt(v: float) -> str:
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-2):
        return f"{v:.2g}"
    return f"{v:.4g}"


def _finite(a: np.ndarray) -> np.ndarray:
    return a[np.isfinite(a)]


def render(chart: Chart, width: int = W, height: int = H) -> str:
    """The chart as an ``<svg>`` element (a string)."""
    xs = [_finite(ln.x) for ln in chart.lines] + [_finite(b.x) for b in chart.bands]
    ys = ([_finite(ln.y) for ln in chart.lines] + [_finite(b.low) for b in chart.bands]
          + [_finite(b.high) for b in chart.bands])
    xs = [a for a in xs if a.size]
    ys = [a for a in ys if a.size]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" class="chart" role="img">',
           f'<title>{escape(chart.title)}</title>',
           f'<text x="{LEFT}" y="15" class="ct">{escape(chart.title)}</text>']
    if not xs or not ys:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="nd">'
                   'no data in this range</text></svg>')
        return "".join(out)
    x0 = min(float(a.min()) for a in xs)
    x1 = max(float(a.max()) for a in xs)
    for m in chart.markers:
        x0, x1 = min(x0, m.x), max(x1, m.x)
    y0 = min(float(a.min()) for a in ys)
    y1 = max(float(a.max()) for a in ys)
    if chart.y_max is not None and y0 < chart.y_max < y1:
        y1 = chart.y_max
    pad = (y1 - y0) * 0.08 or abs(y1) * 0.1 or 1.0
    y0, y1 = (0.0 if y0 >= 0 and y0 - pad < 0 else y0 - pad), y1 + pad
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    y_ticks = [(t, _fmt(t)) for t in _ticks(y0, y1)]
    # Wide tick labels (0.0008, -1.5e+05) push the plot right instead of running into the
    # rotated y-axis label.
    left = max(LEFT, int(Y_LABEL_X + 8 + 5 + CHAR_W * max(len(t) for _, t in y_ticks)) + 1)
    pw, ph = width - left - RIGHT, height - TOP - BOTTOM

    def px(v: np.ndarray) -> np.ndarray:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: np.ndarray) -> np.ndarray:
        return TOP + ph - (np.minimum(v, y1) - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{left}" y="{TOP}" width="{pw}" height="{ph}" class="pa"/>')
    for t, label in y_ticks:
        y = float(py(np.array(t)))
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="gr"/>'
                   f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end" class="tk">'
                   f'{label}</text>')
    for t in _ticks(x0, x1, 8):
        x = float(px(np.array(t)))
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 15}" text-anchor="middle" class="tk">'
                   f'{_fmt(t)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 3}" text-anchor="middle" class="ax">'
               f'{escape(chart.x_label)}</text>'
               f'<text transform="translate({Y_LABEL_X} {TOP + ph / 2}) rotate(-90)" '
               f'text-anchor="middle" class="ax">{escape(chart.y_label)}</text>')
    for b in chart.bands:
        bx, lo, hi = _thin(b.x, b.low, b.high)
        ok = np.isfinite(lo) & np.isfinite(hi)
        if ok.sum() < 2:
            continue
        top = _points(px(bx[ok]), py(hi[ok]))
        bottom = _points(px(bx[ok][::-1]), py(lo[ok][::-1]))
        out.append(f'<polygon points="{top} {bottom}" fill="{b.color}" fill-opacity="0.45" '
                   'stroke="none"/>')
    labels = []
    for i, m in enumerate(sorted(chart.markers, key=lambda m: m.x)):
        x = float(px(np.array(m.x)))
        # labels step down one line each, so close markers stay readable
        right = x > left + pw - 7 * len(m.label) - 6
        tx, anchor = (x - 3, "end") if right else (x + 3, "start")
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + ph}" '
                   f'stroke="{m.color}" stroke-dasharray="4 3"/>')
        # drawn after the data, on a white halo: a line crossing a label leaves it readable
        labels.append(f'<text x="{tx:.1f}" y="{TOP + 11 + 12 * (i % 3)}" '
                      f'text-anchor="{anchor}" class="mk" fill="{m.color}" stroke="#fff" '
                      f'stroke-width="3" paint-order="stroke">{escape(m.label)}</text>')
    for ln in chart.lines:
        ok = np.isfinite(ln.x) & np.isfinite(ln.y)
        lx, ly = _thin(ln.x[ok], ln.y[ok])
        if not lx.size:
            continue
        dash = f' stroke-dasharray="{ln.dash}"' if ln.dash else ""
        if ln.dots:
            out.extend(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.2" fill="{ln.color}"/>'
                       for a, b in zip(px(lx).tolist(), py(ly).tolist(), strict=True))
        if chart.step and lx.size > 1:
            lx, ly = np.repeat(lx, 2)[1:], np.repeat(ly, 2)[:-1]
        out.append(f'<polyline points="{_points(px(lx), py(ly))}" fill="none" '
                   f'stroke="{ln.color}" stroke-width="{ln.width}"{dash}/>')
    out.extend(labels)
    out.append(_legend(chart, width))
    out.append("</svg>")
    return "".join(out)


def _points(x: np.ndarray, y: np.ndarray) -> str:
    return " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(x.tolist(), y.tolist(), strict=True))


def _legend(chart: Chart, width: int) -> str:
    items = [(b.label, b.color, 8.0) for b in chart.bands]
    items += [(ln.label, ln.color, ln.width) for ln in chart.lines if ln.legend]
    parts, x = [], width - RIGHT
    for label, color, w in reversed(items):
        x -= 7 * len(label) + 28
        parts.append(f'<line x1="{x}" x2="{x + 16}" y1="27" y2="27" stroke="{color}" '
                     f'stroke-width="{max(w, 2.5)}"/><text x="{x + 20}" y="31" class="lg">'
                     f'{escape(label)}</text>')
    return "".join(parts)
