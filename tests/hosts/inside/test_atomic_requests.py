"""The host with ATOMIC_REQUESTS on PostgreSQL (issue #37): parallel requests of one tenant, each
holding its reservation across a slow provider call, are all admitted, through a real server."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from django.db import connection
from shop import guarded

from llm_budgets import budgets
from llm_budgets.jobs.reconcile import counters_drift

# The ledger's own alias allowed, as in production.
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_every_request_runs_in_a_transaction() -> None:
    assert connection.settings_dict["ATOMIC_REQUESTS"] is True


def test_parallel_requests_of_one_tenant_hold_across_the_provider_call(
    live_server, llmb_setup
) -> None:
    llmb_setup("acme", limit="100")
    guarded.provider.reset()

    def request(index: int) -> int:
        with urllib.request.urlopen(f"{live_server.url}/guarded/?u={index}", timeout=60) as r:
            return r.status

    with ThreadPoolExecutor(guarded.REQUESTS) as pool:
        answers = list(pool.map(request, range(guarded.REQUESTS)))
    assert answers == [200] * guarded.REQUESTS
    (row,) = budgets.status(tenant="acme")
    assert row.spent == Decimal("0.00075") * guarded.REQUESTS  # 100 in x 2.50 + 50 out x 10.00
    assert counters_drift() == []
