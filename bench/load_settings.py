"""Settings of the gunicorn workers bench/load.py starts: the project's, without the per-key
throttle (the clients are the load, not abuse) and without DEBUG, keeping database connections
as docs/operations.md tells hosts to (a new PostgreSQL connection per request costs more than
the request: 21.6 ms of REST overhead with CONN_MAX_AGE 0, 6.5 ms with 60, before issue 15's
trims)."""

from project.settings import *  # noqa: F403

DEBUG = False
LLM_BUDGETS = {**LLM_BUDGETS, "API_THROTTLE_RATE": None}  # noqa: F405
DATABASES["default"]["CONN_MAX_AGE"] = 60  # noqa: F405
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # noqa: F405
