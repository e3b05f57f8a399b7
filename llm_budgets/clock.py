"""The one clock people read times in: a tenant's times in the tenant's timezone, labelled.

``when(at, "Europe/Paris")`` is ``Tue 1 Dec 2026 12:10 CET``: the same format in the admin, the
tenant pages, emails and messages. Without a tenant (global budgets, provider-wide switches) the
site's own timezone (``TIME_ZONE``) is used, labelled just the same.
"""

from __future__ import annotations

from datetime import datetime, tzinfo
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


@cache
def timezone_choices() -> list[tuple[str, str]]:
    """Every IANA timezone name, for a select list (a timezone is chosen, never typed)."""
    names = sorted(available_timezones() - {"localtime", "Factory"})
    return [(name, name.replace("_", " ")) for name in names]
