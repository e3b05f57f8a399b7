"""Only in the PgBouncer leg (``make test-pgbouncer``, tests/pgbouncer.py): the connections really
go through a transaction pooler, and what admission sets per transaction stays in it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core import checks
from django.db import connection, connections, transaction
from django.test import override_settings

from llm_budgets.exceptions import LedgerUnavailable
from llm_budgets.models import Counter
from tests.concurrency import RowLocker, run_threads
from tests.factories import reserve_30, seed
from tests.pgbouncer import Pooler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.concurrency]


def test_the_suite_talks_to_postgresql_through_pgbouncer_in_transaction_mode(
    pgbouncer: Pooler,
) -> None:
    assert connection.settings_dict["PORT"] == str(pgbouncer.port)
    seed(limit="100")
    reserve_30().release()
    (config,) = [row for row in pgbouncer.admin("SHOW CONFIG") if row["key"] == "pool_mode"]
    assert config["value"] == "transaction"
    pools = {row["database"]: row for row in pgbouncer.admin("SHOW POOLS")}
    assert connection.settings_dict["NAME"] in pools


def test_the_lock_timeout_bound_stays_inside_its_transaction(pgbouncer: Pooler) -> None:
    """The bound is ``set_config(..., true)``: transaction-local. A session-level SET would stay
    on the server connection and leak to whichever client the pooler hands it to next."""
    seed(limit="1000")

    def work(_: int) -> str:
        reserve_30().release()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            return str(cursor.fetchone()[0])

    # More clients than one server connection: the pooler reuses server connections.
    results = run_threads(6, work)
    assert results == ["0"] * 6, results
    assert (
        sum(int(row["sv_idle"]) + int(row["sv_used"]) for row in pgbouncer.admin("SHOW POOLS")) >= 1
    )


@override_settings(LLM_BUDGETS={"LOCK_TIMEOUT_SECONDS": 0.5})
def test_a_counter_lock_wait_through_the_pooler_is_refused_within_the_bound() -> None:
    seed(limit="100")
    reserve_30().release()
    counter = Counter.objects.get()
    with RowLocker([counter.pk], timeout=30), pytest.raises(LedgerUnavailable):
        reserve_30()
    counter.refresh_from_db()
    assert (counter.spent, counter.reserved) == (Decimal(0), Decimal(0))
    assert reserve_30().amount == Decimal(30)


@override_settings(LLM_BUDGETS={"POOLER": "transaction"})
def test_the_legs_own_settings_pass_the_transaction_pooling_checks() -> None:
    from django.apps import apps

    from llm_budgets.schedule import periodic_tasks_install

    if apps.is_installed("django_celery_beat"):
        periodic_tasks_install()  # as a deployment on the DatabaseScheduler does (else W082)
    connections["default"].settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        messages = checks.run_checks(databases=["default"])
    finally:
        connections["default"].settings_dict.pop("DISABLE_SERVER_SIDE_CURSORS")
    assert [m.id for m in messages if str(m.id).startswith("llm_budgets.")] == []
