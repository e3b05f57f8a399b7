"""Server time of the tenant pages for a big tenant: 10^6 ledger lines, 10^4 end users.

Usage (from the repository root)::

    python bench/pages.py [--lines 1000000] [--end-users 10000] [--days 60] [--tail 10000]
                          [--rounds 20]
                          [--database-url postgres://postgres@127.0.0.1:5432/llm_budgets_pages_bench]

The database named by ``--database-url`` is DROPPED and recreated, then migrated; its name must
contain ``bench``. One tenant gets ``--end-users`` end users and ``--lines`` committed calls (a
reservation and its ledger line each) spread over the last ``--days`` days (the current and the
previous billing month: the charts' worst case), a few users much busier than the rest, four
models; the counters admission would have kept (the month's, and one per user and day for the
each-user daily limit, each equal to its lines); 10^4 refusals. The rows are written
with SQL (writing 10^6 calls through admission would take an hour and measure admission, which
``bench/admission.py`` does); the daily rollups are then built by the real job
(``rollups.daily_usage_rebuild``); then ``--tail`` more calls in the last hour are written
after it, above the rollups' watermark: the live tail every page and the usage API read from the
ledger (``reads.live``). The counters match the ledger, tail included.

Each page (and the usage API) is requested ``--rounds`` times in-process through Django's test
client after a warm-up: the time is the server's (URL resolution, the reads, the template), with
no network. Prints the median and the 95th percentile per page, the number of queries, and the
machine's load (``uptime``): other work on the machine shows in the numbers. Results:
docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/llm_budgets_pages_bench"
TENANT = "big"
MODELS = [
    ("openai", "gpt-4o-mini"),
    ("openai", "gpt-4o"),
    ("anthropic", "claude-haiku"),
    ("anthropic", "claude-sonnet"),
]


def _recreate(url: str) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(url)
    name = info["dbname"]
    if "bench" not in name:
        sys.exit(f"refusing to drop {name!r}: the database name must contain 'bench'")
    admin = make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def _setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _load(lines: int, end_users: int, days: int, tail: int) -> None:
    from datetime import timedelta
    from decimal import Decimal

    from django.db import connection
    from django.utils import timezone

    from llm_budgets import budgets
    from llm_budgets.jobs.rollups import daily_usage_rebuild
    from llm_budgets.models import Tenant

    started = time.perf_counter()
    for provider, model in MODELS:
        budgets.set_price(
            provider=provider,
            model=model,
            input_per_mtok=Decimal("1"),
            output_per_mtok=Decimal("4"),
            effective_from=timezone.now() - timedelta(days=days + 30),
        )
    budgets.ensure_tenant(tenant=TENANT, name="Big tenant", timezone="Europe/Amsterdam")
    budgets.set_limit(tenant=TENANT, amount=Decimal(10**7), window="month")
    budgets.set_limit(tenant=TENANT, end_user="*", amount=Decimal(100), window="day")
    tenant = Tenant.objects.get(external_id=TENANT)
    now = timezone.now()
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO llm_budgets_enduser (tenant_id, external_id, created_at)"
            " SELECT %s, 'user-' || lpad(n::text, 5, '0'), %s FROM generate_series(1, %s) n",
            [tenant.pk, now, end_users],
        )
        cur.execute("SELECT min(id) FROM llm_budgets_enduser WHERE tenant_id = %s", [tenant.pk])
        first_user = cur.fetchone()[0]
        _calls(cur, tenant.pk, first_user, end_users, lines, now, days)
        cur.execute(
            "INSERT INTO llm_budgets_refusal (created_at, tenant_id, end_user_id, provider, model,"
            " kind, detail, requested, remaining, end_user_external_id, run_external_id)"
            " SELECT %s::timestamptz - n * interval '1 minute', %s, %s + (n %% %s), 'openai',"
            " 'gpt-4o', 'budget', 'end user day budget', 0.5, 0.1,"
            " 'user-' || lpad((1 + n %% %s)::text, 5, '0'), ''"
            " FROM generate_series(1, 10000) n",
            [now, tenant.pk, first_user, end_users, end_users],
        )
        cur.execute("ANALYZE")
    print(f"loaded {lines} lines in {time.perf_counter() - started:.0f}s", flush=True)
    started = time.perf_counter()
    written = daily_usage_rebuild(
        since=(now - timedelta(days=days + 1)).date(), until=(now + timedelta(days=1)).date()
    )
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    print(f"rollups: {written} rows in {time.perf_counter() - started:.0f}s", flush=True)
    _tail(tail, end_users)
    _counters()


def _calls(
    cur: Any, tenant_id: int, first_user: int, end_users: int, lines: int, now: Any, days: float
) -> None:
    """``lines`` committed calls (reservation and ledger line each) over the ``days`` before
    ``now``."""
    models_sql = ", ".join(f"('{p}', '{m}', {i})" for i, (p, m) in enumerate(MODELS))
    # A few users much busier than the rest (the square of a uniform draw); four models.
    cur.execute(
        "CREATE TEMP TABLE calls AS SELECT gen_random_uuid() AS id,"
        " %s + floor(%s * random() ^ 2)::bigint AS end_user_id,"
        " floor(random() * 4)::int AS m,"
        " %s::timestamptz - (random() * %s) * interval '1 day' AS at,"
        " (500 + random() * 20000)::int AS input_tokens,"
        " (50 + random() * 2000)::int AS output_tokens"
        " FROM generate_series(1, %s)",
        [first_user, end_users, now, days, lines],
    )
    common = "FROM calls c JOIN (VALUES " + models_sql + ") AS mm(provider, model, m) ON mm.m = c.m"
    cur.execute(
        "INSERT INTO llm_budgets_reservation (id, tenant_id, end_user_id, provider, model,"
        " input_tokens, max_output_tokens, amount, customer_amount, markup_percent, currency,"
        " state, created_at, expires_at, settled_at, pricing_basis, degraded, requested_model,"
        " tags, service_tier) SELECT c.id, %s, c.end_user_id, mm.provider, mm.model,"
        " c.input_tokens, 2000, 0.01, 0.01, 0, 'USD', 'committed', c.at,"
        " c.at + interval '2 minutes', c.at, 'price', false, '', '{}'::jsonb, '' " + common,
        [tenant_id],
    )
    cur.execute(
        "INSERT INTO llm_budgets_usagerecord (reservation_id, kind, tenant_id, end_user_id,"
        " provider, model, input_tokens, cached_input_tokens, cache_write_tokens,"
        " cache_write_1h_tokens, output_tokens, reasoning_tokens, tool_calls, tags, cost,"
        " customer_cost, currency, overage, is_estimated, reserved_at, created_at,"
        " pricing_basis, service_tier) SELECT c.id, 'charge', %s, c.end_user_id, mm.provider,"
        " mm.model,"
        " c.input_tokens, 0, 0, 0, c.output_tokens, 0, '{}'::jsonb, '{}'::jsonb,"
        " round((c.input_tokens * 1 + c.output_tokens * 4) / 1000000.0, 10),"
        " round((c.input_tokens * 1 + c.output_tokens * 4) / 1000000.0, 10), 'USD', 0, false,"
        " c.at, c.at + interval '3 seconds', 'price', '' " + common,
        [tenant_id],
    )
    cur.execute("DROP TABLE calls")


def _tail(lines: int, end_users: int) -> None:
    """The live tail: ``lines`` calls in the last hour, written after the rollups ran (above
    their watermark), which every page and the usage API read from the ledger."""
    from django.db import connection
    from django.utils import timezone

    from llm_budgets.models import Tenant

    started = time.perf_counter()
    tenant = Tenant.objects.get(external_id=TENANT)
    with connection.cursor() as cur:
        cur.execute("SELECT min(id) FROM llm_budgets_enduser WHERE tenant_id = %s", [tenant.pk])
        first_user = cur.fetchone()[0]
        _calls(cur, tenant.pk, first_user, end_users, lines, timezone.now(), 1 / 24)
        cur.execute("ANALYZE")
    print(f"live tail: {lines} lines in {time.perf_counter() - started:.0f}s", flush=True)


def _counters() -> None:
    """The counters admission would have written for these lines: the tenant's month budget
    (current and previous period) and the each-user daily budget (one per user and local day),
    each equal to the sum of its lines, as conservation demands."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from llm_budgets.models import Budget, Scope, Tenant
    from llm_budgets.windows import tenant_period

    started = time.perf_counter()
    tenant = Tenant.objects.get(external_id=TENANT)
    month = Budget.objects.get(tenant=tenant, scope=Scope.TENANT)
    each = Budget.objects.get(tenant=tenant, scope=Scope.END_USER_DEFAULT)
    current = tenant_period("month", timezone.now(), tenant)
    previous = tenant_period("month", current.start - timedelta(microseconds=1), tenant)
    with connection.cursor() as cur:
        cur.execute("DELETE FROM llm_budgets_counter")
        for period in (previous, current):
            cur.execute(
                "INSERT INTO llm_budgets_counter (budget_id, end_user_id, period_start, spent,"
                " reserved, stripe) SELECT %s, NULL, %s, coalesce(sum(cost), 0), 0, 0"
                " FROM llm_budgets_usagerecord WHERE tenant_id = %s"
                " AND reserved_at >= %s AND reserved_at < %s",
                [month.pk, period.start, tenant.pk, period.start, period.end],
            )
        cur.execute(
            "INSERT INTO llm_budgets_counter (budget_id, end_user_id, period_start, spent,"
            " reserved, stripe) SELECT %s, end_user_id,"
            " date_trunc('day', reserved_at AT TIME ZONE %s) AT TIME ZONE %s, sum(cost), 0, 0"
            " FROM llm_budgets_usagerecord WHERE tenant_id = %s GROUP BY 2, 3",
            [each.pk, tenant.timezone, tenant.timezone, tenant.pk],
        )
        cur.execute("SELECT count(*) FROM llm_budgets_counter")
        written = cur.fetchone()[0]
        cur.execute("ANALYZE llm_budgets_counter")
    print(f"counters: {written} rows in {time.perf_counter() - started:.0f}s", flush=True)


