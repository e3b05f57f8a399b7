"""The tenant pages: who sees what, the figures, isolation, escaping and the CSV export."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from llm_budgets import budgets
from llm_budgets.exceptions import BudgetExceeded
from llm_budgets.models import Membership, MembershipRole, Tenant, UsageRecord
from llm_budgets.money import money as money_text
from llm_budgets.pages.export import neutralise
from llm_budgets.usage import Usage
from tests.factories import reserve_30, seed
from tests.pages import ACME_MARKERS, BETA_MARKERS, PAGES, People, people, usage_data, use

pytestmark = pytest.mark.django_db


@pytest.fixture
def folks(settings: Any) -> People:
    usage_data()
    return people()


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def body(response: Any) -> str:
    """The response's text; amounts without the money format's hover markup (the exact value)."""
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode()
    return re.sub(r'<span class="llmb-money"[^>]*>(.*?)</span>', r"\1", response.content.decode())


def figures(text: str, name: str) -> list[str]:
    """The text of every ``data-figure=name`` element, tags stripped."""
    found = re.findall(rf'data-figure="{name}">(.*?)</dd>', text, flags=re.DOTALL)
    return [re.sub(r"<[^>]+>", "", value).strip() for value in found]


def export_rows(response: Any) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.reader(io.StringIO(body(response))))


@pytest.mark.parametrize("path", PAGES)
def test_anonymous_visitors_go_to_the_login_page(folks: People, path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("path", PAGES)
def test_a_user_without_a_tenant_gets_403(folks: People, path: str) -> None:
    assert client_for(folks.stranger).get(path).status_code == 403
    # Passing ?tenant= does not help anyone without the support permission.
    assert client_for(folks.stranger).get(path, {"tenant": "acme"}).status_code == 403
    assert client_for(folks.staff_only).get(path, {"tenant": "acme"}).status_code == 403


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_for_an_admin_and_a_member(folks: People, path: str) -> None:
    for user in (folks.acme_admin, folks.acme_member, folks.beta_admin):
        assert client_for(user).get(path).status_code == 200


@pytest.mark.parametrize("path", PAGES)
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"tenant": "acme"},
        {"tenant": "acme", "sort": "name", "page": "1"},
        {"start": "2000-01-01", "end": "2100-01-01"},
        {"tenant": "acme", "start": "2000-01-01", "end": "2100-01-01"},
        {"end_user": "alice-acme", "page": "2"},
    ],
)
def test_another_tenant_sees_nothing_of_acme(folks: People, path: str, params: Any) -> None:
    text = body(client_for(folks.beta_admin).get(path, params))
    for marker in ACME_MARKERS:
        assert marker not in text
        assert marker.replace("<", "&lt;").replace(">", "&gt;") not in text
    assert "Acme" not in text
    if path in ("/usage/users/", "/usage/export.csv"):
        assert "zed-beta" in text  # beta's own data is there
    # And the other way round, acme's admin and member asking for beta.
    for user in (folks.acme_admin, folks.acme_member):
        text = body(client_for(user).get(path, {**params, "tenant": "beta"}))
        for marker in BETA_MARKERS:
            assert marker not in text


def test_the_overview_shows_exactly_what_budgets_status_says(folks: People) -> None:
    text = body(client_for(folks.acme_admin).get("/usage/"))
    tenant = next(s for s in budgets.status(tenant="acme") if s.scope == "tenant")
    assert tenant.reserved == Decimal(30)
    for figure in ("limit", "spent", "reserved", "remaining"):
        shown = money_text(getattr(tenant, figure), tenant.currency)
        assert figures(text, figure)[0] == shown
    alice = next(
        s for s in budgets.status(tenant="acme", end_user="alice-acme") if s.scope == "end_user"
    )
    assert money_text(alice.spent, "USD") in text  # her own budget, in the table of end users
    assert money_text(alice.remaining, "USD") in text
    # Resets at the start of next billing month, in the tenant's timezone.
    assert "Resets 1 " in text
    assert ":00 CE" in text  # CET or CEST: Europe/Amsterdam
    # The each-user daily limit: bob has used 36 of 50 (spent 6, held 30), alice 18.
    assert "Every user may spend up to 50.00 USD in this window." in text
    assert "0 users have reached it in the current window; 1 has used 50% or more." in text
    assert "Some users near it" in text
    # The installation-wide budget's figures are other tenants' business.
    assert "global" not in text.lower()


def test_a_member_sees_only_their_own_budgets_and_usage(folks: People) -> None:
    member = client_for(folks.acme_member)
    text = body(member.get("/usage/"))
    own = next(
        s for s in budgets.status(tenant="acme", end_user="alice-acme") if s.scope == "end_user"
    )
    assert money_text(own.spent, "USD") in figures(text, "spent")
    assert money_text(own.remaining, "USD") in figures(text, "remaining")
    # Not the organisation's budget (others' spend), not other end users.
    tenant = next(s for s in budgets.status(tenant="acme") if s.scope == "tenant")
    assert money_text(tenant.spent, "USD") not in figures(text, "spent")
    for path in PAGES:
        page = body(member.get(path))
        assert "bob-acme" not in page
        assert "HYPERLINK" not in page
    rows = export_rows(member.get("/usage/export.csv"))
    assert {row[2] for row in rows[1:]} == {"alice-acme"}
    assert len(rows) == 1 + 2
    users = body(member.get("/usage/users/"))
    assert money_text(Decimal(18), "USD") in users
    # Worded for one person: their own calls, not a ranking of one at 100%.
    assert "Your calls" in users
    assert "100.0%" not in users
    assert "Top users" not in users
    assert "Only your own calls are shown here" in users


def test_the_overview_shows_the_tenants_run_and_tag_budgets_to_its_admins(folks: People) -> None:
    text = body(client_for(folks.acme_admin).get("/usage/"))
    section = text[text.index('id="lb-scoped"') :]
    assert "Tag project=acme-secret" in section
    assert "Run run-acme-secret" in section
    assert "80.00 USD" in section
    assert "beta-secret" not in text
    # A member sees only their own budgets: runs and tags are the organisation's.
    member = body(client_for(folks.acme_member).get("/usage/"))
    assert "acme-secret" not in member
    assert 'id="lb-scoped"' not in member
    # Support sees them with ?tenant=; beta's admin sees beta's own tag only.
    assert "acme-secret" in body(client_for(folks.support).get("/usage/", {"tenant": "acme"}))
    beta = body(client_for(folks.beta_admin).get("/usage/", {"tenant": "acme"}))
    assert "Tag project=beta-secret" in beta


def test_a_member_whose_end_user_has_no_usage_sees_empty_pages(folks: People) -> None:
    Membership.objects.filter(user=folks.acme_member).update(end_user_external_id="nobody-yet")
    member = client_for(folks.acme_member)
    for path in PAGES:
        assert member.get(path).status_code == 200
    # Empty states say why: nothing charged since the period began (the figures are live).
    for path in ("/usage/users/", "/usage/models/"):
        assert "You have made no charged call since this billing period began on" in body(
            member.get(path)
        )
    assert len(export_rows(member.get("/usage/export.csv"))) == 1


def test_support_staff_may_open_any_tenant(folks: People) -> None:
    support = client_for(folks.support)
    text = body(support.get("/usage/users/", {"tenant": "beta"}))
    assert "zed-beta" in text
    assert "bob-acme" not in text
    assert "Support view" in text
    assert "?tenant=beta" in text  # the navigation keeps the tenant
    rows = export_rows(support.get("/usage/export.csv", {"tenant": "acme"}))
    assert len(rows) == 1 + 5
    assert support.get("/usage/", {"tenant": "nope"}).status_code == 404
    # Without ?tenant= support staff have no tenant of their own: they choose one.
    picker = body(support.get("/usage/"))
    assert "Choose a tenant" in picker
    assert 'href="/usage/?tenant=beta"' in picker


def test_tenant_parameter_chooses_only_among_ones_own_memberships(folks: People) -> None:
    Membership.objects.create(
        user=folks.beta_admin,
        tenant=Tenant.objects.get(external_id="acme"),
        role=MembershipRole.MEMBER,
        end_user_external_id="bob-acme",
    )
    bea = client_for(folks.beta_admin)
    # Without ?tenant=: her first membership by tenant id (acme), where she is a member.
    text = body(bea.get("/usage/users/"))
    assert "bob-acme" in text
    assert "alice-acme" not in text
    assert "zed-beta" not in text
    text = body(bea.get("/usage/users/", {"tenant": "beta"}))
    assert "zed-beta" in text
    assert "bob-acme" not in text
    # A tenant she has no membership of falls back to her first one.
    budgets.ensure_tenant(tenant="gamma")
    assert "bob-acme" in body(bea.get("/usage/users/", {"tenant": "gamma"}))


def test_names_from_the_ledger_are_escaped(folks: People) -> None:
    admin = client_for(folks.acme_admin)
    users = body(admin.get("/usage/users/"))
    assert "<script>acme</script>" not in users
    assert "&lt;script&gt;acme&lt;/script&gt;" in users
    overview = body(admin.get("/usage/"))
    assert "Acme <b>Corp</b>" not in overview
    assert "Acme &lt;b&gt;Corp&lt;/b&gt;" in overview


def test_the_export_has_a_header_and_one_row_per_ledger_line_in_local_time(
    folks: People,
) -> None:
    rows = export_rows(client_for(folks.acme_admin).get("/usage/export.csv"))
    assert rows[0][:5] == ["time", "kind", "end_user", "provider", "model"]
    lines = UsageRecord.objects.filter(tenant__external_id="acme")
    assert len(rows) - 1 == lines.count() == 5
    assert all(row[0].endswith(("+01:00", "+02:00")) for row in rows[1:])
    cost = rows[0].index("cost")
    costs = sorted(Decimal(row[cost]) for row in rows[1:])
    assert costs == sorted(lines.values_list("cost", flat=True))
    # A name a spreadsheet would run as a formula is neutralised.
    assert "'=HYPERLINK(acme)" in {row[2] for row in rows}
    assert "=HYPERLINK(acme)" not in {row[2] for row in rows}


@pytest.mark.parametrize(
    ("text", "cell"),
    [
        ("=1+2", "'=1+2"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1", "'\t'=1"),  # a tab is a separator too
        ("plain", "plain"),
        ("a=b", "a=b"),
    ],
)
def test_neutralise(text: str, cell: str) -> None:
    assert neutralise(text) == cell


def test_the_export_range_is_in_local_days_and_checked(folks: People) -> None:
    admin = client_for(folks.acme_admin)
    assert (
        len(
            export_rows(
                admin.get("/usage/export.csv", {"start": "2000-01-01", "end": "2000-01-31"})
            )
        )
        == 1
    )
    bad = admin.get("/usage/export.csv", {"start": "yesterday"})
    assert bad.status_code == 400
    assert "YYYY-MM-DD" in bad.content.decode()
    reversed_range = admin.get("/usage/export.csv", {"start": "2026-02-02", "end": "2026-02-01"})
    assert reversed_range.status_code == 400
    assert "before the first" in reversed_range.content.decode()


def test_the_export_of_every_day_there_is_is_the_whole_ledger(folks: People) -> None:
    # The calendar's first and last days have no start or end in every timezone (issue #22.7:
    # this was a 500, an OverflowError).
    admin = client_for(folks.acme_admin)
    rows = export_rows(admin.get("/usage/export.csv", {"start": "0001-01-01", "end": "9999-12-31"}))
    assert len(rows) - 1 == UsageRecord.objects.filter(tenant__external_id="acme").count()
    for first, last in (("9999-12-30", "9999-12-31"), ("0001-01-01", "0001-01-02")):
        rows = export_rows(admin.get("/usage/export.csv", {"start": first, "end": last}))
        assert len(rows) == 1


@pytest.mark.parametrize(
    "params",
    [{"start": "yesterday"}, {"end": "2026-13-01"}, {"start": "2026-02-02", "end": "2026-02-01"}],
)
def test_a_bad_export_range_gets_the_pages_own_error_page(folks: People, params: Any) -> None:
    response = client_for(folks.acme_admin).get("/usage/export.csv", params)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    text = body(response)
    assert 'class="lb-pages"' in text  # the pages' frame, navigation included
    assert 'role="alert"' in text
    assert "Back to the overview" in text
    assert response["Cache-Control"] == "private, no-store"
    # A page of its own (issue #33): a language and a title, and the export's form again with the
    # days entered, the error beside it and the inputs pointing at it.
    assert '<html lang="en' in text
    assert "<title>Cannot export this range" in text
    assert 'id="lb-export-error" role="alert"' in text
    assert text.count('aria-describedby="lb-export-error"') == 2
    for value in params.values():
        assert f'value="{value}"' in text


@pytest.mark.parametrize("path", [*PAGES, "/usage/tenants/"])
def test_private_pages_and_the_export_are_never_cached(folks: People, path: str) -> None:
    viewer = folks.support if path == "/usage/tenants/" else folks.acme_admin
    response = client_for(viewer).get(path)
    assert response.status_code == 200
    assert response["Cache-Control"] == "private, no-store"


def test_support_links_encode_the_tenant(folks: People) -> None:
    budgets.ensure_tenant(tenant="plus+one")
    seed(tenant="plus+one", limit="1000")
    use("plus+one", "pat-plus", 10)
    budgets.ensure_tenant(tenant="plus one")
    support = client_for(folks.support)
    text = body(support.get("/usage/", {"tenant": "plus+one"}))
    assert 'href="/usage/models/?tenant=plus%2Bone"' in text
    assert "?tenant=plus+one" not in text
    # Following "By day and model" opens the same tenant (not "plus one").
    models = support.get("/usage/models/?tenant=plus%2Bone")
    assert models.context["tenant"].external_id == "plus+one"


# A name that runs as a formula where the list separator is ";" (issue #22.7).
SEMICOLON_FORMULA = "x;=1+1;=cmd|' /C calc'!A0"


@pytest.mark.parametrize("separator", [",", ";", "\t", "|"])
def test_no_cell_of_the_export_is_a_formula_whatever_the_separator(
    folks: People, separator: str
) -> None:
    for name in (SEMICOLON_FORMULA, "a,@SUM(1)", "c| +1", 'd;"=1"'):
        use("acme", name, 1)
    tagged = reserve_30(tenant="acme", end_user="e", tags={"t": "v\t-2+3;=1"})
    tagged.commit(input_tokens=0, output_tokens=1)
    tool = UsageRecord.objects.filter(end_user__external_id="bob-acme").first()
    assert tool is not None
    UsageRecord.objects.filter(pk=tool.pk).update(tool_calls={"=x;=y": 1})
    text = body(client_for(folks.acme_admin).get("/usage/export.csv"))
    cells = [cell for row in csv.reader(io.StringIO(text), delimiter=separator) for cell in row]
    assert len(cells) > 10
    for cell in cells:
        stripped = cell.lstrip(' "')
        if stripped.startswith(("=", "+", "-", "@", "\t", "\r")):
            Decimal(stripped)  # only the app's own numbers (a negative amount) may
    assert "'=1+1" in text


@pytest.mark.parametrize(
    ("text", "cell"),
    [
        ("x;=1+1", "x;'=1+1"),
        ("x, @y", "x, '@y"),
        ('x;"=1"', 'x;"\'=1"'),
        ("a-b", "a-b"),
        ("a;b", "a;b"),
    ],
)
def test_neutralise_after_a_separator(text: str, cell: str) -> None:
    assert neutralise(text) == cell


def test_the_export_has_a_column_for_every_usage_field(folks: People) -> None:
    # The export's usage columns come from the one definition of usage (issue #22.10): a field
    # added to Usage fails here until the export carries it.
    hold = reserve_30(tenant="acme", end_user="carol-acme", max_tool_calls={"web_search": 2})
    hold.commit(
        input_tokens=40,
        output_tokens=7,
        cache_write_tokens=30,
        cache_write_1h_tokens=20,
        tool_calls={"web_search": 2},
    )
    rows = export_rows(client_for(folks.acme_admin).get("/usage/export.csv"))
    header = rows[0]
    usage_fields = [f.name for f in dataclasses.fields(Usage)]
    assert set(usage_fields) <= set(header)
    # Each is a column of the ledger line too, and the export writes its value.
    assert set(Usage(input_tokens=0, output_tokens=0).as_fields()) == set(usage_fields)
    (row,) = [r for r in rows[1:] if r[header.index("end_user")] == "carol-acme"]
    assert row[header.index("cache_write_1h_tokens")] == "20"
    assert row[header.index("tool_calls")] == '{"web_search": 2}'
    assert "E-" not in ",".join(row)  # amounts in plain digits, never 0E-10


def test_charts_are_svg_with_a_text_equivalent(folks: People) -> None:
    admin = client_for(folks.acme_admin)
    models = body(admin.get("/usage/models/"))
    assert models.count('role="img"') == 3
    assert '<title id="lb-day-title">Spend by day</title>' in models
    # The running total against the monthly limit (acme's 1000), with a column in the table.
    assert '<title id="lb-run-title">Running total against the limit</title>' in models
    assert 'class="lb-limit"' in models
    assert "Limit: 1,000.00 USD" in models
    assert "Running total" in models
    # Cost by day stacked by model, the model's name on each part and in the legend.
    assert '<title id="lb-stack-title">Spend by model, day by day</title>' in models
    assert 'class="lb-series lb-series-0"' in models
    assert "m30 (fake)" in models
    assert "<table" in models
    assert "<script" not in models  # no JavaScript at all
    users = body(admin.get("/usage/users/"))
    assert 'role="img"' in users
    # Sorted by spend: alice (18.00) before bob (6.00).
    assert users.index("alice-acme") < users.index("bob-acme")
    by_name = body(admin.get("/usage/users/", {"sort": "name"}))
    table = by_name[by_name.index("<tbody>") :]
    assert table.index("&lt;script") < table.index("=HYPERLINK") < table.index("alice-acme")


def test_end_users_are_paginated(folks: People, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_budgets.pages import figures

    monkeypatch.setattr(figures, "PAGE_ROWS", 2)
    admin = client_for(folks.acme_admin)
    first = body(admin.get("/usage/users/"))
    assert "Page 1 of 2" in first
    second = body(admin.get("/usage/users/", {"page": "2"}))
    assert "Page 2 of 2" in second
    assert "alice-acme" not in second.split("<tbody>")[1]


def test_refusals_say_what_was_asked_what_was_left_and_when_it_resets(folks: People) -> None:
    budgets.set_limit(tenant="acme", end_user="bob-acme", amount=Decimal(20), window="day")
    with pytest.raises(BudgetExceeded):
        reserve_30(tenant="acme", end_user="bob-acme")
    text = body(client_for(folks.acme_admin).get("/usage/refusals/"))
    assert "for user bob-acme needed up to 30.00 USD" in text
    # Her own new budget counts from now: all 20.00 of it was left.
    assert "had only 20.00 USD left" in text
    # 30 is more than the whole 20: waiting for the reset would not help, and the page says so.
    assert "no reset makes room for it" in text
    budgets.set_limit(tenant="acme", end_user="cy-acme", amount=Decimal(45), window="day")
    reserve_30(tenant="acme", end_user="cy-acme")
    with pytest.raises(BudgetExceeded):
        reserve_30(tenant="acme", end_user="cy-acme")  # 30 more than what is left, not the limit
    text = body(client_for(folks.acme_admin).get("/usage/refusals/"))
    assert text.count("That budget resets") == 1
    # Members see their own refusals only; another tenant none.
    assert "bob-acme" not in body(client_for(folks.acme_member).get("/usage/refusals/"))
    assert "bob-acme" not in body(client_for(folks.beta_admin).get("/usage/refusals/"))


def test_a_refusal_by_the_global_cap_shows_no_figure_of_it(folks: People) -> None:
    # A new global cap counts from now: all 20 of it left, less than the call's 30.
    budgets.set_limit(amount=Decimal(20), window="month")
    with pytest.raises(BudgetExceeded) as refused:
        reserve_30(tenant="acme", end_user="carol-acme")
    assert refused.value.remaining == 20  # in process (the host's code): the figures
    text = body(client_for(folks.acme_admin).get("/usage/refusals/"))
    assert "needed up to 30.00 USD, but the service's overall limit could not admit it" in text
    assert "20.00 USD" not in text


def test_open_kill_switches_show_with_their_reason(folks: People) -> None:
    budgets.trip(tenant="acme", reason="Paused while we review unusual traffic")
    budgets.trip(tenant="beta", reason="beta's own business")
    text = body(client_for(folks.acme_admin).get("/usage/"))
    assert "All calls for your organisation are paused" in text
    assert "Paused while we review unusual traffic" in text
    assert "beta&#x27;s own business" not in text


def test_pages_accept_only_get_and_the_login_form_needs_csrf(folks: People) -> None:
    admin = client_for(folks.acme_admin)
    assert admin.post("/usage/").status_code == 405
    strict = Client(enforce_csrf_checks=True)
    response = strict.post("/accounts/login/", {"username": "ann", "password": "pw"})
    assert response.status_code == 403
    form = strict.get("/accounts/login/?next=/usage/")
    assert "csrfmiddlewaretoken" in form.content.decode()


def test_a_custom_resolver_decides_the_tenant(folks: People, settings: Any) -> None:
    settings.LLM_BUDGETS = {
        **settings.LLM_BUDGETS,
        "TENANT_RESOLVER": "tests.test_pages.header_tenant",
    }
    client = Client(HTTP_X_TENANT="beta")
    assert "zed-beta" in body(client.get("/usage/users/"))
    assert Client().get("/usage/").status_code == 302  # no header, anonymous: log in
    assert client_for(folks.stranger).get("/usage/").status_code == 403


def header_tenant(request: Any) -> str | None:
    return request.headers.get("X-Tenant")


def test_pages_run_a_fixed_number_of_queries_however_many_end_users(folks: People) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.pages import rebuild_rollups, use

    admin = client_for(folks.acme_admin)

    def counts() -> list[int]:
        result = []
        for path in PAGES[:4]:
            with CaptureQueriesContext(connection) as queries:
                assert admin.get(path).status_code == 200
            result.append(len(queries))
        return result

    before = counts()
    for index in range(12):
        use("acme", f"extra-{index}", 1)
        budgets.set_limit(tenant="acme", end_user=f"extra-{index}", amount=Decimal(5), window="day")
    rebuild_rollups()
    assert counts() == before


def test_a_call_stopped_by_a_pause_says_so_with_the_reason(folks: People) -> None:
    from llm_budgets.exceptions import KillSwitchActive

    budgets.trip(tenant="acme", model="m30", reason="Model under review")
    with pytest.raises(KillSwitchActive):
        reserve_30(tenant="acme", end_user="alice-acme")
    text = body(client_for(folks.acme_admin).get("/usage/refusals/"))
    assert "A call to m30 was stopped because calls were paused." in text
    assert "Reason given: Model under review" in text
    assert "Calls to m30 are paused" in body(client_for(folks.acme_member).get("/usage/"))
    assert "Model under review" not in body(client_for(folks.beta_admin).get("/usage/refusals/"))
