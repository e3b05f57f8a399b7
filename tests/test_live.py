"""Live figures (``reads.live``): a charge committed a moment ago is on every page, in the usage API
and in the export, whether the rollup job never ran, ran before it, or runs in the middle of the
request; and every one of those totals is the tenant budget's ``spent`` in ``budgets.status()``."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.jobs.rollups import daily_usage_rebuild, daily_usage_refresh
from llm_budgets.models import DailyUsage, RollupWatermark, Tenant, UsageRecord
from llm_budgets.money import money as money_text
from llm_budgets.reads import live
from tests.api import BASE, new_key
from tests.api import client_for as api_client_for
from tests.pages import People, people, rebuild_rollups, usage_data, use
from tests.test_pages import body, client_for, export_rows

pytestmark = pytest.mark.django_db

SENTENCES = {
    "/usage/": r"you have used (.+?) so far\.",
    "/usage/models/": r": ([^:]+?) so far; the previous",
    "/usage/users/": r": ([^:]+?) so far\.",
}


@pytest.fixture
def folks(settings: Any) -> People:
    usage_data()
    return people()


def spent() -> Decimal:
    """What the tenant spent this period by ``budgets.status()`` (its month budget's counter)."""
    return next(s for s in budgets.status(tenant="acme") if s.scope == "tenant").spent


def everywhere(folks: People) -> dict[str, Decimal]:
    """The period's total as every surface says it, for acme's admin."""
    admin = client_for(folks.acme_admin)
    found: dict[str, Decimal] = {}
    for path, sentence in SENTENCES.items():
        match = re.search(sentence, body(admin.get(path)))
        assert match, path
        found[path] = Decimal(match.group(1).replace("USD", "").replace(",", "").strip())
    rows = export_rows(admin.get("/usage/export.csv"))
    cost = rows[0].index("cost")
    found["export"] = sum((Decimal(row[cost]) for row in rows[1:]), Decimal(0))
    key = new_key("acme")
    for group_by in ("day", "model", "end_user"):
        answer = api_client_for(key).get(f"{BASE}tenants/acme/usage", {"group_by": group_by})
        data = answer.json()
        assert Decimal(data["total"]) == sum(Decimal(r["amount"]) for r in data["results"])
        found[f"api {group_by}"] = Decimal(data["total"])
    return found


def assert_everywhere(folks: People, expected: Decimal) -> None:
    assert spent() == expected
    found = everywhere(folks)
    assert found == dict.fromkeys(found, expected), found


def test_a_charge_shows_everywhere_with_the_rollup_job_never_run(settings: Any) -> None:
    budgets.ensure_tenant(tenant="acme", timezone="Europe/Amsterdam")
    from tests.factories import seed

    seed(tenant="acme", limit="1000")
    seed(tenant="beta", limit="1000")
    use("acme", "alice-acme", 100)  # 3.00
    folks = people()
    assert not RollupWatermark.objects.exists()
    assert not DailyUsage.objects.exists()
    assert_everywhere(folks, Decimal(3))
    use("acme", "bob-acme", 10)  # 0.30, a moment ago
    assert_everywhere(folks, Decimal("3.30"))


def test_a_charge_after_the_last_rollup_shows_everywhere(folks: People) -> None:
    before = spent()
    assert RollupWatermark.objects.get().through_id == UsageRecord.objects.latest("pk").pk
    use("acme", "alice-acme", 100)  # 3.00, after the rollups' watermark
    assert_everywhere(folks, before + 3)
    # Rolled up, the same figures (from the rollups now, not the tail).
    rebuild_rollups()
    assert_everywhere(folks, before + 3)


@pytest.fixture
def rollup_mid_read(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Run the rollup job inside the read, at a chosen point: after the first reading of the
    watermark (``"rows"``: the rows then read are the new ones), or after the rollup rows were
    read (``"tail"``: the ledger's tail is read against a newer watermark)."""

    def arm(where: str) -> None:
        if where == "rows":
            original = live._watermark
            calls = iter(range(10**6))

            def watermark() -> tuple[int, frozenset[int]]:
                result = original()
                if next(calls) % 2 == 0:  # the first of each read's two readings
                    daily_usage_refresh()
                return result

            monkeypatch.setattr(live, "_watermark", watermark)
        else:
            tail = live._tail

            def late_tail(*args: Any) -> QuerySet[Any]:
                daily_usage_refresh()  # before the tail's query (lazy) is read
                return tail(*args)

            monkeypatch.setattr(live, "_tail", late_tail)

    return arm


@pytest.mark.parametrize("where", ["rows", "tail"])
def test_a_rollup_in_the_middle_of_a_read_counts_nothing_twice(
    folks: People, rollup_mid_read: Callable[[str], None], where: str
) -> None:
    before = spent()
    use("acme", "alice-acme", 100)  # 3.00: in the tail until the job in the read rolls it up
    use("acme", "carol-acme", 10)  # 0.30
    rollup_mid_read(where)
    assert_everywhere(folks, before + Decimal("3.30"))
    use("acme", "dan-acme", 10)  # 0.30 more: each read's job rolls it up again
    assert_everywhere(folks, before + Decimal("3.60"))


def test_a_member_sees_their_own_charge_a_moment_ago(folks: People) -> None:
    member = client_for(folks.acme_member)
    before = body(member.get("/usage/models/"))
    use("acme", "alice-acme", 100)  # 3.00 more for alice (18.00 before)
    after = body(member.get("/usage/models/"))
    assert f"{money_text(Decimal(18), 'USD')} so far" in before
    assert f"{money_text(Decimal(21), 'USD')} so far" in after
    assert "bob-acme" not in after


def test_a_line_in_flight_when_the_watermark_was_taken_is_counted_once() -> None:
    """On PostgreSQL a settlement can draw its id before the rollup takes its watermark and
    commit after: the rollup remembers the id as a gap, the reads add it from the ledger, and the
    next rollup that finds it committed rolls it up (and forgets it)."""
    from llm_budgets.jobs import rollups
    from tests.factories import seed

    seed(tenant="acme", limit="1000")  # a tenant in UTC
    tenant = Tenant.objects.get(external_id="acme")
    use("acme", "alice-acme", 100)
    use("acme", "alice-acme", 10)
    late = UsageRecord.objects.latest("pk")
    use("acme", "alice-acme", 20)
    rebuild_rollups()
    # What the rollup would have written had the middle line not been committed yet.
    now = timezone.now()
    mark = RollupWatermark.objects.get()
    utc = rollups.ZoneInfo("UTC")
    rollups._rebuild_day(now.date(), utc, {tenant.pk}, mark.through_id, [late.pk], now)
    mark.gaps = [[late.pk, now.isoformat()]]
    mark.save()

    def total() -> Decimal:
        days = live.daily_spend(tenant, since=now.date(), until=now.date(), unit="provider_cost")
        return sum(days.values(), Decimal(0))

    assert DailyUsage.objects.get().cost == Decimal("3.60")  # the rows lack it
    assert total() == spent() == Decimal("3.90")
    # The next rollup finds it committed: rolled up, no longer a gap, still counted once.
    daily_usage_rebuild(since=now.date(), until=now.date())
    assert RollupWatermark.objects.get().gaps == []
    assert DailyUsage.objects.get().cost == Decimal("3.90")
    assert total() == spent()


def test_the_rollup_finds_the_ids_the_watermark_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild whose range of new ids has a hole records it (an id drawn but not committed)."""
    from tests.factories import seed

    seed(tenant="acme", limit="1000")
    use("acme", "alice-acme", 100)
    rebuild_rollups()
    use("acme", "alice-acme", 10)
    use("acme", "alice-acme", 20)
    hidden = UsageRecord.objects.order_by("-pk")[1].pk
    real = UsageRecord.objects.filter

    def without_hidden(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **kwargs).exclude(pk=hidden)

    monkeypatch.setattr(UsageRecord.objects, "filter", without_hidden)
    rebuild_rollups()
    monkeypatch.undo()
    assert RollupWatermark.objects.get().gap_ids == {hidden}
    assert spent() == Decimal("3.90")
    tenant = Tenant.objects.get(external_id="acme")
    today = timezone.now().date()
    days = live.daily_spend(tenant, since=today, until=today, unit="provider_cost")
    assert sum(days.values(), Decimal(0)) == Decimal("3.90")


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="row locks and concurrent writers: PostgreSQL",
)
def test_reads_during_settlements_and_rollup_runs_count_each_line_once() -> None:
    """Settlements, rollup runs and live reads at once: every read lies between the tenant
    budget's spent just before it and just after it (nothing counted twice, nothing missed)."""
    from django.test import override_settings

    from tests.concurrency import run_threads
    from tests.factories import seed

    seed(tenant="acme", limit="100000")
    tenant = Tenant.objects.get(external_id="acme")
    stop = threading.Event()
    today = timezone.now().date()

    def work(index: int) -> list[str]:
        problems: list[str] = []
        if index < 3:  # settle
            for n in range(15):
                use("acme", f"u-{index}-{n}", 10)
        elif index == 3:  # roll up
            while not stop.is_set():
                daily_usage_refresh()
        else:  # read
            for _ in range(25):
                before = spent()
                days = live.daily_spend(
                    tenant,
                    since=today - timedelta(days=1),
                    until=today + timedelta(days=1),
                    unit="provider_cost",
                )
                total = sum(days.values(), Decimal(0))
                after = spent()
                if not before <= total <= after:
                    problems.append(f"{before} <= {total} <= {after}")
        if index == 4:
            stop.set()
        return problems

    with override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 30}):
        results = run_threads(6, work, timeout=120)
    stop.set()
    assert results == [[]] * 6
    daily_usage_refresh()
    days = live.daily_spend(
        tenant,
        since=today - timedelta(days=1),
        until=today + timedelta(days=1),
        unit="provider_cost",
    )
    assert sum(days.values(), Decimal(0)) == spent() == Decimal("13.5")


@pytest.mark.django_db
def test_a_jump_of_the_id_sequence_is_remembered_newest_first_and_bounded() -> None:
    """Ids skipped by a jump of the sequence (a restore, a sequence cache) are not walked one by
    one: the newest ``MAX_GAPS`` are remembered, as in-flight lines have ids near the top."""
    from llm_budgets.jobs import rollups
    from llm_budgets.models import RollupWatermark

    now = timezone.now()
    mark = RollupWatermark(pk=1, through_id=1, gaps=[])
    gaps, filled = rollups._gaps_after(mark, 10**12, now)
    assert filled == []
    assert [pk for pk, _ in gaps] == list(range(10**12 - rollups.MAX_GAPS, 10**12))
