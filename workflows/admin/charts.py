"""Small line charts over time, drawn on the server as inline SVG: no JavaScript, nothing downloaded.

The functions here only compute coordinates and texts; ``includes/time_chart.html`` draws them,
and every text (the chart's <title> and <desc>, axis labels, each point's tooltip) goes through
the template's autoescaping. No data gives no chart (the page says so in a sentence); one point
is drawn as a dot; many points are thinned to at most ``MAX_POINTS`` evenly spaced ones.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from workflows.admin.display import when

# A chart is 506 px wide: 100 points are 5 px apart, and each drawn point carries its tooltip
# (a 200-feature run's two charts were 86 KB of its page at 200 points).
MAX_POINTS = 100


@dataclass(frozen=True)
class ChartPoint:
    x: float
    y: float
    title: str  # the point's tooltip (an SVG <title>)


@dataclass(frozen=True)
class Tick:
    pos: float  # y of a value tick, x of a time tick
    label: str
    anchor: str = "middle"  # text-anchor of a time tick's label


@dataclass(frozen=True)
class TimeChart:
    """A value over time: one point per reading, joined by a line, on fixed-size axes."""

    slug: str  # prefix of the element ids that aria-labelledby points at
    title: str
    description: str
    points: list[ChartPoint]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    limit: Tick | None = None  # a horizontal reference line, e.g. the total budget
    thinned: int = 0  # readings left out to keep the chart small
    step: bool = False  # a count that changes at an instant: hold each value until the next reading

    WIDTH = 600
    HEIGHT = 190
    LEFT = 78
    RIGHT = 584
    TOP = 14
    BOTTOM = 160

    @property
    def polyline(self) -> str:
        """The line through the points; empty for a single point, which is drawn as a dot only."""
        if len(self.points) < 2:
            return ""
        corners = []
        for before, point in zip([None, *self.points], self.points, strict=False):
            if self.step and before is not None:
                corners.append(f"{point.x:.1f},{before.y:.1f}")
            corners.append(f"{point.x:.1f},{point.y:.1f}")
        return " ".join(corners)

    @property
    def area(self) -> str:
        """The polygon under the line, down to the zero axis."""
        if len(self.points) < 2:
            return ""
        first, last = self.points[0], self.points[-1]
        return f"{self.polyline} {last.x:.1f},{self.BOTTOM} {first.x:.1f},{self.BOTTOM}"


@dataclass(frozen=True)
class Reading:
    at: datetime
    value: float
    title: str


def thin(readings: list[Reading], limit: int = MAX_POINTS) -> list[Reading]:
    """At most ``limit`` readings, evenly spaced, always keeping the first and the last."""
    if len(readings) <= limit:
        return readings
    last = len(readings) - 1
    return [readings[round(i * last / (limit - 1))] for i in range(limit)]


def time_chart(
    readings: list[Reading], *, slug: str, title: str, description: str, y_max: float,
    y_label: Callable[[float], str] = "{:g}".format, limit: tuple[float, str] | None = None, step: bool = False,
) -> TimeChart | None:
    """Place ``readings`` (in time order) on the chart's axes; None when there are none.

    ``y_max`` is the top of the value axis (the bottom is 0); ``y_label`` formats its ticks;
    ``limit`` is an optional horizontal line (value, label), drawn only when on the scale;
    ``step`` draws a count that holds its value between readings instead of a slope.
    """
    if not readings:
        return None
    shown = thin(readings)
    start, end = shown[0].at, shown[-1].at
    span = (end - start).total_seconds()
    top = y_max if y_max > 0 else 1.0
    width, height = TimeChart.RIGHT - TimeChart.LEFT, TimeChart.BOTTOM - TimeChart.TOP

    def x_of(at: datetime) -> float:
        if span <= 0:  # one reading, or all at the same instant: in the middle
            return TimeChart.LEFT + width / 2
        return TimeChart.LEFT + (at - start).total_seconds() / span * width

    def y_of(value: float) -> float:
        return TimeChart.BOTTOM - min(max(value, 0.0), top) / top * height

    points = [ChartPoint(round(x_of(r.at), 1), round(y_of(r.value), 1), r.title) for r in shown]
    y_ticks = [Tick(round(y_of(v), 1), y_label(v)) for v in (0.0, top / 2, top)]
    if span <= 0:
        x_ticks = [Tick(points[0].x, when(start))]
    else:
        x_ticks = [Tick(TimeChart.LEFT, when(start), "start"),
                   Tick(TimeChart.RIGHT, f"+{elapsed(span)}", "end")]
    line = Tick(round(y_of(limit[0]), 1), limit[1]) if limit is not None and 0 < limit[0] <= top else None
    return TimeChart(slug=slug, title=title, description=description, points=points, y_ticks=y_ticks,
                     x_ticks=x_ticks, limit=line, thinned=len(readings) - len(shown), step=step)


def elapsed(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours / 24:.1f} days"
