"""The read-replica router (docs/scaling.md), with the second alias ``replica`` the project
settings define (a test mirror of the default database)."""

from __future__ import annotations

import pytest
from django.core.checks import Error, Warning
from django.db import transaction
from django.test import override_settings

from llm_budgets.checks import check_replica_router, check_settings
from llm_budgets.models import Budget, Tenant
from llm_budgets.routers import ReplicaRouter, replica_reads
from tests.factories import reserve_30, seed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica"])

REPLICA = {"READ_REPLICA": "replica"}


@override_settings(LLM_BUDGETS=REPLICA)
def test_reads_inside_replica_reads_go_to_the_replica_alias() -> None:
    seed()
    assert Tenant.objects.all().db == "default"
    with replica_reads() as alias:
        assert alias == "replica"
        assert Tenant.objects.all().db == "replica"
        # The mirror sees the primary's committed rows.
        assert list(Tenant.objects.values_list("external_id", flat=True)) == ["acme"]
    assert Tenant.objects.all().db == "default"


@override_settings(LLM_BUDGETS=REPLICA)
def test_writes_and_reads_in_a_primary_transaction_stay_on_the_primary() -> None:
    seed()
    with replica_reads():
        with transaction.atomic():
            assert Budget.objects.all().db == "default"
        hold = reserve_30()  # admission inside the block still locks the primary's rows
        assert hold.amount == 30
        assert ReplicaRouter().db_for_write(Tenant) is None


def test_without_a_replica_setting_nothing_moves() -> None:
    seed()
    with replica_reads() as alias:
        assert alias == "default"
        assert Tenant.objects.all().db == "default"


def test_other_apps_are_left_alone() -> None:
    from django.contrib.auth.models import User

    with override_settings(LLM_BUDGETS=REPLICA), replica_reads():
        assert User.objects.all().db == "default"
        assert ReplicaRouter().allow_migrate("replica", "llm_budgets") is False
        assert ReplicaRouter().allow_migrate("default", "llm_budgets") is None


def test_the_replica_setting_is_checked() -> None:
    with override_settings(LLM_BUDGETS={"READ_REPLICA": "nope"}):
        (error,) = check_settings()
    assert isinstance(error, Error)
    assert error.id == "llm_budgets.E062"
    with override_settings(LLM_BUDGETS=REPLICA, DATABASE_ROUTERS=[]):
        assert check_settings() == []
        (warning,) = check_replica_router()
    assert isinstance(warning, Warning)
    assert warning.id == "llm_budgets.W063"
    with override_settings(LLM_BUDGETS=REPLICA):
        assert check_settings() == check_replica_router() == []