PATHS = [
    ("overview", "/usage/"),
    ("models (by day + by model)", "/usage/models/"),
    ("users (top N + page 1)", "/usage/users/"),
    ("users sorted by name, page 50", "/usage/users/?sort=name&page=50"),
    ("refusals", "/usage/refusals/"),
    (
        "API usage group_by=end_user",
        f"/api/llm-budgets/v1/tenants/{TENANT}/usage?group_by=end_user",
    ),
    ("API usage group_by=day", f"/api/llm-budgets/v1/tenants/{TENANT}/usage?group_by=day"),
]


def _measure(rounds: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from llm_budgets.control.api_keys import api_key_create
    from llm_budgets.models import Membership, MembershipRole, Tenant

    user = User.objects.create_user("bench-admin")
    Membership.objects.create(
        user=user, tenant=Tenant.objects.get(external_id=TENANT), role=MembershipRole.ADMIN
    )
    _, key = api_key_create(tenant=TENANT, name="bench")
    client = Client(SERVER_NAME="127.0.0.1", HTTP_AUTHORIZATION=f"Api-Key {key}")
    client.force_login(user)
    # As a worker of project/gunicorn.conf.py does once it has loaded the application: the
    # objects held for good are left out of full collections (gc.freeze).
    client.get(PATHS[0][1])
    gc.collect()
    gc.freeze()
    print(f"load before: {_uptime()}")
    print(f"{'page':<34} {'median ms':>10} {'p95 ms':>8} {'queries':>8}")
    for label, path in PATHS:
        client.get(path)  # warm-up
        times = []
        for _ in range(rounds):
            reset_queries()
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get(path)
                elapsed = (time.perf_counter() - started) * 1000
            assert response.status_code == 200, (path, response.status_code)
            times.append(elapsed)
        times.sort()
        p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
        print(f"{label:<34} {statistics.median(times):>10.1f} {p95:>8.1f} {len(queries):>8}")
    print(f"load after: {_uptime()}")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--end-users", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument(
        "--tail",
        type=int,
        default=10_000,
        help="Lines written since the last rollup run (read live from the ledger).",
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    parser.add_argument(
        "--reuse", action="store_true", help="Keep the loaded database; measure only."
    )
    args = parser.parse_args()
    if not args.reuse:
        _recreate(args.database_url)
    _setup_django(args.database_url)
    if not args.reuse:
        _load(args.lines, args.end_users, args.days, args.tail)
    else:
        from django.contrib.auth.models import User

        User.objects.filter(username="bench-admin").delete()
        from llm_budgets.models import ApiKey, Counter

        ApiKey.objects.filter(name="bench").delete()
        if not Counter.objects.exists():
            _counters()
    _measure(args.rounds)


if __name__ == "__main__":
    main()
