"""The pages inside a host's own layout (issue 23): a base template with other block names, the
template contract's checks, and no 500 when the host shows the header outside its block."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client, override_settings

from llm_budgets.pages.checks import check_pages_base
from tests.pages import People, people, usage_data

# A host's layout as cookiecutter-django and most products write it: none of the pages' block
# names (no styles, extra_head, extra_css, header, nav, footer).
HOST_BASE = """<!DOCTYPE html><html><head><title>{% block page_title %}Product{% endblock %}</title>
<link rel="stylesheet" href="/static/product.css">{% block head_css %}{% endblock %}</head>
<body><nav class="product-nav">Product menu</nav>
<div class="container">{% block main %}{% endblock %}</div></body></html>"""

# The recipe of docs/pages.md, "Restyling and embedding in the host's layout".
RECIPE = """{% extends "myproduct/base.html" %}
{% block head_css %}{{ block.super }}{% include "llm_budgets/pages/_styles.html" %}{% endblock %}
{% block main %}
  <div class="lb-pages">
    {% block header %}{% include "llm_budgets/pages/_header.html" %}{% endblock %}
    {% block nav %}{% include "llm_budgets/pages/_nav.html" %}{% endblock %}
    <main id="lb-main" class="lb-main">{% block content %}{% endblock %}</main>
    {% block footer %}{% include "llm_budgets/pages/_footer.html" %}{% endblock %}
  </div>
{% endblock %}"""

# What a host did: the header and footer copied into its layout without their blocks.
WITHOUT_BLOCKS = """{% extends "myproduct/base.html" %}
{% block main %}
  {% include "llm_budgets/pages/_header.html" %}
  {% include "llm_budgets/pages/_nav.html" %}
  {% block content %}{% endblock %}
  {% include "llm_budgets/pages/_footer.html" %}
{% endblock %}"""


def _host_templates(tmp_path: Path, override: str) -> override_settings:
    (tmp_path / "myproduct").mkdir()
    (tmp_path / "myproduct" / "base.html").write_text(HOST_BASE)
    (tmp_path / "llm_budgets" / "pages").mkdir(parents=True)
    (tmp_path / "llm_budgets" / "pages" / "base.html").write_text(override)
    templates = copy.deepcopy(settings.TEMPLATES)
    templates[0]["DIRS"] = [tmp_path, *templates[0]["DIRS"]]
    return override_settings(TEMPLATES=templates)


@pytest.fixture
def folks(db: None) -> People:
    usage_data()
    return people()


def _get(user: object, path: str, **query: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(path, query)
    assert response.status_code == 200, (path, response.status_code)
    return response.content.decode()


def test_the_recipe_renders_every_page_in_a_base_with_other_block_names(
    folks: People, tmp_path: Path
) -> None:
    with _host_templates(tmp_path, RECIPE):
        assert check_pages_base() == []
        for path in ("/usage/", "/usage/models/", "/usage/users/", "/usage/refusals/"):
            text = _get(folks.acme_admin, path)
            assert "Product menu" in text  # the host's layout
            assert "llm_budgets/pages.css" in text  # styled
            assert 'class="lb-nav"' in text
            assert "Acme" in text  # the header with the tenant's name
        picker = _get(folks.support, "/usage/")
        assert "Choose a tenant" in picker
        assert 'class="lb-nav"' not in picker  # the picker empties the nav block


def test_a_header_shown_outside_its_block_does_not_break_the_picker(
    folks: People, tmp_path: Path
) -> None:
    with _host_templates(tmp_path, WITHOUT_BLOCKS):
        picker = _get(folks.support, "/usage/")
        assert "Choose a tenant" in picker
        assert "Times are shown in ." not in picker
        member = _get(folks.acme_member, "/usage/")
        assert "Showing your own usage (alice-acme)." in member


def test_the_checks_name_a_block_the_host_base_lacks_and_a_missing_content(
    tmp_path: Path,
) -> None:
    unstyled = RECIPE.replace("{% block head_css %}", "{% block extra_css %}")
    with _host_templates(tmp_path, unstyled):
        (warning,) = check_pages_base()
    assert warning.id == "llm_budgets.W085"
    assert "'extra_css'" in warning.msg
    assert "head_css, main" in warning.hint

    blank = tmp_path / "blank"
    blank.mkdir()
    with _host_templates(
        blank, '{% extends "myproduct/base.html" %}{% block main %}x{% endblock %}'
    ):
        (error,) = check_pages_base()
    assert error.id == "llm_budgets.E086"
    assert "content" in error.msg


def test_the_apps_own_base_needs_no_check() -> None:
    assert check_pages_base() == []
