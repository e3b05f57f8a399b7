"""The host whose base template has other block names than llm_budgets' own: the pages restyled
with docs/pages.md's recipe wear the host's layout and keep their stylesheet."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.conftest import client_for


@pytest.mark.django_db
def test_pages_wear_the_hosts_layout_with_their_stylesheet(people) -> None:
    for who in ("admin", "member"):
        page = client_for(people[who]).get(reverse("llm_budgets_pages:overview")).content.decode()
        assert "host-navbar" in page
        assert "llm_budgets/pages.css" in page
        assert 'class="lb-pages"' in page


@pytest.mark.django_db
def test_the_support_picker_renders_in_the_hosts_layout(people) -> None:
    response = client_for(people["support"]).get(reverse("llm_budgets_pages:tenants"))
    assert response.status_code == 200
    assert "host-navbar" in response.content.decode()
