"""The one clock people read times in: a tenant's times in the tenant's timezone, labelled.

``when(at, "Europe/Paris")`` is ``Tue 1 Dec 2026 12:10 CET``: the same format in the admin, the
tenant pages, emails and messages. Without a tenant (global budgets, provider-wide switches) the
site's own timezone (``TIME_ZONE``) is used, labelled just the same.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, tzinfo
from functools import cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from django.utils import timezone


def zone(name: str | None) -> tzinfo:
    """The timezone called ``name``; the site's default one when empty or unknown (a rejected
    edit being shown again, say)."""
    if not name:
        return timezone.get_default_timezone()
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return timezone.get_default_timezone()


def local(at: datetime, tz_name: str | None) -> datetime:
    return at.astimezone(zone(tz_name))


def when(at: datetime | None, tz_name: str | None, *, seconds: bool = False) -> str:
    """``Tue 1 Dec 2026 12:10 CET`` (``12:10:03`` with ``seconds``); ``-`` for no time."""
    if at is None:
        return "-"
    moment = local(at, tz_name)
    clock = "%H:%M:%S" if seconds else "%H:%M"
    return f"{moment:%a} {moment.day} {moment:%b %Y} {moment.strftime(clock)} {moment:%Z}"


def day(on: date | None) -> str:
    """A calendar day (no zone: it is the day it names): ``Sun 25 Oct 2026``; ``-`` for none."""
    if on is None:
        return "-"
    return f"{on:%a} {on.day} {on:%b %Y}"


# An ISO 8601 time inside stored text (an audit target, an older refusal's message).
_ISO_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
)


def readable(text: str, tz_name: str | None) -> str:
    """Stored text with each ISO time in it rewritten in the one format (``when``): services keep
    exact ISO times in audit targets and older messages; people read them this way."""

    def one(match: re.Match[str]) -> str:
        try:
            at = datetime.fromisoformat(match[0])
        except ValueError:
            return match[0]
        if timezone.is_naive(at):
            at = timezone.make_aware(at, UTC)
        return when(at, tz_name, seconds=at.second != 0)

    return _ISO_TIME.sub(one, text)


@cache
def timezone_choices() -> list[tuple[str, str]]:
    """Every IANA timezone name, for a select list (a timezone is chosen, never typed)."""
    names = sorted(available_timezones() - {"localtime", "Factory"})
    return [(name, name.replace("_", " ")) for name in names]


def time_field(at: datetime) -> str:
    """A time in an event body or another wire format: ISO 8601 in UTC with its offset."""
    return at.astimezone(UTC).isoformat()
