"""A Grafana dashboard's panels drawn as one SVG, in its dark theme: rows, stats, time series.

Laid out by each panel's ``gridPos`` as Grafana does (24 columns, 30 px rows, 8 px
margins); units, thresholds, stacking and legends from the panel's own JSON. Only what
``deploy/grafana/dashboards/resumable-gateway.json`` uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

WIDTH = 1400
MARGIN = 8  # between panels, as Grafana's grid
CELL_HEIGHT = 30
HEADER = 76  # the dashboard's title bar and caption
LEGEND_CHAR = 6.8  # px per character of an 11 px legend, roughly, in common sans fonts
FONT = "Inter, 'Helvetica Neue', Arial, sans-serif"

BACKGROUND = "#111217"
PANEL = "#181b1f"
BORDER = "#2c3036"
TEXT = "#ccccdc"
MUTED = "#8e95a3"
GRID = "#26292f"
BAND = "#f2495c"
# Grafana's classic palette, in its order, and its named colours.
PALETTE = (
    "#7eb26d",
    "#eab839",
    "#6ed0e0",
    "#ef843c",
    "#e24d42",
    "#1f78c1",
    "#ba43a9",
    "#705da0",
    "#508642",
    "#cca300",
    "#447ebc",
    "#c15c17",
)
NAMED = {
    "green": "#73bf69",
    "red": "#f2495c",
    "orange": "#ff9830",
    "yellow": "#fade2a",
    "blue": "#5794f2",
}


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]  # (seconds, value); NaN where there is none

    def last(self) -> float:
        values = [v for _, v in self.points if not math.isnan(v)]
        return values[-1] if values else math.nan


def _number(value: float) -> str:
    """Grafana's "short": three significant digits at most, K/M above a thousand."""
    for scale, suffix in ((1e6, " M"), (1e3, " K")):
        if abs(value) >= scale:
            return _number(value / scale).rstrip() + suffix
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


def formatted(value: float, unit: str) -> str:
    if math.isnan(value):
        return "No data"
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "s":
        if value and abs(value) < 1:
            return f"{_number(value * 1000)} ms"
        return f"{_number(value)} s"
    if unit == "Bps":
        for scale, name in ((1e6, "MB/s"), (1e3, "kB/s")):
            if abs(value) >= scale:
                return f"{_number(value / scale)} {name}"
        return f"{_number(value)} B/s"
    suffix = {"reqps": " req/s", "ops": " ops/s"}.get(unit, "")
    return _number(value) + suffix


def _nice_top(top: float) -> tuple[float, float]:
    """An axis top above ``top`` and its tick step (1, 2 or 5 times a power of ten)."""
    if top <= 0 or math.isnan(top):
        return 1.0, 0.25
    rough = top / 4
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= rough)
    return step * math.ceil(top / step - 1e-9), step


class Canvas:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, part: str) -> None:
        self.parts.append(part)

    def text(self, x: float, y: float, text: str, size: float = 12, **style: str) -> None:
        attributes = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in style.items())
        self.add(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}"{attributes}>{escape(text)}</text>'
        )


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float


def _box(grid: dict[str, int]) -> Box:
    column = (WIDTH - MARGIN) / 24
    return Box(
        MARGIN + grid["x"] * column,
        HEADER + grid["y"] * (CELL_HEIGHT + MARGIN),
        grid["w"] * column - MARGIN,
        grid["h"] * (CELL_HEIGHT + MARGIN) - MARGIN,
    )


def _threshold_colour(panel: dict[str, Any], value: float) -> str:
    steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
    colour = NAMED["green"]
    for step in steps:
        if step["value"] is None or (not math.isnan(value) and value >= step["value"]):
            colour = NAMED.get(step["color"], step["color"])
    return colour


def _path(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(points))


