"""Server-side SVG charts: geometry here, markup in the templates (escaped like any other text).

No JavaScript and no CDN: each chart is an ``<svg role="img">`` with a title and a description,
and the page shows the same figures in a table beside it (the text equivalent).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from llm_budgets.pages.figures import DayBar, UsageRow

WIDTH = 720
DAY_HEIGHT = 240
LEFT = 72  # room for the axis labels (amounts without the currency, named in the caption)
BOTTOM = 28
TOP = 12
ROW_HEIGHT = 30
LABEL_WIDTH = 190
VALUE_WIDTH = 110


def nice_ceiling(value: Decimal) -> Decimal:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= ``value`` (axis maximum)."""
    if value <= 0:
        return Decimal(1)
    exponent = value.adjusted()
    for step in (Decimal(1), Decimal(2), Decimal("2.5"), Decimal(5), Decimal(10)):
        candidate = step.scaleb(exponent)
        if candidate >= value:
            return candidate
    return Decimal(10).scaleb(exponent)  # pragma: no cover


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: Decimal
    title: str


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class DayChart:
    width: int
    height: int
    left: int
    bottom: float
    bars: list[Bar]
    previous_points: str  # an SVG polyline of the previous period, "" if it has no days
    ticks: list[Tick]
    day_labels: list[Bar]  # x and label of every seventh day


def day_chart(
    bars: Sequence[DayBar], money: Callable[[Decimal], str], axis: Callable[[Decimal], str]
) -> DayChart:
    """Columns for the current period's days, a dashed line for the previous period's; ``money``
    labels a column's tooltip, ``axis`` the vertical axis."""
    plot_height = DAY_HEIGHT - BOTTOM - TOP
    plot_width = WIDTH - LEFT - 8
    values = [b.amount for b in bars] + [b.previous for b in bars if b.previous is not None]
    top = nice_ceiling(max(values, default=Decimal(0)))
    step = plot_width / max(len(bars), 1)

    def y(value: Decimal) -> float:
        return round(TOP + plot_height - float(value / top) * plot_height, 1)

    drawn, points, labels = [], [], []
    for index, bar in enumerate(bars):
        x = LEFT + index * step
        height = round(float(bar.amount / top) * plot_height, 1)
        drawn.append(
            Bar(
                x=round(x + step * 0.15, 1),
                y=y(bar.amount),
                width=round(step * 0.7, 1),
                height=height,
                label=bar.day.isoformat(),
                value=bar.amount,
                title=f"{bar.day.isoformat()}: {money(bar.amount)}",
            )
        )
        if bar.previous is not None:
            points.append(f"{round(x + step / 2, 1)},{y(bar.previous)}")
        if index % 7 == 0:
            labels.append(
                Bar(round(x + step / 2, 1), 0, 0, 0, bar.day.strftime("%d %b"), bar.amount, "")
            )
    ticks = [Tick(y(top * i / 4), axis(top * i / 4)) for i in range(5)]
    return DayChart(
        width=WIDTH,
        height=DAY_HEIGHT,
        left=LEFT,
        bottom=TOP + plot_height,
        bars=drawn,
        previous_points=" ".join(points),
        ticks=ticks,
        day_labels=labels,
    )


@dataclass(frozen=True)
class RowChart:
    width: int
    height: int
    label_width: int
    bars: list[Bar]


def row_chart(rows: Sequence[UsageRow], money: Callable[[Decimal], str]) -> RowChart:
    """Horizontal bars, one per row, longest for the largest amount."""
    plot = WIDTH - LABEL_WIDTH - VALUE_WIDTH
    top = max((r.amount for r in rows), default=Decimal(0)) or Decimal(1)
    bars = []
    for index, row in enumerate(rows):
        width = max(round(float(row.amount / top) * plot, 1), 1.0 if row.amount else 0.0)
        bars.append(
            Bar(
                x=LABEL_WIDTH,
                y=index * ROW_HEIGHT + 6,
                width=width,
                height=ROW_HEIGHT - 12,
                label=row.short_label if len(row.short_label) <= 26 else row.short_label[:25] + "…",
                value=row.amount,
                title=f"{row.label}: {money(row.amount)}",
            )
        )
    return RowChart(WIDTH, max(len(rows), 1) * ROW_HEIGHT, LABEL_WIDTH, bars)
