"""Model names as providers and SDKs spell them: exact, then spellings, then genai-prices' own
matching rules, then admin aliases; the ledger keeps the name asked for and the version used;
``quote`` says which rule matched; a name that matches nothing is refused."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from llm_budgets import budgets
from llm_budgets.exceptions import InvalidUsage, KillSwitchActive, UnknownPrice
from llm_budgets.models import AuditEvent, ModelAlias, Price, UsageRecord
from llm_budgets.pricing.model_names import model_alias_delete, model_alias_set
from llm_budgets.pricing.prices import price_match
from tests.factories import PRICES_START
from tests.integrations import GPT, seed_tenant

pytestmark = pytest.mark.django_db


def _price(provider: str, model: str) -> Price:
    return budgets.set_price(
        provider=provider,
        model=model,
        input_per_mtok=Decimal(1),
        output_per_mtok=Decimal(2),
        effective_from=PRICES_START,
    )


def _reserve(model: str, provider: str | None = "openai") -> budgets.Hold:
    return budgets.reserve(
        tenant="acme",
        end_user="u-1",
        provider=provider,
        model=model,
        input_tokens=10,
        max_output_tokens=10,
    )


@pytest.mark.parametrize(
    ("provider", "asked", "priced_provider", "priced", "rule"),
    [
        ("openai", "gpt-4o-2024-08-06", "openai", "gpt-4o", "genai-prices"),
        (
            "anthropic",
            "claude-3-5-haiku-20241022",
            "anthropic",
            "claude-3-5-haiku-latest",
            "genai-prices",
        ),
        ("anthropic", "claude-3-5-haiku-latest", "anthropic", "claude-3-5-haiku-latest", "exact"),
        ("mistral", "mistral-large-latest", "mistral", "mistral-large", "genai-prices"),
        ("google", "models/gemini-2.5-flash", "google", "gemini-2.5-flash", "spelling"),
        (None, "models/gemini-2.5-flash", "google", "gemini-2.5-flash", "spelling"),
        (None, "openai/gpt-4o", "openai", "gpt-4o", "spelling"),
        ("openai", "GPT-4o", "openai", "gpt-4o", "spelling"),
    ],
)
def test_names_in_the_wild_resolve_and_the_ledger_keeps_both(
    provider: str | None, asked: str, priced_provider: str, priced: str, rule: str
) -> None:
    seed_tenant()
    version = Price.objects.filter(provider=priced_provider, model=priced).first() or _price(
        priced_provider, priced
    )
    hold = _reserve(asked, provider)
    assert hold.reservation.price_id == version.pk
    hold.commit(input_tokens=10, output_tokens=5)
    line = UsageRecord.objects.get(reservation_id=hold.id)
    assert (line.model, line.price_id) == (asked, version.pk)  # the name asked for, the version
    quote = budgets.quote(
        tenant="acme", provider=provider, model=asked, input_tokens=1, max_output_tokens=1
    )
    assert quote.model_match is not None
    assert (quote.model_match.rule, quote.model_match.model) == (rule, priced)


def test_a_name_that_matches_nothing_is_refused() -> None:
    seed_tenant()
    with pytest.raises(UnknownPrice):
        _reserve("gpt-17-ultra")
    with pytest.raises(UnknownPrice):
        _reserve("openai/not-a-model", provider=None)


def test_an_admin_alias_resolves_last_and_is_audited() -> None:
    seed_tenant()
    with pytest.raises(UnknownPrice):
        _reserve("ft:gpt-4o:acme:support:abc123")
    alias = model_alias_set(
        pattern="ft:gpt-4o:acme:*", provider="openai", model=GPT, actor="ops", reason="fine-tune"
    )
    hold = _reserve("ft:gpt-4o:acme:support:abc123")
    assert hold.reservation.price.model == GPT
    match = price_match(
        provider="openai", model="ft:gpt-4o:acme:support:abc123", at=hold.expires_at
    )[1]
    assert match.rule == "alias"
    assert "ft:gpt-4o:acme:*" in match.detail
    event = AuditEvent.objects.get(action="model_alias.add")
    assert (event.actor, event.reason, event.after["model"]) == ("ops", "fine-tune", GPT)
    model_alias_delete(alias, actor="ops", reason="retired")
    assert AuditEvent.objects.filter(action="model_alias.delete").count() == 1
    with pytest.raises(UnknownPrice):
        _reserve("ft:gpt-4o:acme:support:abc123")


def test_an_alias_must_point_at_a_priced_model() -> None:
    seed_tenant()
    with pytest.raises(InvalidUsage, match="has no price") as refused:
        model_alias_set(pattern="my-model", model="nothing-priced")
    assert refused.value.field == "model"
    assert ModelAlias.objects.count() == 0


def test_the_most_specific_alias_wins() -> None:
    seed_tenant()
    model_alias_set(pattern="acme-*", model="gpt-4o-mini")
    model_alias_set(pattern="acme-big", model=GPT)
    assert _reserve("acme-big").reservation.price.model == GPT
    assert _reserve("acme-small").reservation.price.model == "gpt-4o-mini"


def test_a_kill_switch_on_a_model_covers_its_other_spellings() -> None:
    seed_tenant()
    budgets.trip(provider="openai", model=GPT, reason="bad outputs")
    with pytest.raises(KillSwitchActive):
        _reserve("gpt-4o-2024-08-06")


def test_a_known_exact_name_pays_no_extra_query() -> None:
    seed_tenant()
    _reserve(GPT).release()  # the end user exists: the hot path's one read
    with CaptureQueriesContext(connection) as exact:
        _reserve(GPT).release()
    with CaptureQueriesContext(connection) as dated:
        _reserve("gpt-4o-2024-08-06").release()
    exact_sql = " ".join(q["sql"] for q in exact.captured_queries)
    assert "modelalias" not in exact_sql
    # The dated name costs its extra reads (exact miss, then the catalogue's id); the exact name
    # costs none of them.
    assert len(dated.captured_queries) > len(exact.captured_queries)


def test_aliases_are_managed_in_the_admin_with_a_reason(admin_client: Client) -> None:
    seed_tenant()
    url = reverse("admin:llm_budgets_modelalias_add")
    refused = admin_client.post(url, {"pattern": "x-*", "provider": "", "model": "unpriced"})
    assert refused.status_code == 200
    assert "has no price" in refused.content.decode()
    created = admin_client.post(
        url, {"pattern": "x-*", "provider": "openai", "model": GPT, "note": "", "reason": "gw"}
    )
    assert created.status_code == 302
    alias = ModelAlias.objects.get()
    assert str(alias) == "openai/x-* -> gpt-4o"
    event = AuditEvent.objects.get(action="model_alias.add")
    assert event.reason == "gw"
    assert event.actor


def test_resolving_names_never_touches_the_network(no_network: list[object]) -> None:
    seed_tenant()
    _price("mistral", "mistral-large")
    model_names_spellings_cache_clear()
    assert _reserve("mistral-large-latest", provider="mistral").reservation.price.model == (
        "mistral-large"
    )
    assert no_network == []


def model_names_spellings_cache_clear() -> None:
    from llm_budgets.pricing import model_names

    model_names.spellings.cache_clear()
    model_names.catalogue_providers.cache_clear()