def _stat(canvas: Canvas, panel: dict[str, Any], box: Box, series: list[Series]) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit", "short")
    value = series[0].last() if series else math.nan
    colour = _threshold_colour(panel, value)
    if series and panel.get("options", {}).get("graphMode") == "area":
        points = [(t, v) for t, v in series[0].points if not math.isnan(v)]
        if len(points) > 1:
            span = points[-1][0] - points[0][0] or 1.0
            low = min(0.0, *(v for _, v in points))
            high = max(v for _, v in points)
            high = high if high > low else low + 1
            top, height = box.y + box.h * 0.62, box.h * 0.38 - 1
            line = [
                (
                    box.x + box.w * (t - points[0][0]) / span,
                    top + height * (1 - (v - low) / (high - low)),
                )
                for t, v in points
            ]
            area = line + [(line[-1][0], box.y + box.h - 1), (line[0][0], box.y + box.h - 1)]
            canvas.add(f'<path d="{_path(area)} Z" fill="{colour}" fill-opacity="0.12"/>')
            canvas.add(
                f'<path d="{_path(line)}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            )
    canvas.text(
        box.x + box.w / 2,
        box.y + box.h * 0.5,
        formatted(value, unit),
        size=30,
        fill=colour,
        font_weight="500",
        text_anchor="middle",
    )


def _legend_rows(series: list[Series], width: float) -> list[list[tuple[int, str]]]:
    rows: list[list[tuple[int, str]]] = [[]]
    used = 0.0
    for index, one in enumerate(series):
        name = one.name if len(one.name) <= 48 else one.name[:47] + "…"
        need = 22 + len(name) * LEGEND_CHAR
        if rows[-1] and used + need > width:
            rows.append([])
            used = 0.0
        rows[-1].append((index, name))
        used += need
    return rows


def _timeseries(
    canvas: Canvas,
    panel: dict[str, Any],
    box: Box,
    series: list[Series],
    band: tuple[float, float],
    span: float,
) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    unit = defaults.get("unit", "short")
    stacked = defaults.get("custom", {}).get("stacking", {}).get("mode") == "normal"
    fill = defaults.get("custom", {}).get("fillOpacity", 0) / 100
    legend = _legend_rows(series, box.w - 16)[:3]
    plot = Box(box.x + 62, box.y + 34, box.w - 74, box.h - 34 - 22 - 16 * len(legend))
    # Stacked series are drawn on top of the ones before them.
    base: dict[float, float] = {}
    drawn: list[list[tuple[float, float, float]]] = []  # (t, bottom, top)
    for one in series:
        points = []
        for t, v in one.points:
            bottom = base.get(t, 0.0) if stacked else 0.0
            top = bottom + v if not math.isnan(v) else math.nan
            if stacked and not math.isnan(v):
                base[t] = top
            points.append((t, bottom, top))
        drawn.append(points)
    tops = [top for points in drawn for _, _, top in points if not math.isnan(top)]
    axis_top, step = _nice_top(max(tops, default=0.0))

    def x(t: float) -> float:
        return plot.x + plot.w * t / span

    def y(v: float) -> float:
        return plot.y + plot.h * (1 - v / axis_top)

    canvas.add(
        f'<rect x="{x(band[0]):.1f}" y="{plot.y:.1f}" width="{x(band[1]) - x(band[0]):.1f}" '
        f'height="{plot.h:.1f}" fill="{BAND}" fill-opacity="0.07"/>'
    )
    tick = 0.0
    while tick <= axis_top + 1e-9:
        canvas.add(
            f'<line x1="{plot.x:.1f}" x2="{plot.x + plot.w:.1f}" y1="{y(tick):.1f}" '
            f'y2="{y(tick):.1f}" stroke="{GRID}"/>'
        )
        label = formatted(tick, unit)
        canvas.text(plot.x - 6, y(tick) + 4, label, size=10, fill=MUTED, text_anchor="end")
        tick += step
    for second in range(0, int(span) + 1, 10):
        canvas.add(
            f'<line x1="{x(second):.1f}" x2="{x(second):.1f}" y1="{plot.y:.1f}" '
            f'y2="{plot.y + plot.h:.1f}" stroke="{GRID}"/>'
        )
        label = f"{second // 60:02d}:{second % 60:02d}"
        canvas.text(
            x(second), plot.y + plot.h + 14, label, size=10, fill=MUTED, text_anchor="middle"
        )
    for index, points in enumerate(drawn):
        colour = PALETTE[index % len(PALETTE)]
        # Runs of points with a value: a gap where a query gave none (NaN), as spanNulls off.
        runs: list[list[tuple[float, float, float]]] = [[]]
        for point in points:
            if math.isnan(point[2]):
                runs.append([])
            else:
                runs[-1].append(point)
        for run in (r for r in runs if r):
            line = [(x(t), y(top)) for t, _, top in run]
            if fill:
                under = [(x(t), y(bottom)) for t, bottom, _ in reversed(run)]
                canvas.add(
                    f'<path d="{_path(line + under)} Z" fill="{colour}" '
                    f'fill-opacity="{fill * 0.6:.2f}"/>'
                )
            canvas.add(
                f'<path d="{_path(line)}" fill="none" stroke="{colour}" stroke-width="1.3"/>'
            )
    if not series:
        canvas.text(
            plot.x + plot.w / 2,
            plot.y + plot.h / 2,
            "No data",
            size=14,
            fill=MUTED,
            text_anchor="middle",
        )
    legend_y = plot.y + plot.h + 34
    for row in legend:
        left = box.x + 10
        for index, name in row:
            colour = PALETTE[index % len(PALETTE)]
            canvas.add(
                f'<rect x="{left:.1f}" y="{legend_y - 4:.1f}" width="14" height="4" rx="1" '
                f'fill="{colour}"/>'
            )
            canvas.text(left + 19, legend_y, name, size=11, fill=TEXT)
            left += 22 + len(name) * LEGEND_CHAR
        legend_y += 16


def dashboard_svg(
    board: dict[str, Any],
    series: dict[int, list[Series]],
    caption: str,
    band: tuple[float, float],
) -> str:
    """Every panel of ``board`` with its ``series`` (by panel id); ``band``: the seconds
    shaded in each time series (an annotation region, as Grafana draws one)."""
    bottom = max(_box(p["gridPos"]).y + _box(p["gridPos"]).h for p in board["panels"])
    height = bottom + MARGIN
    span = max((t for ss in series.values() for s in ss for t, _ in s.points), default=60.0)
    canvas = Canvas()
    canvas.add(
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'width="{WIDTH}" height="{height:.0f}" font-family="{FONT}" role="img" '
        f'aria-label="Grafana dashboard {escape(board["title"])}">'
    )
    canvas.add(
        f"<title>The {escape(board['title'])} Grafana dashboard, drawn from a real run</title>"
    )
    canvas.add(f'<rect width="{WIDTH}" height="{height:.0f}" fill="{BACKGROUND}"/>')
    canvas.text(MARGIN + 4, 26, f"Dashboards › {board['title']}", size=17, fill=TEXT)
    canvas.text(
        WIDTH - MARGIN - 4, 26, f"Last {span:.0f} seconds", size=12, fill=MUTED, text_anchor="end"
    )
    canvas.text(MARGIN + 4, 50, "Instance  All", size=12, fill=MUTED)
    canvas.text(MARGIN + 110, 50, caption, size=12, fill=MUTED)
    for panel in board["panels"]:
        box = _box(panel["gridPos"])
        if panel["type"] == "row":
            canvas.text(
                box.x + 2, box.y + 21, f"⌄  {panel['title']}", size=15, fill=TEXT, font_weight="500"
            )
            continue
        canvas.add(
            f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{box.h:.1f}" '
            f'rx="2" fill="{PANEL}" stroke="{BORDER}"/>'
        )
        canvas.text(box.x + 8, box.y + 20, panel["title"], size=13, fill=TEXT, font_weight="500")
        found = series.get(panel["id"], [])
        if panel["type"] == "stat":
            _stat(canvas, panel, box, found)
        elif panel["type"] == "timeseries":
            _timeseries(canvas, panel, box, found, band, span)
        else:
            raise ValueError(f"panel type {panel['type']} is not drawn here")
    canvas.add("</svg>")
    return "\n".join(canvas.parts) + "\n"
