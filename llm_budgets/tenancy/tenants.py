"""Tenants and end users: created on first sight, race-free."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone as django_timezone

from llm_budgets import validation
from llm_budgets.alerts.endpoints import billing_contacts_set
from llm_budgets.db import statements as sql
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.db.ledger import configuration_written
from llm_budgets.exceptions import InvalidUsage, UnknownTenant
from llm_budgets.models import AuditEvent, EndUser, Plan, Tenant, Window
from llm_budgets.windows import period_for


def tenant_get(external_id: str) -> Tenant:
    external_id = validation.identifier("tenant", external_id)
    try:
        return Tenant.objects.select_related("plan").get(external_id=external_id)
    except Tenant.DoesNotExist:
        raise UnknownTenant(external_id) from None


def tenant_with_plan(external_id: str) -> Tenant:
    """:func:`tenant_get` for admission: the tenant and its plan in one statement without the
    ORM's compilation (``db.statements``), always on the primary, as admission's other
    reads are. ``UnknownTenant`` if there is none."""
    external_id = validation.identifier("tenant", external_id)
    rows = sql.fetch(_tenant_with_plan_sql(), [external_id])
    if not rows:
        raise UnknownTenant(external_id)
    tenant = sql.row_to(Tenant, rows[0])
    tenant.plan = sql.row_to_or_none(Plan, rows[0], sql.width(Tenant))
    return tenant


@functools.cache
def _tenant_with_plan_sql() -> str:
    return (
        f"SELECT {sql.columns(Tenant, 't')}, {sql.columns(Plan, 'p')}"  # noqa: S608
        f" FROM {sql.table(Tenant)} t"
        f" LEFT JOIN {sql.table(Plan)} p ON p.id = t.{sql.column(Tenant, 'plan')}"
        f" WHERE t.{sql.column(Tenant, 'external_id')} = %s"
    )


@ledger_guard("tenants")
def tenant_ensure(
    external_id: str,
    *,
    name: str | None = None,
    timezone: str | None = None,
    billing_day: int | None = None,
    plan: Plan | str | None = None,
    billing_emails: str | None = None,
    markup_percent: object = None,
    actor: str = "",
    now: datetime | None = None,
) -> Tenant:
    """Create the tenant, or update the fields given. Returns the tenant.

    ``billing_emails``: the billing contacts who receive budget warnings, separated by commas or
    new lines (``""`` clears them).

    ``markup_percent`` overrides the plan's markup for customer prices.

    A new timezone or billing day takes effect at the end of the current monthly period (see
    ``_schedule_calendar_change``), so a change can never reset a budget early."""
    external_id = validation.identifier("tenant", external_id)
    if billing_day is not None and (
        isinstance(billing_day, bool)
        or not isinstance(billing_day, int)
        or not 1 <= billing_day <= 31
    ):
        raise InvalidUsage(
            f"billing_day must be a whole number from 1 to 31, got {billing_day!r}.",
            field="billing_day",
        )
    if isinstance(plan, str):
        try:
            plan = Plan.objects.get(name=plan)
        except Plan.DoesNotExist:
            raise InvalidUsage(f"No plan is named {plan!r}.", field="plan") from None
    changes = {
        key: value
        for key, value in {
            "name": name,
            "timezone": timezone,
            "billing_day": billing_day,
            "plan": plan,
            "markup_percent": validation.optional_money("markup_percent", markup_percent),
        }.items()
        if value is not None
    }
    with transaction.atomic():
        tenant, created = Tenant.objects.select_for_update().get_or_create(
            external_id=external_id, defaults=changes
        )
        configuration_written(tenant.pk)
        before = {key: _plain(getattr(tenant, key)) for key in changes}
        if not created:
            _schedule_calendar_change(tenant, changes, now or django_timezone.now())
            for key, value in changes.items():
                setattr(tenant, key, value)
        try:
            tenant.full_clean()
        except ValidationError as exc:
            field, messages = next(iter(exc.message_dict.items()))
            raise InvalidUsage(f"{field}: {' '.join(messages)}", field=field) from None
        if billing_emails is not None:
            # The billing contacts are an email endpoint of the tenant's (docs/alerts.md).
            if not created:
                before["billing_emails"] = tenant.billing_emails
            billing_contacts_set(tenant, billing_emails, actor=actor)
            changes = {**changes, "billing_emails": billing_emails}
        if created or any(
            before[key] != _plain(tenant.billing_emails if key == "billing_emails" else value)
            for key, value in changes.items()
        ):
            tenant.save()
            AuditEvent.objects.create(
                action="tenant.create" if created else "tenant.update",
                actor=actor,
                tenant=tenant,
                target=f"tenant {external_id}",
                before=None if created else before,
                after=_after(tenant, changes),
            )
    return tenant


def _schedule_calendar_change(tenant: Tenant, changes: Mapping[str, object], now: datetime) -> None:
    """Keep the calendar in effect until the end of the current monthly period.

    A change made while an earlier one is still pending replaces the pending one (same effective
    moment); changing back to the calendar in effect cancels it."""
    new_timezone = changes.get("timezone", tenant.timezone)
    new_billing_day = changes.get("billing_day", tenant.billing_day)
    if (new_timezone, new_billing_day) == (tenant.timezone, tenant.billing_day):
        return
    pending = tenant.calendar_effective_from is not None and now < tenant.calendar_effective_from
    if not pending:
        tenant.previous_timezone = tenant.timezone
        tenant.previous_billing_day = tenant.billing_day
        tenant.calendar_effective_from = period_for(
            Window.MONTH, now, timezone=tenant.timezone, billing_day=tenant.billing_day
        ).end
    if (new_timezone, new_billing_day) == (tenant.previous_timezone, tenant.previous_billing_day):
        tenant.previous_timezone, tenant.previous_billing_day = "", None
        tenant.calendar_effective_from = None


def tenant_with_end_user(tenant: str, end_user: str | None) -> tuple[Tenant, EndUser | None]:
    """The tenant and, if it has been seen before, the end user: one query in the common case.
    Creates nothing (``end_user_ensure`` does, once the request is known to be valid)."""
    if end_user is not None:
        tenant = validation.identifier("tenant", tenant)
        end_user = validation.identifier("end_user", end_user)
        text = f"SELECT {end_user_columns_sql()} {end_user_from_sql()} {end_user_where_sql()}"
        rows = sql.fetch(text, [tenant, end_user])
        if rows:
            user = end_user_from_row(rows[0])
            return user.tenant, user
    return tenant_with_plan(tenant), None


# An end user by external ids with its tenant and the tenant's plan, in one statement without
# the ORM's compilation (``llm_budgets.db.statements``): admission's first read, alone or in
# ``engine.applicable.admission_context``. Parameters: tenant and end user external ids.


@functools.cache
def end_user_columns_sql() -> str:
    """The columns :func:`end_user_from_row` reads: end user ``u``, tenant ``t``, plan ``p``."""
    return f"{sql.columns(EndUser, 'u')}, {sql.columns(Tenant, 't')}, {sql.columns(Plan, 'p')}"


@functools.cache
def end_user_from_sql() -> str:
    """``FROM`` the end user ``u``, its tenant ``t`` and plan ``p``; more joins may follow."""
    return (
        f"FROM {sql.table(EndUser)} u"
        f" JOIN {sql.table(Tenant)} t ON t.id = u.{sql.column(EndUser, 'tenant')}"
        f" LEFT JOIN {sql.table(Plan)} p ON p.id = t.{sql.column(Tenant, 'plan')}"
    )


@functools.cache
def end_user_where_sql() -> str:
    """``WHERE`` the tenant and end user have the given external ids (two parameters)."""
    return (
        f"WHERE t.{sql.column(Tenant, 'external_id')} = %s"
        f" AND u.{sql.column(EndUser, 'external_id')} = %s"
    )


def end_user_from_row(row: Sequence[object]) -> EndUser:
    """The end user at the start of ``row``, with its tenant and plan attached (no queries)."""
    user = sql.row_to(EndUser, row)
    user.tenant = sql.row_to(Tenant, row, sql.width(EndUser))
    user.tenant.plan = sql.row_to_or_none(Plan, row, sql.width(EndUser) + sql.width(Tenant))
    return user


def end_user_row_width() -> int:
    """How many columns :func:`end_user_columns_sql` selects."""
    return sql.width(EndUser) + sql.width(Tenant) + sql.width(Plan)


def end_user_ensure(tenant: Tenant, external_id: str) -> EndUser:
    """The end user, created on first sight. Concurrent first requests all get the same row."""
    external_id = validation.identifier("end_user", external_id)
    try:
        return EndUser.objects.get(tenant=tenant, external_id=external_id)
    except EndUser.DoesNotExist:
        # ON CONFLICT DO NOTHING, then read: whoever inserted first, everyone sees one row.
        EndUser.objects.bulk_create(
            [EndUser(tenant=tenant, external_id=external_id)], ignore_conflicts=True
        )
        return EndUser.objects.get(tenant=tenant, external_id=external_id)


def _after(tenant: Tenant, changes: Mapping[str, object]) -> dict[str, object]:
    after = {key: _plain(value) for key, value in changes.items()}
    if tenant.calendar_effective_from is not None and (
        "timezone" in changes or "billing_day" in changes
    ):
        after["calendar_effective_from"] = tenant.calendar_effective_from.isoformat()
    return after


def _plain(value: object) -> object:
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    return value.name if isinstance(value, Plan) else value
