"""Server-side SVG charts: geometry here, markup in the templates (escaped like any other text).

No JavaScript and no CDN: each chart is an ``<svg role="img">`` with a title and a description,
and the page shows the same figures in a table beside it (the text equivalent).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
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


RUN_HEIGHT = 170  # the running-total panel above the daily columns


@dataclass(frozen=True)
class RunChart:
    """The period's running total against the limit: a line through today, a dashed line on to
    the projection at the period's end, and the limit as a horizontal line."""

    width: int
    height: int
    left: int
    bottom: float
    points: str  # the running total, day by day through today
    projection: str  # "" without a projection: from today's total to the projected end
    limit_y: float | None
    limit_label: str
    projected_label: str
    ticks: list[Tick]


def run_chart(
    bars: Sequence[DayBar],
    today: int,
    *,
    limit: Decimal | None,
    projected: Decimal | None,
    axis: Callable[[Decimal], str],
    money: Callable[[Decimal], str],
) -> RunChart:
    """The running total of ``bars`` through index ``today``; ``limit`` and ``projected`` (the
    budget's, in the chart's unit) if the period has them."""
    plot_height = RUN_HEIGHT - 20 - TOP
    plot_width = WIDTH - LEFT - 8
    step = plot_width / max(len(bars), 1)
    running, totals = Decimal(0), []
    for bar in bars[: today + 1]:
        running += bar.amount
        totals.append(running)
    top = nice_ceiling(max([running, limit or Decimal(0), projected or Decimal(0)]))

    def y(value: Decimal) -> float:
        return round(TOP + plot_height - float(value / top) * plot_height, 1)

    points = " ".join(
        f"{round(LEFT + (index + 1) * step, 1)},{y(total)}" for index, total in enumerate(totals)
    )
    if totals:
        points = f"{LEFT},{y(Decimal(0))} " + points
    projection = ""
    if projected is not None and totals:
        projection = (
            f"{round(LEFT + len(totals) * step, 1)},{y(totals[-1])} "
            f"{round(LEFT + len(bars) * step, 1)},{y(projected)}"
        )
    return RunChart(
        width=WIDTH,
        height=RUN_HEIGHT,
        left=LEFT,
        bottom=TOP + plot_height,
        points=points,
        projection=projection,
        limit_y=y(limit) if limit is not None else None,
        limit_label=money(limit) if limit is not None else "",
        projected_label=money(projected) if projected is not None else "",
        ticks=[Tick(y(top * i / 2), axis(top * i / 2)) for i in range(3)],
    )


# The stacked chart's series: the largest models, the rest as one.
STACK_TOP = 5


@dataclass(frozen=True)
class Segment:
    x: float
    y: float
    width: float
    height: float
    series: int  # which colour: 0 .. STACK_TOP (STACK_TOP: the others)
    title: str


@dataclass(frozen=True)
class StackChart:
    width: int
    height: int
    left: int
    bottom: float
    segments: list[Segment]
    ticks: list[Tick]
    day_labels: list[Bar]
    keys: list[tuple[int, str]]  # (series, label) for the legend


def stack_chart(
    days: Sequence[date],
    spend: Mapping[tuple[date, str], Decimal],
    models: Sequence[str],
    *,
    other: str,
    money: Callable[[Decimal], str],
    axis: Callable[[Decimal], str],
) -> StackChart:
    """One column per day, cost stacked by model (``models``, largest first; beyond
    ``STACK_TOP`` of them, the rest stack as ``other``); ``spend`` maps (day, model) to cost."""
    shown = list(models[:STACK_TOP])
    series = {name: index for index, name in enumerate(shown)}
    per_day: list[list[tuple[int, str, Decimal]]] = []
    for day in days:
        sums: dict[int, tuple[str, Decimal]] = {}
        for (when, model), amount in spend.items():
            if when != day or not amount:
                continue
            number = series.get(model, STACK_TOP)
            label = model if number < STACK_TOP else other
            sums[number] = (label, sums.get(number, (label, Decimal(0)))[1] + amount)
        per_day.append([(i, sums[i][0], sums[i][1]) for i in sorted(sums)])
    plot_height = DAY_HEIGHT - BOTTOM - TOP
    plot_width = WIDTH - LEFT - 8
    top = nice_ceiling(
        max((sum((a for _, _, a in d), Decimal(0)) for d in per_day), default=Decimal(0))
    )
    step = plot_width / max(len(days), 1)
    segments, labels = [], []
    for index, (day, stack) in enumerate(zip(days, per_day, strict=True)):
        x = LEFT + index * step
        base = Decimal(0)
        for number, label, amount in stack:
            low = TOP + plot_height - float(base / top) * plot_height
            base += amount
            high = TOP + plot_height - float(base / top) * plot_height
            segments.append(
                Segment(
                    x=round(x + step * 0.15, 1),
                    y=round(high, 1),
                    width=round(step * 0.7, 1),
                    height=round(low - high, 1),
                    series=number,
                    title=f"{day.isoformat()}, {label}: {money(amount)}",
                )
            )
        if index % 7 == 0:
            labels.append(Bar(round(x + step / 2, 1), 0, 0, 0, day.strftime("%d %b"), base, ""))
    keys = [(series[name], name) for name in shown]
    if len(models) > STACK_TOP:
        keys.append((STACK_TOP, other))
    return StackChart(
        width=WIDTH,
        height=DAY_HEIGHT,
        left=LEFT,
        bottom=TOP + plot_height,
        segments=segments,
        ticks=[
            Tick(round(TOP + plot_height - i / 4 * plot_height, 1), axis(top * i / 4))
            for i in range(5)
        ],
        day_labels=labels,
        keys=keys,
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
