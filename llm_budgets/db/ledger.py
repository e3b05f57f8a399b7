"""The ledger's own connection (DESIGN.md invariant 8: the ledger's transactions are its own).

Money movements (admission, settlement, kill-switch trips, ledger lines, the Stripe outbox) run
on a database connection the app owns, never inside the caller's transaction: a host's
``atomic()`` block (or ``ATOMIC_REQUESTS``) that rolls back cannot erase a charge the provider
billed, and a hold never keeps counter rows locked for the length of the host's transaction.

The connection is an ordinary Django database alias, so Django opens it lazily per thread and
per async context, and closes and health-checks it with the request's connections
(``close_old_connections``, ``CONN_MAX_AGE``, ``CONN_HEALTH_CHECKS``; Celery's Django fixup
around tasks). ``LLM_BUDGETS["LEDGER_DATABASE"]`` picks it:

- ``None`` (default): the app adds :data:`LEDGER_ALIAS` to ``DATABASES`` in ``ready()``, a second
  connection to the ``default`` database with the same settings (and no ``ATOMIC_REQUESTS``;
  none on SQLite, where the ledger always joins the caller's connection);
- an alias of the host's ``DATABASES``: the same database through another route (a pooler, say);
- ``"default"``: the ledger joins the caller's transaction (the old behaviour; a host rollback
  then erases charges: a documented opt-out).

The ledger joins the caller's connection instead, whatever the setting, where a second
connection cannot serve: on SQLite (one writer: a second connection would wait for the host's
write lock; check ``llm_budgets.W051`` warns about ``ATOMIC_REQUESTS`` there), inside a test's
own transaction (Django's ``TestCase``, pytest-django's ``django_db`` without
``transaction=True``: the ledger's rows roll back with the test), and in a test that does not
allow the ledger's alias (docs/testing.md).

:func:`ledger_connection` makes the ledger's connection stand in for ``default`` in this thread
for the block, so the services' ORM and SQL run on it unchanged; what they register with
``transaction.on_commit`` runs when the *ledger* commits, with the caller's connection back.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from llm_budgets.conf import SettingError, conf

P = ParamSpec("P")
T = TypeVar("T")

LEDGER_ALIAS = "llm_budgets_ledger"
# What makes two settings dicts the same database through the same route.
_ROUTE = ("ENGINE", "NAME", "HOST", "PORT", "USER")


def ledger_database_install() -> None:
    """Add :data:`LEDGER_ALIAS` to ``DATABASES`` (``AppConfig.ready``) unless the host named its
    own alias in ``LEDGER_DATABASE`` (or an unusable value: check ``llm_budgets.E051`` says so)."""
    try:
        if conf.LEDGER_DATABASE is not None:
            return
    except SettingError:
        return
    databases = settings.DATABASES
    if DEFAULT_DB_ALIAS not in databases or LEDGER_ALIAS in databases:
        return
    if "sqlite" in str(databases[DEFAULT_DB_ALIAS].get("ENGINE", "")):
        # One writer: the ledger joins the caller's connection there, so no alias is added
        # (Django 6.1's checks would otherwise open it, e.g. in a host's TestCase).
        return
    entry = _following(databases[DEFAULT_DB_ALIAS])
    databases[LEDGER_ALIAS] = entry
    configured = connections.settings  # the same dict once Django has filled in its defaults
    if configured is not databases:
        configured.setdefault(LEDGER_ALIAS, entry)


def _following(default: dict[str, Any]) -> dict[str, Any]:
    """The ledger alias's settings: the default database's, without wrapping requests in a
    transaction on it, and in tests the mirror of the default test database."""
    entry = {key: copy.deepcopy(value) for key, value in default.items() if key != "TEST"}
    entry["ATOMIC_REQUESTS"] = False
    entry["TEST"] = {
        "CHARSET": None,
        "COLLATION": None,
        "MIGRATE": True,
        "MIRROR": DEFAULT_DB_ALIAS,
        "NAME": None,
    }
    return entry


def ledger_alias() -> str:
    """The alias the ledger writes on where it has a connection of its own."""
    return conf.LEDGER_DATABASE or LEDGER_ALIAS


def _own_connection() -> BaseDatabaseWrapper | None:
    """The ledger's connection in this thread, or None where the ledger joins the caller's (see
    the module's docstring) or already stands in for it."""
    alias = ledger_alias()
    if alias == DEFAULT_DB_ALIAS:
        return None
    default = connections[DEFAULT_DB_ALIAS]
    if default.alias != DEFAULT_DB_ALIAS or default.vendor == "sqlite":
        return None  # already the ledger's (a nested service), or one writer only
    if any(getattr(block, "_from_testcase", False) for block in default.atomic_blocks):
        return None  # a test's own transaction: the ledger's rows roll back with the test
    ledger = connections[alias]
    if alias == LEDGER_ALIAS:
        _follow(ledger, default)
    if ledger.connection is None and _forbidden(ledger):
        return None  # a test that does not allow the alias
    if ledger.errors_occurred and not ledger.in_atomic_block:
        # After an error (an outage, a cut), as Django does at a request's end: keep it if it
        # still answers, else close it so this call reconnects. A process without requests (a
        # worker's loop, a command) heals on its own.
        ledger.close_if_unusable_or_obsolete()
    return ledger


def _forbidden(ledger: BaseDatabaseWrapper) -> bool:
    """Whether Django's test case forbids this alias (``databases`` does not list it): it then
    refuses to connect, in this thread or any other, with ``DatabaseOperationForbidden``."""
    try:
        ledger.ensure_connection()
    except AssertionError as exc:
        if type(exc).__name__ == "DatabaseOperationForbidden":
            return True
        raise
    return False


def _follow(ledger: BaseDatabaseWrapper, default: BaseDatabaseWrapper) -> None:
    """Keep the app's own alias on the default database's route when that changes after start-up
    (a test database, a pooler put in between): its settings were copied in ``ready()``."""
    theirs = default.settings_dict
    if all(ledger.settings_dict.get(key) == theirs.get(key) for key in _ROUTE):
        return
    ledger.close()
    ledger.settings_dict = _following(theirs)
    connections.settings[LEDGER_ALIAS] = ledger.settings_dict


def ledger_db() -> BaseDatabaseWrapper:
    """The connection a ledger write would run on now, in this thread: its own, or the
    caller's where it joins it (for tests and diagnostics)."""
    own = _own_connection()
    return connections[DEFAULT_DB_ALIAS] if own is None else own


def ledger_joins_caller() -> bool:
    """Whether a ledger write now runs in the caller's transaction (SQLite, a test's own
    transaction, ``LEDGER_DATABASE = "default"``) rather than on the ledger's connection."""
    default = connections[DEFAULT_DB_ALIAS]
    return default.alias == DEFAULT_DB_ALIAS and _own_connection() is None


@contextmanager
def ledger_connection() -> Iterator[None]:
    """For the block, in this thread (or async context), the ledger's connection stands in for
    ``default``: the ORM, ``connection`` and ``transaction.atomic()`` use it. Nested blocks and the
    cases where the ledger joins the caller's connection change nothing."""
    ledger = _own_connection()
    if ledger is None:
        yield
        return
    caller = connections[DEFAULT_DB_ALIAS]
    _hooks_with_caller(ledger, caller)
    connections[DEFAULT_DB_ALIAS] = ledger
    try:
        yield
    finally:
        connections[DEFAULT_DB_ALIAS] = caller


def on_ledger(function: Callable[P, T]) -> Callable[P, T]:
    """Run ``function`` wholly on the ledger's connection (:func:`ledger_connection`): a service
    whose every write is the ledger's, such as processing a Stripe event that credits a balance,
    so it never locks rows in the caller's transaction that its ledger writes then wait for."""

    @functools.wraps(function)
    def on_its_connection(*args: P.args, **kwargs: P.kwargs) -> T:
        with ledger_connection():
            return function(*args, **kwargs)

    return on_its_connection


def _hooks_with_caller(ledger: BaseDatabaseWrapper, caller: BaseDatabaseWrapper) -> None:
    """What the block registers with ``transaction.on_commit`` runs when the ledger commits; a
    receiver (a host's signal handler, a task enqueued in eager mode) then finds the caller's
    connection as ``default`` again, not the ledger's."""
    run: Callable[[], None] = type(ledger).run_and_clear_commit_hooks.__get__(ledger)

    def run_with_caller() -> None:
        standing = connections[DEFAULT_DB_ALIAS]
        connections[DEFAULT_DB_ALIAS] = caller
        try:
            run()
        finally:
            connections[DEFAULT_DB_ALIAS] = standing

    ledger.run_and_clear_commit_hooks = run_with_caller  # type: ignore[method-assign]


class PendingConfiguration:
    """Configuration (tenants, plans, budgets, raises, prices) the caller's open transaction
    wrote: the ledger's connection cannot see it until that transaction commits, and may wait
    on its row locks. Registered with ``on_commit`` on the caller's connection by the first such
    write, so it lives exactly as long as that transaction (Django drops it on rollback)."""

    def __init__(self) -> None:
        self.tenant_ids: set[int] = set()
        self.everything = False  # a plan, a global budget, a price: any tenant may be affected

    def covers(self, tenant_id: int | None) -> bool:
        return self.everything or tenant_id in self.tenant_ids

    def __call__(self) -> None:
        """Nothing to do at commit: the ledger then sees it all."""


def configuration_written(tenant_id: int | None) -> None:
    """Note a configuration write in the caller's transaction (``tenant_id`` None: it may
    affect any tenant). Nothing where no transaction is open, where the ledger joins the
    caller's, or inside the ledger's own block."""
    default = connections[DEFAULT_DB_ALIAS]
    if default.alias != DEFAULT_DB_ALIAS or not default.in_atomic_block:
        return
    if _own_connection() is None:
        return
    pending = configuration_pending()
    if pending is None:
        pending = PendingConfiguration()
        default.on_commit(pending)
    if tenant_id is None:
        pending.everything = True
    else:
        pending.tenant_ids.add(tenant_id)


def configuration_pending() -> PendingConfiguration | None:
    """What the caller's open transaction wrote of the configuration, if anything."""
    default = connections[DEFAULT_DB_ALIAS]
    if default.alias != DEFAULT_DB_ALIAS or not default.in_atomic_block:
        return None
    for entry in default.run_on_commit:
        if isinstance(entry[1], PendingConfiguration):
            return entry[1]
    return None


# The configuration models, each with the attribute that names the tenant a write affects
# (None: any tenant).
CONFIGURATION_MODELS = {
    "Plan": None,
    "Tenant": "pk",
    "EndUser": "tenant_id",
    "Budget": "tenant_id",
    "BudgetRaise": None,
    "Price": None,
    "ModelAlias": None,
}


def configuration_watch() -> None:
    """Connect the receivers that note configuration writes in the caller's transaction
    (``AppConfig.ready``): ORM saves and deletes, through the services or not."""
    from django.apps import apps
    from django.db.models.signals import post_delete, post_save

    for name, attribute in CONFIGURATION_MODELS.items():
        receiver = _noting(attribute)
        model = apps.get_model("llm_budgets", name)
        for signal in (post_save, post_delete):
            signal.connect(
                receiver, sender=model, weak=False, dispatch_uid=f"llm_budgets.pending.{name}"
            )


def _noting(attribute: str | None) -> Callable[..., None]:
    def noted(sender: type[Any], instance: Any, **kwargs: Any) -> None:
        configuration_written(None if attribute is None else getattr(instance, attribute))

    return noted
