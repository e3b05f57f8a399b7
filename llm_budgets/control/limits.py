"""Setting limits: one budget per (scope, window); a change is audited."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.db.models import ProtectedError, Q

from llm_budgets import validation
from llm_budgets.conf import conf
from llm_budgets.control.self_serve import (
    SELF_SERVE_SCOPES,
    TenantAdmin,
    raises_active,
    self_serve_authorize,
    self_serve_limit_check,
)
from llm_budgets.db.boundary import ledger_guard
from llm_budgets.db.ledger import configuration_written
from llm_budgets.exceptions import InvalidUsage, SelfServeDenied
from llm_budgets.models import ApiKey, AuditEvent, Budget, BudgetUnit, Counter, Scope, Tenant
from llm_budgets.models.budgets import MAX_STRIPES
from llm_budgets.tags import tags_validate
from llm_budgets.tenancy.runs import run_ensure, run_validate
from llm_budgets.tenancy.tenants import end_user_ensure, tenant_get
from llm_budgets.windows import window_name

ALL_END_USERS = "*"
ALL = "*"  # each API key / each run of the tenant, on a counter of its own


@ledger_guard("limits")
def budget_set_limit(
    *,
    amount: object,
    window: str,
    tenant: str | None = None,
    end_user: str | None = None,
    actor: str = "",
    reason: str = "",
    unit: str | None = None,
    api_key: str | None = None,
    run: str | None = None,
    tag: object = None,
    hot: object = None,
    stripes: object = None,
    acting: TenantAdmin | None = None,
) -> Budget:
    """Create or change the budget for a scope and window.

    No tenant: the global cap. A tenant: its cap. ``end_user="*"``: the default for each end user of
    the tenant. ``end_user="u-1"``: that end user's own budget, which replaces the default for the
    same window. ``unit``: what the budget counts, ``provider_cost`` (default) or
    ``customer_price``; fixed once the budget has counted anything. ``window`` is ``month``,
    ``day``, ``hour``, ``lifetime`` or a rolling duration such as ``rolling:1h`` / ``rolling:7d``
    (stored canonically: ``rolling:24h`` is ``rolling:1d``).

    With a tenant, at most one of: ``api_key`` (a REST API key's prefix, or ``"*"`` for each of
    the tenant's keys on a counter of its own), ``run`` (a run id, or ``"*"`` for each run:
    usually ``window="lifetime"``, which ends when the run is closed) or ``tag`` (a
    ``(key, value)`` pair such as ``("project", "alpha")``: every call tagged so).

    ``hot=True`` splits the budget's counter into ``stripes`` rows (default 8, at most 64) so
    admissions under it do not all lock one row (docs/design/hot-caps.md); ``hot=False`` joins
    them again; None leaves it as it is (a new budget is not hot).

    ``acting``: a tenant admin (control/self_serve.py): only their own tenant's end-user, key,
    run and tag budgets, within the self-serve ceiling; audited as them.
    """
    if hot is not None and not isinstance(hot, bool):
        raise InvalidUsage(f"hot must be True or False, got {hot!r}.", field="hot")
    if stripes is not None and (
        not isinstance(stripes, int) or isinstance(stripes, bool) or not 1 <= stripes <= MAX_STRIPES
    ):
        raise InvalidUsage(
            f"stripes must be a whole number from 1 to {MAX_STRIPES}, got {stripes!r}.",
            field="stripes",
        )
    if unit is not None and unit not in BudgetUnit.values:
        raise InvalidUsage(
            f"unit must be one of {', '.join(BudgetUnit.values)}, got {unit!r}.", field="unit"
        )
    limit = validation.money("amount", amount)
    window = window_name(window)
    if end_user is not None and tenant is None:
        raise InvalidUsage(
            "end_user needs a tenant: end users belong to one tenant.", field="tenant"
        )
    named = {"end_user": end_user, "api_key": api_key, "run": run, "tag": tag}
    given = [name for name, value in named.items() if value is not None]
    if len(given) > 1:
        raise InvalidUsage(
            f"A budget has one scope; got {' and '.join(given)}. Set one budget for each.",
            field=given[1],
        )
    if given and tenant is None:
        raise InvalidUsage(
            f"{given[0]} needs a tenant: its budgets belong to one tenant.", field="tenant"
        )
    if acting is not None:
        actor = acting.actor
        if hot is not None or stripes is not None:
            raise SelfServeDenied(
                "A budget's shape (hot, stripes) is the operators' to set.",
                action="budgets",
                field="hot" if hot is not None else "stripes",
            )
    with transaction.atomic():
        lookup: dict[str, object]
        if acting is not None:
            self_serve_authorize(
                acting, action="budgets", tenant=None if tenant is None else tenant_get(tenant)
            )
        if tenant is None:
            lookup = {"scope": Scope.GLOBAL}
        else:
            tenant_obj = tenant_get(tenant)
            if api_key is not None or run is not None or tag is not None:
                lookup = _scope_lookup(tenant_obj, api_key=api_key, run=run, tag=tag)
            elif end_user is None:
                lookup = {"scope": Scope.TENANT, "tenant": tenant_obj}
            elif end_user == ALL_END_USERS:
                lookup = {"scope": Scope.END_USER_DEFAULT, "tenant": tenant_obj}
            else:
                user = end_user_ensure(tenant_obj, end_user)
                lookup = {"scope": Scope.END_USER, "tenant": tenant_obj, "end_user": user}
        if acting is not None:
            _self_serve_check(acting, lookup, window=window, limit=limit)
        budget = (
            Budget.objects.select_for_update(of=("self",))
            .select_related("tenant", "end_user", "api_key", "run")
            .filter(window=window, **lookup)
            .first()
        )
        # Locked in the caller's transaction: admission of its tenant must not wait on it.
        configuration_written(getattr(lookup.get("tenant"), "pk", None))
        if budget is not None and budget.prepaid:
            # Its limit is the sum of its credit lots: only billing/credits.py changes it.
            raise InvalidUsage(
                f"budget {budget.pk} is {budget.tenant.external_id}'s prepaid balance: change it "  # type: ignore[union-attr]
                "with a top-up, a grant or a balance adjustment, not a limit.",
                field="amount",
            )
        if acting is not None and budget is not None:
            # A raise in force counts against the ceiling too.
            self_serve_limit_check(
                budget.tenant,  # type: ignore[arg-type]
                window=window,
                amount=limit + raises_active(budget),
                action="budgets",
            )
        before = None if budget is None else {"limit": str(budget.limit)}
        shape: dict[str, object] = {"hot": hot, "stripes": stripes}
        if budget is None:
            budget = Budget.objects.create(
                window=window,
                limit=limit,
                currency=conf.CURRENCY,
                unit=unit or BudgetUnit.PROVIDER_COST,
                **lookup,
                **{k: v for k, v in shape.items() if v is not None},
            )
        elif unit is not None and unit != budget.unit:
            raise InvalidUsage(
                f"budget {budget.pk} counts {budget.unit}; its unit cannot change, because its "
                "counters already hold amounts in that unit. Set a budget for another window.",
                field="unit",
            )
        elif budget.limit != limit:
            budget.limit = limit
            budget.save(update_fields=["limit", "updated_at"])
        elif all(v is None or getattr(budget, k) == v for k, v in shape.items()):
            return budget
        after: dict[str, object] = {"limit": str(limit)}
        if before is not None:
            was = {"hot": budget.hot, "stripes": budget.stripes}
            if budget_set_hot(budget, hot=hot, stripes=stripes):
                before.update(was)  # type: ignore[arg-type]
                after.update(hot=budget.hot, stripes=budget.stripes)
        elif budget.hot:
            after.update(hot=True, stripes=budget.stripes)
        AuditEvent.objects.create(
            action="budget.create" if before is None else "budget.change_limit",
            actor=actor,
            tenant=budget.tenant,
            target=f"budget {budget.pk}: {budget.scope_label} {window}",
            before=before,
            after=after,
            reason=reason,
        )
    return budget


def _self_serve_check(
    acting: TenantAdmin, lookup: dict[str, object], *, window: str, limit: Decimal
) -> None:
    """What a tenant admin may set: their people's and keys' budgets (never an operator key's),
    within the ceiling."""
    if lookup["scope"] not in SELF_SERVE_SCOPES:
        raise SelfServeDenied(
            "The organisation's own budget is set by the operators; a tenant admin sets budgets "
            "for its users, API keys, runs and tags.",
            action="budgets",
            field="tenant",
        )
    key = lookup.get("api_key")
    if isinstance(key, ApiKey) and key.tenant_id != acting.tenant.pk:
        raise SelfServeDenied(
            "That API key is not one of your organisation's keys.",
            action="budgets",
            field="api_key",
        )
    self_serve_limit_check(acting.tenant, window=window, amount=limit, action="budgets")


def budget_remove(
    budget: Budget, *, actor: str = "", reason: str = "", acting: TenantAdmin | None = None
) -> None:
    """Remove an end user's, key's, run's or tag's budget (the default for each, if any, then
    applies to it). The tenant's and the global cap are never removed: that would widen
    spending; set a new limit instead. A budget that has held calls keeps its counters for the
    ledger, so it cannot be removed either: set its limit instead."""
    if acting is not None:
        self_serve_authorize(acting, action="budgets", tenant=budget.tenant)
        actor = acting.actor
    if budget.scope not in SELF_SERVE_SCOPES:
        raise InvalidUsage(
            f"{budget.scope_label} cannot be removed: removing a cap widens spending. Set a new "
            "limit instead.",
            field="budget",
        )
    target = f"budget {budget.pk}: {budget.scope_label} {budget.window}"
    try:
        with transaction.atomic():
            AuditEvent.objects.create(
                action="budget.remove",
                actor=actor,
                tenant=budget.tenant,
                target=target,
                before={"limit": str(budget.limit)},
                reason=reason,
            )
            budget.delete()
    except ProtectedError:
        raise InvalidUsage(
            f"{budget.scope_label} has already counted calls, and the ledger keeps what it held: "
            "it cannot be removed. Set its limit instead (the default's amount, for example).",
            field="budget",
        ) from None


def budget_set_hot(budget: Budget, *, hot: bool | None, stripes: int | None = None) -> bool:
    """Mark a budget (locked by the caller) hot or not, or change how many stripes it has;
    returns whether anything changed. Every split of its counters is forgotten, so the next
    admission under it takes the exact path and splits them again for the new shape (or, not
    hot, checks their sum): allowances split for the old shape never admit on their own."""
    changes = {"hot": hot, "stripes": stripes}
    changed = [k for k, v in changes.items() if v is not None and getattr(budget, k) != v]
    if not changed:
        return False
    for name in changed:
        setattr(budget, name, changes[name])
    budget.save(update_fields=[*changed, "updated_at"])
    stripes_forget(budget)
    return True


def _scope_lookup(
    tenant: Tenant, *, api_key: str | None, run: str | None, tag: object
) -> dict[str, object]:
    """The budget lookup of an API key, run or tag scope of ``tenant``."""
    if api_key is not None:
        if api_key == ALL:
            return {"scope": Scope.API_KEY_DEFAULT, "tenant": tenant}
        return {"scope": Scope.API_KEY, "tenant": tenant, "api_key": api_key_of(tenant, api_key)}
    if run is not None:
        if run == ALL:
            return {"scope": Scope.RUN_DEFAULT, "tenant": tenant}
        return {"scope": Scope.RUN, "tenant": tenant, "run": run_ensure(tenant, run_validate(run))}
    name, value = tag_pair(tag)
    return {"scope": Scope.TAG, "tenant": tenant, "tag_key": name, "tag_value": value}


def api_key_of(tenant: Tenant, prefix: object, *, field: str = "api_key") -> ApiKey:
    """The API key with ``prefix`` that acts for ``tenant`` (its own, or an operator key), or
    ``InvalidUsage`` saying what to pass."""
    prefix = validation.identifier(field, prefix)
    key = (
        ApiKey.objects.filter(prefix=prefix)
        .filter(Q(tenant=tenant) | Q(tenant__isnull=True))
        .first()
    )
    if key is None:
        raise InvalidUsage(
            f"No API key with prefix {prefix!r} acts for tenant {tenant.external_id!r}. "
            "Pass the prefix shown when the key was created (the part before the dot).",
            field=field,
        )
    return key


def tag_pair(tag: object, *, field: str = "tag") -> tuple[str, str]:
    """A tag budget's ``(key, value)``, validated as a reservation's tags are."""
    if not isinstance(tag, tuple | list) or len(tag) != 2:
        raise InvalidUsage(
            f'{field} must be a (key, value) pair such as ("project", "alpha"), got {tag!r}.',
            field=field,
        )
    ((key, value),) = tags_validate({tag[0]: tag[1]}, field=field).items()
    if not value:
        raise InvalidUsage(f'{field} needs a value, e.g. ("{key}", "alpha").', field=field)
    return key, value


def stripes_forget(budget: Budget) -> None:
    """Forget every split of ``budget``'s counters (it changed shape): rows locked in pk order,
    as admission locks them; the next admission under it takes the exact path."""
    split = Counter.objects.filter(budget=budget, split_for__isnull=False)
    rows = list(split.select_for_update().order_by("pk").only("pk"))
    Counter.objects.filter(pk__in=[c.pk for c in rows]).update(allowance=None, split_for=None)
