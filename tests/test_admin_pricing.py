"""Admin for prices (issue 3 item 9): current version and history, an audited "new version",
and a filter for models in use without a price."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from llm_budgets import budgets
from llm_budgets.models import AuditEvent, Plan, Price, UnknownModelPolicy
from llm_budgets.pricing.model_names import model_alias_set

pytestmark = pytest.mark.django_db

OLD = datetime(2025, 1, 1, tzinfo=UTC)
NEW = datetime(2025, 6, 1, tzinfo=UTC)


def _versions() -> tuple[Price, Price, Price]:
    """Three versions of one model's price, as the models the admin lists."""
    old = budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok="5",
        output_per_mtok="15",
        effective_from=OLD,
    )
    new = budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok="2.5",
        output_per_mtok="10",
        cache_write_1h_per_mtok="4",
        effective_from=NEW,
    )
    future = budgets.set_price(
        provider="openai",
        model="gpt-4o",
        input_per_mtok="2",
        output_per_mtok="8",
        effective_from=timezone.now() + timedelta(days=30),
    )
    versions = Price.objects.in_bulk([old.id, new.id, future.id])
    return versions[old.id], versions[new.id], versions[future.id]


def _ids(page: str, prices: list[Price]) -> set[int]:
    return {p.pk for p in prices if reverse("admin:llm_budgets_price_change", args=[p.pk]) in page}


def test_the_list_marks_and_filters_the_current_version(admin_client: Client) -> None:
    old, new, future = _versions()
    url = reverse("admin:llm_budgets_price_changelist")
    assert _ids(
        admin_client.get(url, {"version": "current"}).content.decode(), [old, new, future]
    ) == {new.id}
    assert _ids(
        admin_client.get(url, {"version": "history"}).content.decode(), [old, new, future]
    ) == {
        old.id,
        future.id,
    }


def test_a_version_page_shows_its_history_and_a_new_version_form_prefilled(
    admin_client: Client,
) -> None:
    old, new, future = _versions()
    page = admin_client.get(
        reverse("admin:llm_budgets_price_change", args=[old.id])
    ).content.decode()
    assert _ids(page, [old, new, future]) == {old.id, new.id, future.id}
    assert "- current" in page
    assert f"?from_version={old.id}" in page
    form = admin_client.get(reverse("admin:llm_budgets_price_add"), {"from_version": new.id})
    assert form.context["adminform"].form.initial["cache_write_1h_per_mtok"] == Decimal(4)


def test_a_new_version_from_the_admin_is_audited_with_its_reason(admin_client: Client) -> None:
    _, new, _ = _versions()
    response = admin_client.post(
        reverse("admin:llm_budgets_price_add"),
        {
            "provider": "openai",
            "model": "gpt-4o",
            "input_per_mtok": "3",
            "output_per_mtok": "12",
            "per_request": "0",
            "tool_fees": '{"web_search": "0.01"}',
            "tiers": "[]",
            "daily_spans": "[]",
            "effective_from_0": "2025-07-01",
            "effective_from_1": "00:00:00",
            "source": "manual",
            "reason": "provider raised prices",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    added = Price.objects.get(effective_from=datetime(2025, 7, 1, tzinfo=UTC))
    assert added.tool_fees == {"web_search": "0.01"}
    event = AuditEvent.objects.get(
        action="price.set", actor="admin", reason="provider raised prices"
    )
    assert event.after["input_per_mtok"] == "3"
    new.refresh_from_db()
    assert new.input_per_mtok == Decimal("2.5")  # the older version is untouched


def _priced_and_unpriced_models_allowed() -> None:
    """Model ``p/priced`` has a price; acme's plan admits unpriced models at a fixed amount."""
    budgets.set_price(provider="p", model="priced", input_per_mtok="1", output_per_mtok="1")
    Plan.objects.create(
        name="fixed",
        unknown_model_policy=UnknownModelPolicy.RESERVE_FIXED,
        unknown_model_fixed_amount=Decimal("0.1"),
    )
    budgets.ensure_tenant(tenant="acme", plan="fixed")
    budgets.set_limit(tenant="acme", amount=Decimal(10), window="month")


def test_models_in_use_without_a_price_are_filtered(admin_client: Client) -> None:
    _priced_and_unpriced_models_allowed()
    budgets.reserve(
        tenant="acme", provider="p", model="priced", input_tokens=1, max_output_tokens=1
    )
    budgets.reserve(
        tenant="acme", provider="p", model="mystery", input_tokens=1, max_output_tokens=1
    )
    url = reverse("admin:llm_budgets_reservation_changelist")
    unpriced = admin_client.get(url, {"priced": "no"}).context["cl"].queryset
    priced = admin_client.get(url, {"priced": "yes"}).context["cl"].queryset
    assert [r.model for r in unpriced] == ["mystery"]
    assert [r.model for r in priced] == ["priced"]
    lines = admin_client.get(reverse("admin:llm_budgets_usagerecord_changelist"), {"priced": "no"})
    assert lines.status_code == 200


def test_priced_filter_resolves_names_as_admission_does(admin_client: Client) -> None:
    """A name priced through its spelling or an alias counts as priced, not only exact names."""
    _priced_and_unpriced_models_allowed()
    for model in ("Priced", "p/priced", "mystery", "mystery-2"):  # a spelling, a prefix, none
        budgets.reserve(
            tenant="acme", provider="p", model=model, input_tokens=1, max_output_tokens=1
        )
    url = reverse("admin:llm_budgets_reservation_changelist")

    def models(value: str) -> list[str]:
        return sorted(
            r.model for r in admin_client.get(url, {"priced": value}).context["cl"].queryset
        )

    assert models("yes") == ["Priced", "p/priced"]
    assert models("no") == ["mystery", "mystery-2"]
    model_alias_set(pattern="mystery-*", model="priced", provider="p", actor="admin")
    assert models("yes") == ["Priced", "mystery-2", "p/priced"]
    assert models("no") == ["mystery"]
