"""Geometry of a stacked bar chart, computed server side and drawn as SVG by a template.

Pure functions over plain numbers: no Django, no I/O, so the layout is unit-testable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PALETTE = ("#417690", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00")


@dataclass(frozen=True)
class Series:
    name: str
    color: str


@dataclass(frozen=True)
class ChartPoint:
    """One bar: ``label`` names it in its tooltip, ``tick_label`` under the x axis."""

    label: str
    tick_label: str
    values: Mapping[str, int]


@dataclass(frozen=True)
class Segment:
    series: str
    color: str
    value: int
    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Bar:
    label: str
    title: str
    total: int
    x: float
    width: float
    slot_x: float
    slot_width: float
    segments: list[Segment]


@dataclass(frozen=True)
class Tick:
    label: str
    position: float


@dataclass(frozen=True)
class LegendItem:
    name: str
    color: str
    x: float

    @property
    def text_x(self) -> float:
        return self.x + 16


@dataclass(frozen=True)
class StackedBarChart:
    width: int
    height: int
    left: float
    top: float
    right: float
    bottom: float
    y_max: int
    bars: list[Bar]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    legend: list[LegendItem]
    x_title: str
    y_title: str

    @property
    def plot_height(self) -> float:
        return self.bottom - self.top

    @property
    def y_label_x(self) -> float:
        return self.left - 6

    @property
    def x_label_y(self) -> float:
        return self.bottom + 16

    @property
    def x_title_y(self) -> float:
        return self.height - 8

    @property
    def y_title_x(self) -> float:
        return self.left / 4

    @property
    def y_title_y(self) -> float:
        return (self.top + self.bottom) / 2

    @property
    def x_title_x(self) -> float:
        return (self.left + self.right) / 2


def stacked_bar_chart(
    *,
    series: Sequence[Series],
    points: Sequence[ChartPoint],
    x_title: str,
    y_title: str,
    width: int = 800,
    height: int = 320,
    max_x_ticks: int = 12,
) -> StackedBarChart:
    """One bar per point, its segments stacked bottom-up in ``series`` order, on a y axis
    from 0 to a round number at or above the tallest bar."""
    left, right, top, bottom = 64.0, width - 16.0, 36.0, height - 52.0
    totals = [sum(point.values.get(s.name, 0) for s in series) for point in points]
    step = _nice_step(max(totals, default=0), ticks=5)
    y_max = step * max(1, math.ceil(max(totals, default=0) / step))
    scale = (bottom - top) / y_max
    slot = (right - left) / max(1, len(points))
    bars = [
        _bar(
            point, total, series, slot_x=left + index * slot, slot=slot, bottom=bottom, scale=scale
        )
        for index, (point, total) in enumerate(zip(points, totals, strict=True))
    ]
    y_ticks = [
        Tick(compact(value), _r(bottom - value * scale)) for value in range(0, y_max + 1, step)
    ]
    return StackedBarChart(
        width=width,
        height=height,
        left=left,
        top=top,
        right=right,
        bottom=bottom,
        y_max=y_max,
        bars=bars,
        y_ticks=y_ticks,
        x_ticks=_x_ticks(points, left=left, slot=slot, max_ticks=max_x_ticks),
        legend=_legend(series, left=left),
        x_title=x_title,
        y_title=y_title,
    )


def _bar(
    point: ChartPoint,
    total: int,
    series: Sequence[Series],
    *,
    slot_x: float,
    slot: float,
    bottom: float,
    scale: float,
) -> Bar:
    """One point's bar in its slot: 70% of the slot wide, centred, segments bottom-up."""
    bar_x, bar_width = slot_x + slot * 0.15, slot * 0.7
    segments: list[Segment] = []
    base = bottom
    for item in series:
        value = point.values.get(item.name, 0)
        if value <= 0:
            continue
        segment_height = value * scale
        base -= segment_height
        segments.append(
            Segment(
                item.name,
                item.color,
                value,
                _r(bar_x),
                _r(base),
                _r(bar_width),
                _r(segment_height),
            )
        )
    parts = " · ".join(f"{s.name} {point.values.get(s.name, 0):,}" for s in series)
    return Bar(
        label=point.label,
        title=f"{point.label}: {parts} · total {total:,} tokens",
        total=total,
        x=_r(bar_x),
        width=_r(bar_width),
        slot_x=_r(slot_x),
        slot_width=_r(slot),
        segments=segments,
    )


def _x_ticks(
    points: Sequence[ChartPoint], *, left: float, slot: float, max_ticks: int
) -> list[Tick]:
    """At most about ``max_ticks`` labels, evenly spaced; counted from the last bar so that
    today always has its label."""
    every = max(1, math.ceil(len(points) / max_ticks))
    return [
        Tick(point.tick_label, _r(left + (index + 0.5) * slot))
        for index, point in enumerate(points)
        if (len(points) - 1 - index) % every == 0
    ]


def _legend(series: Sequence[Series], *, left: float) -> list[LegendItem]:
    legend: list[LegendItem] = []
    legend_x = left
    for item in series:
        legend.append(LegendItem(item.name, item.color, _r(legend_x)))
        legend_x += 28 + 7 * len(item.name)  # swatch, gap, ~7 px per character at 11 px
    return legend


def compact(value: int) -> str:
    """``1500`` → ``1.5k``, ``2000000`` → ``2M``: short labels for axis ticks."""
    for divisor, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if value >= divisor:
            return f"{value / divisor:.3g}{suffix}"
    return str(value)


def _nice_step(maximum: int, *, ticks: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten splitting ``[0, maximum]`` in ``ticks``."""
    raw = max(1, math.ceil(maximum / ticks))
    magnitude: int = 10 ** (len(str(raw)) - 1)
    return next(f * magnitude for f in (1, 2, 5, 10) if f * magnitude >= raw)


def _r(value: float) -> float:
    return round(value, 2)
